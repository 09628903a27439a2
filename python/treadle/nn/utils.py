"""tl.nn.utils: torch.nn.utils' gradient clipping, taking the model's parameters as torch does.

``clip_grad_norm_(model.parameters(), max_norm)`` clips the gradients *of* those parameters (views
into the model's flat gradient buffer), exactly as torch. The trainer's own clipping
(``Trainer(clip_grad_norm=...)``) does the same inside the step without leaving C++; these are for
loops that compute gradients with ``trainer.compute_gradients`` and update with ``optimizer.step()``.
"""
import math

import numpy as np

from .parameter import _as_parameter
from .state import _compiled_roots

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _gradients(parameters, what):
    """The gradient view of each parameter view (what model.parameters() yields), in order."""
    params = [parameters] if isinstance(parameters, np.ndarray) else list(parameters)
    grads = []
    for i, view in enumerate(params):
        p = _as_parameter(view)
        if p is None:
            raise TypeError(f"{what}: item {i} is not a model parameter (pass model.parameters(); to clip a "
                            "gradient buffer directly use tl.optim.clip_grad_norm_ / clip_grad_value_)")
        grads.append(_gradient_of(p, what))
    return grads


def _gradient_of(p, what):
    for root in list(_compiled_roots):
        model = root.__dict__.get("_model")
        if model is not None and p.packed and model.id == p.owner_id:
            name = next(n for n, q in root._unique_objects() if q is p)
            return model.gradient(name)
    raise ValueError(f"{what}: the parameter is not in a compiled model yet (its gradients exist once the "
                     "model is used by a Trainer)")


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scales the parameters' gradients in place so their joint norm is at most max_norm (torch's
    coefficient max_norm / (norm + 1e-6), capped at 1); returns the norm before clipping."""
    grads = _gradients(parameters, "clip_grad_norm_")
    norm_type = float(norm_type)
    if not grads:
        return 0.0
    if math.isinf(norm_type):
        total = max(float(np.abs(g).max()) if g.size else 0.0 for g in grads)
    else:
        total = float(np.sum([np.sum(np.abs(g.astype(np.float64)) ** norm_type) for g in grads]) ** (1.0 / norm_type))
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is non-finite")
    coef = min(float(max_norm) / (total + 1e-6), 1.0)
    for g in grads:
        g *= coef
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamps every gradient of the parameters to [-clip_value, clip_value] in place."""
    value = float(clip_value)
    for g in _gradients(parameters, "clip_grad_value_"):
        np.clip(g, -value, value, out=g)
