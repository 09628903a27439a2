"""torch.nn's loss classes by their torch names and with their constructor arguments, in torch's order:
MSELoss, L1Loss, HuberLoss, SmoothL1Loss, CrossEntropyLoss, NLLLoss, BCEWithLogitsLoss, BCELoss,
KLDivLoss.

A loss whose options the fused loss ops have (reduction "mean" or "sum", no weights) is that op; any
other is the corresponding tl.functional function traced as a custom loss, so it trains the same way.
CrossEntropyLoss is always the function (a target of class indices or of probabilities is known only
when the plan is traced); for indices without options the function records the fused op.
Every one can also be evaluated on arrays, `criterion(prediction, target)`, as in torch. A loss with
reduction="none" gives one value per element: evaluate it on arrays, or reduce it inside a loss
function to train with it (a trainer needs a scalar).
"""
import numpy as np

from .. import functional_losses as _fl
from ..loss_base import BCEWithLogits, Custom, Huber, L1, MSE
from .module import Module

__all__ = ["MSELoss", "L1Loss", "HuberLoss", "SmoothL1Loss", "CrossEntropyLoss", "NLLLoss", "BCEWithLogitsLoss",
           "BCELoss", "KLDivLoss"]


def _evaluate(fn, pred, target):
    """fn(prediction, target) on arrays: traced once into a parameterless model and run."""
    class _Evaluate(Module):
        def forward(self, p, t):
            return fn(p, t)

    arrays = tuple(np.asarray(a, order="C") for a in (pred, target))
    unbatched = any(a.ndim == 0 for a in arrays)  # e.g. (C,) logits and a 0-d label
    if unbatched:  # a model takes batches: evaluate as a batch of one (the same value)
        arrays = tuple(a[None] for a in arrays)
    module = _Evaluate()
    if arrays[0].dtype == np.float64:
        module = module.double()  # a model computes in its dtype (float32 by default)
    out = module.predict(arrays)
    return out[0] if unbatched and out.ndim > 0 else out


class _FunctionalLoss(Custom):
    """A torch-named loss in its composed form: a custom loss calling a tl.functional loss function."""

    __slots__ = ("options", "_torch_name")

    def __init__(self, torch_name, function, **options):
        self.options = options
        self._torch_name = torch_name
        super().__init__(lambda out, y: function(out, y, **options), name=f"{torch_name}({_describe(options)})")

    @property
    def reduction(self):
        return self.options.get("reduction", "mean")

    def __call__(self, pred, target, backend=""):
        return _evaluate(self.fn, pred, target)

    def __repr__(self):
        return f"{self._torch_name}({_describe(self.options)})"


def _describe(options):
    return ", ".join(f"{k}={v!r}" for k, v in options.items() if v is not None)


def _no_extras(**options):
    return all(v is None for v in options.values())


def MSELoss(size_average=None, reduce=None, reduction="mean"):  # noqa: N802 (torch's class name)
    """torch.nn.MSELoss: reduce((input - target) ** 2)."""
    reduction = _fl.legacy_reduction(size_average, reduce, reduction, "MSELoss")
    if reduction in ("mean", "sum"):
        return MSE(reduction)
    return _FunctionalLoss("MSELoss", _fl.mse_loss, reduction=reduction)


def L1Loss(size_average=None, reduce=None, reduction="mean"):  # noqa: N802
    """torch.nn.L1Loss: reduce(|input - target|)."""
    reduction = _fl.legacy_reduction(size_average, reduce, reduction, "L1Loss")
    if reduction in ("mean", "sum"):
        return L1(reduction)
    return _FunctionalLoss("L1Loss", _fl.l1_loss, reduction=reduction)


def HuberLoss(reduction="mean", delta=1.0):  # noqa: N802 (torch's argument order: reduction first)
    """torch.nn.HuberLoss(reduction, delta)."""
    if reduction in ("mean", "sum"):
        return Huber(delta, reduction)
    return _FunctionalLoss("HuberLoss", _fl.huber_loss, reduction=reduction, delta=float(delta))


def SmoothL1Loss(size_average=None, reduce=None, reduction="mean", beta=1.0):  # noqa: N802
    """torch.nn.SmoothL1Loss: huber(delta=beta) / beta; L1 for beta = 0."""
    reduction = _fl.legacy_reduction(size_average, reduce, reduction, "SmoothL1Loss")
    if beta == 1.0 and reduction in ("mean", "sum"):
        return Huber(1.0, reduction)  # the same function at beta = 1
    return _FunctionalLoss("SmoothL1Loss", _fl.smooth_l1_loss, reduction=reduction, beta=float(beta))


def CrossEntropyLoss(weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",  # noqa: N802
                     label_smoothing=0.0):
    """torch.nn.CrossEntropyLoss: logits against int64 class indices or class probabilities."""
    reduction = _fl.legacy_reduction(size_average, reduce, reduction, "CrossEntropyLoss")
    # Always the function: whether the target holds class indices or probabilities is known only
    # when the plan is traced. For indices without options it records the fused cross_entropy op.
    return _FunctionalLoss("CrossEntropyLoss", _fl.cross_entropy, weight=weight, ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=float(label_smoothing))


def NLLLoss(weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):  # noqa: N802
    """torch.nn.NLLLoss: log-probabilities (N, C) or (N, C, d...) against int64 class indices."""
    reduction = _fl.legacy_reduction(size_average, reduce, reduction, "NLLLoss")
    return _FunctionalLoss("NLLLoss", _fl.nll_loss, weight=weight, ignore_index=ignore_index, reduction=reduction)


def BCEWithLogitsLoss(weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):  # noqa: N802
    """torch.nn.BCEWithLogitsLoss; weight and pos_weight are numbers or arrays broadcasting against the input."""
    reduction = _fl.legacy_reduction(size_average, reduce, reduction, "BCEWithLogitsLoss")
    if reduction in ("mean", "sum") and _no_extras(weight=weight, pos_weight=pos_weight):
        return BCEWithLogits(reduction)
    return _FunctionalLoss("BCEWithLogitsLoss", _fl.binary_cross_entropy_with_logits,
                           weight=weight, reduction=reduction, pos_weight=pos_weight)


def BCELoss(weight=None, size_average=None, reduce=None, reduction="mean"):  # noqa: N802
    """torch.nn.BCELoss on probabilities (each log clamped at -100, as torch)."""
    reduction = _fl.legacy_reduction(size_average, reduce, reduction, "BCELoss")
    return _FunctionalLoss("BCELoss", _fl.binary_cross_entropy, weight=weight,
                           reduction=reduction)


def KLDivLoss(size_average=None, reduce=None, reduction="mean", log_target=False):  # noqa: N802
    """torch.nn.KLDivLoss: input log-probabilities, target probabilities (log-probabilities with log_target)."""
    reduction = _fl.legacy_reduction(size_average, reduce, reduction, "KLDivLoss")
    return _FunctionalLoss("KLDivLoss", _fl.kl_div, reduction=reduction, log_target=bool(log_target))
