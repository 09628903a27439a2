"""torch.nn.functional's losses over symbols, with torch's arguments: reduction "none", "mean" or
"sum" (and "batchmean" for kl_div), the legacy size_average / reduce flags, weights.

The plain cases call the fused loss ops (mse_loss, l1_loss, huber_loss, bce_with_logits: one kernel
forward and one backward); the options those ops do not have are written with elementwise ops, which
also makes every form differentiable twice. Each is checked against torch in tests/test_torch_losses.py.
"""
import warnings

from . import _core as _c

_F = _c.functional
_REDUCTIONS = ("none", "mean", "sum")


def legacy_reduction(size_average, reduce, reduction, where):
    """torch's mapping of the deprecated size_average / reduce flags onto `reduction` (with its warning)."""
    if size_average is None and reduce is None:
        return reduction
    warnings.warn(f"{where}: size_average and reduce are deprecated; use reduction= (as torch warns)", UserWarning,
                  stacklevel=3)
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


def _check_reduction(where, reduction, allowed=_REDUCTIONS):
    if reduction not in allowed:
        raise ValueError(f"{where}: reduction must be one of {', '.join(map(repr, allowed))}, got {reduction!r}")


def _reduce(v, reduction):
    if reduction == "none":
        return v
    return v.mean() if reduction == "mean" else v.sum()


