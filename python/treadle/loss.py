"""Losses: descriptions the trainer compiles into the training plan.

Each class holds `_native`, the C++ `treadle._core.Loss`; the trainer takes that and records the
loss op on (prediction, target). Semantics follow torch.nn.functional: `reduction` is "mean" or
"sum" and the value is a 0-d scalar of the prediction's dtype.

    loss = tl.loss.CrossEntropy()          # logits (N, C) or (N, C, d...), int64 labels (N) or (N, d...)
    loss = tl.loss.Huber(delta=0.5, reduction="sum")

A custom loss is a function of the model's output (a tuple of them for a model with several) and
the target, written with tl.functional ops and symbol methods; it is traced into the training plan
once per input signature and differentiated with the step:

    def vae_loss(outputs, x):
        recon, mu, logvar = outputs
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum()
        return ((recon - x) ** 2).sum() + kl
    trainer = tl.Trainer(vae, vae_loss, tl.optim.Adam(lr=1e-3))   # or tl.loss.Custom(vae_loss)

A function with a third parameter also gets the model's input, so it can differentiate the output
with respect to it (a physics-informed residual; see tl.functional.grad):

    def heat_loss(u, target, xt):
        (du,) = F.grad(u, xt, F.ones_like(u))
        (d2u,) = F.grad(du[:, 0:1], xt, F.ones_like(u))
        return ((du[:, 1:2] - nu * d2u[:, 0:1]) ** 2).mean()
"""
from .loss_base import BCEWithLogits, CrossEntropy, Custom, Huber, L1, Loss, MSE, _takes_three_arguments  # noqa: F401
# torch's loss classes by their names and arguments (nn/losses.py).
from .nn.losses import *  # noqa: F401,F403
from .nn.losses import __all__ as _torch_names

__all__ = ["Loss", "MSE", "L1", "Huber", "CrossEntropy", "BCEWithLogits", "Custom"] + _torch_names