def _weighted(v, weight):
    return v if weight is None else v * weight


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = legacy_reduction(size_average, reduce, reduction, "mse_loss")
    _check_reduction("mse_loss", reduction)
    if reduction != "none" and weight is None:
        return _F.mse_loss(input, target, reduction=reduction)
    return _reduce(_weighted((input - target) ** 2, weight), reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = legacy_reduction(size_average, reduce, reduction, "l1_loss")
    _check_reduction("l1_loss", reduction)
    if reduction != "none" and weight is None:
        return _F.l1_loss(input, target, reduction=reduction)
    return _reduce(_weighted(_F.abs(input - target), weight), reduction)


def _huber_pointwise(d, delta):
    """0.5 d^2 inside |d| < delta, delta (|d| - delta / 2) outside, as 0.5 c^2 + delta (|d| - c) with
    c = min(|d|, delta): one expression, no branch."""
    a = _F.abs(d)
    c = _F.clamp(a, max=delta)
    return 0.5 * c ** 2 + delta * (a - c)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    _check_reduction("huber_loss", reduction)
    if delta <= 0:
        raise ValueError(f"huber_loss: delta must be positive, got {delta}")
    if reduction != "none" and weight is None:
        return _F.huber_loss(input, target, delta=float(delta), reduction=reduction)
    return _reduce(_weighted(_huber_pointwise(input - target, float(delta)), weight), reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """torch's smooth L1: huber_loss(delta=beta) / beta, and L1 for beta = 0."""
    reduction = legacy_reduction(size_average, reduce, reduction, "smooth_l1_loss")
    _check_reduction("smooth_l1_loss", reduction)
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    if beta == 0:
        return l1_loss(input, target, reduction=reduction)
    return huber_loss(input, target, reduction=reduction, delta=beta) * (1.0 / beta)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """BCE on probabilities; as torch, each log is clamped at -100 so p = 0 or 1 gives a finite loss."""
    reduction = legacy_reduction(size_average, reduce, reduction, "binary_cross_entropy")
    _check_reduction("binary_cross_entropy", reduction)
    weight = _as_weight(input, weight)
    log_p = _F.clamp(_F.log(input), min=-100.0)
    log_q = _F.clamp(_F.log(1 - input), min=-100.0)
    return _reduce(_weighted(-(target * log_p + (1 - target) * log_q), weight), reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    """(1 - t) x + (1 + (pos_weight - 1) t) softplus(-x), times weight (torch's stable form)."""
    reduction = legacy_reduction(size_average, reduce, reduction, "binary_cross_entropy_with_logits")
    _check_reduction("binary_cross_entropy_with_logits", reduction)
    if reduction != "none" and weight is None and pos_weight is None:
        return _F.binary_cross_entropy_with_logits(input, target, reduction=reduction)
    weight, pos_weight = _as_weight(input, weight), _as_weight(input, pos_weight)
    # threshold 50: softplus(z) = z there, exact to e^-50 relative, where the default 20 is exact to 2e-9
    tail = _F.softplus(-input, threshold=50.0)
    scale = 1 if pos_weight is None else 1 + (pos_weight - 1) * target
    return _reduce(_weighted((1 - target) * input + scale * tail, weight), reduction)


_TINY = {"float64": 1e-300, "float32": 1e-37, "bfloat16": 1e-37, "float16": 6.2e-5}


def _xlogy(x, y):
    """x log y with 0 where x = 0 (torch.xlogy) for y = x >= 0: the log's argument is kept positive."""
    return x * _F.log(_F.clamp(y, min=_TINY.get(y.dtype, 1e-37)))


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """KL(target || exp(input)) pointwise: target (log target - input), input being log-probabilities.
    reduction "batchmean" divides the sum by the batch size (the mathematically right one); "mean"
    averages over every element, as torch does."""
    reduction = legacy_reduction(size_average, reduce, reduction, "kl_div")
    _check_reduction("kl_div", reduction, _REDUCTIONS + ("batchmean",))
    if log_target:
        pointwise = _F.exp(target) * (target - input)
    else:
        pointwise = _xlogy(target, target) - target * input
    if reduction == "batchmean":
        return pointwise.sum() * (1.0 / (input.shape[0] if input.ndim > 0 else 1))
    return _reduce(pointwise, reduction)


def constant_like(like, values):
    """A constant symbol holding `values` (a number or an array) in like's dtype: a number stays a
    Python float; an array becomes one 0-d constant per element, joined (meant for per-class or
    per-feature weights, at most 4096 elements)."""
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    flat = arr.reshape(-1)
    if arr.ndim == 0:
        return float(flat[0])
    if flat.size > 4096:
        raise ValueError(f"loss weights of {flat.size} elements: at most 4096 are supported")
    parts = [_F.reshape(_F._scalar_like(like, float(v)), [1]) for v in flat]
    joined = parts[0] if len(parts) == 1 else _F.cat(parts, dim=0)
    return _F.reshape(joined, list(arr.shape))


def _as_weight(like, weight):
    if weight is None or isinstance(weight, (int, float, _c.Symbol)):
        return weight
    return constant_like(like, weight)


def _class_weights(weight, safe_target):
    """weight[target] for every target element (weight: a 1-D symbol over the classes)."""
    flat = _F.reshape(safe_target, [-1])
    return _F.reshape(_F.gather(weight, 0, flat), list(safe_target.shape))


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """Negative log-likelihood of class indices: input (N, C) or (N, C, d...) log-probabilities, or
    (C,) with a 0-d target. Targets equal to ignore_index contribute nothing (and are not counted
    by "mean", which divides by the summed weights of the counted targets, as torch)."""
    reduction = legacy_reduction(size_average, reduce, reduction, "nll_loss")
    _check_reduction("nll_loss", reduction)
    if input.ndim == 1:  # unbatched: (C,) and a 0-d target
        input, target = _F.unsqueeze(input, 0), _F.reshape(target, [1])
        out = nll_loss(input, target, weight, ignore_index=ignore_index, reduction=reduction)
        return _F.reshape(out, []) if reduction == "none" else out
    valid = _F.ne(target, ignore_index)
    safe = _F.where(valid, target, 0)  # an ignored label would be out of range for gather
    picked = _F.squeeze(_F.gather(input, 1, _F.unsqueeze(safe, 1)), 1)
    counted = _F.where(valid, _F.ones_like(picked), _F.zeros_like(picked))
    weight = _as_weight(input, weight)
    if weight is not None:
        counted = counted * _class_weights(weight, safe)
    per = -picked * counted
    if reduction == "mean":
        return per.sum() / counted.sum()
    return _reduce(per, reduction)


def _class_axis_shape(weight, input):
    """weight (C,) reshaped to broadcast along input's class dim (1 for batched input, 0 unbatched)."""
    shape = [1] * input.ndim
    shape[1 if input.ndim > 1 else 0] = -1
    return _F.reshape(weight, shape)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """torch.nn.functional.cross_entropy: logits against class indices (int64) or class
    probabilities (a floating target of the input's shape), with weight, ignore_index,
    label_smoothing and every reduction. The plain case is the fused cross_entropy op."""
    reduction = legacy_reduction(size_average, reduce, reduction, "cross_entropy")
    _check_reduction("cross_entropy", reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    probabilities = target.dtype not in ("int64", "int32")
    plain = weight is None and ignore_index < 0 and label_smoothing == 0.0 and reduction != "none"
    if plain and not probabilities:
        return _F.cross_entropy(input, target, reduction=reduction)
    class_dim = 1 if input.ndim > 1 else 0
    n_classes = input.shape[class_dim]
    logp = _F.log_softmax(input, class_dim)
    weight = _as_weight(input, weight)
    if probabilities:
        if label_smoothing > 0:
            target = target * (1 - label_smoothing) + label_smoothing / n_classes
        terms = logp * target if weight is None else logp * target * _class_axis_shape(weight, input)
        return _reduce(-_F.sum(terms, class_dim), reduction)
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if label_smoothing == 0.0:
        return nll
    # torch's smoothing term: -sum_c w_c log p_c per element, zero where the target is ignored,
    # averaged like the nll term (by the summed weights of the counted targets).
    terms = logp if weight is None else logp * _class_axis_shape(weight, input)
    smooth = -_F.sum(terms, class_dim)
    valid = _F.ne(target, ignore_index)
    counted = _F.where(valid, _F.ones_like(smooth), _F.zeros_like(smooth))
    smooth = smooth * counted
    if reduction == "mean":
        norm = counted if weight is None else counted * _class_weights(weight, _F.where(valid, target, 0))
        smooth = smooth.sum() / norm.sum()
    else:
        smooth = _reduce(smooth, reduction)
    return (1 - label_smoothing) * nll + smooth * (label_smoothing / n_classes)


__all__ = ["nll_loss", "cross_entropy", "mse_loss", "l1_loss", "huber_loss", "smooth_l1_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "kl_div"]
