"""torch.nn.functional functions that are exact compositions of treadle's ops: the remaining
activations (relu6, hardtanh, hardsigmoid, hardswish, logsigmoid, mish, selu, celu, softsign,
tanhshrink), normalize, and constant padding. Each is compared with torch (values and gradients)
in tests/test_functional_extra.py; being compositions, they differentiate as often as their parts.
"""
import math
import numbers

from . import _core as _c
from .trace_state import _dtype_name, _tracing

_F = _c.functional

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def relu6(input, inplace=False):
    return _F.clamp(input, min=0.0, max=6.0)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")
    return _F.clamp(input, min=float(min_val), max=float(max_val))


def hardsigmoid(input, inplace=False):
    return _F.clamp(input * (1.0 / 6.0) + 0.5, min=0.0, max=1.0)


def hardswish(input, inplace=False):
    return input * hardsigmoid(input)


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x), stable for large |x|."""
    return -_F.softplus(-input, threshold=50.0)


def mish(input, inplace=False):
    return input * _F.tanh(_F.softplus(input))


def selu(input, inplace=False):
    return _SELU_SCALE * _F.elu(input, alpha=_SELU_ALPHA)


def celu(input, alpha=1.0, inplace=False):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1)) = alpha * elu(x / alpha)."""
    if alpha == 0:
        raise ValueError("celu: alpha must be nonzero")
    return alpha * _F.elu(input * (1.0 / alpha), alpha=1.0)


def softsign(input):
    return input / (1 + _F.abs(input))


def tanhshrink(input):
    return input - _F.tanh(input)


def normalize(input, p=2.0, dim=1, eps=1e-12):
    """input / max(||input||_p along dim, eps), as torch.nn.functional.normalize."""
    if p <= 0:
        raise ValueError(f"normalize: p must be positive, got {p}")
    if p == 2:
        norm = _F.sqrt(_F.sum(input * input, dim, keepdim=True))
    elif p == 1:
        norm = _F.sum(_F.abs(input), dim, keepdim=True)
    else:
        norm = _F.pow(_F.sum(_F.pow(_F.abs(input), float(p)), dim, keepdim=True), 1.0 / p)
    return input / _F.clamp(norm, min=float(eps))


def pad(input, pad, mode="constant", value=None):
    """torch's pad tuple (last dim first: (left, right, top, bottom, ...)). Constant mode joins
    constant blocks along each padded dim (negative pads crop); reflect, replicate and circular join
    slices of the input itself, so gradients flow back into the elements they copy."""
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    if mode != "constant" and value not in (None, 0, 0.0):
        raise ValueError(f"pad: value is for mode 'constant', got value={value} with mode {mode!r}")
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ValueError(f"pad: {pad} must have an even length of at most 2 * {input.ndim} (the input's dims)")
    if mode != "constant":
        return _pad_from_input(input, pad, mode)
    fill = 0.0 if value is None else float(value)
    x = input
    for k in range(len(pad) // 2):
        dim = input.ndim - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        if before < 0:
            x, before = _F.slice(x, dim, -before, x.shape[dim]), 0
        if after < 0:
            x, after = _F.slice(x, dim, 0, x.shape[dim] + after), 0
        parts = ([_constant_block(x, dim, before, fill)] if before else []) + [x] + \
                ([_constant_block(x, dim, after, fill)] if after else [])
        if len(parts) > 1:
            x = _F.cat(parts, dim=dim)
    return x


def _pad_from_input(x, pad, mode):
    """reflect / replicate / circular padding as slices of x joined along each padded dim."""
    for k in range(len(pad) // 2):
        dim, (before, after) = x.ndim - 1 - k, pad[2 * k:2 * k + 2]
        n = x.shape[dim]
        limit = n - 1 if mode == "reflect" else n
        if before < 0 or after < 0 or (mode != "replicate" and max(before, after) > limit):
            raise ValueError(f"pad: {mode} padding of ({before}, {after}) along dim {dim} of size {n} needs pads "
                             f"in [0, {limit}]" if mode != "replicate" else f"pad: {mode} pads must be >= 0")
        if mode == "replicate" and n == 0:
            raise ValueError("pad: cannot replicate an empty dimension")

        def one(i):
            return _F.slice(x, dim, i, i + 1)

        if mode == "reflect":  # mirror without repeating the edge: x[before], ..., x[1] | x | x[n-2], ...
            head = [one(i) for i in range(before, 0, -1)]
            tail = [one(n - 2 - i) for i in range(after)]
        elif mode == "replicate":
            head, tail = [one(0)] * before, [one(n - 1)] * after
        else:  # circular: wraps around
            head = [_F.slice(x, dim, n - before, n)] if before else []
            tail = [_F.slice(x, dim, 0, after)] if after else []
        if head or tail:
            x = _F.cat(head + [x] + tail, dim=dim)
    return x


def _constant_block(x, dim, width, fill):
    """`fill` in x's dtype, of x's shape but `width` along dim. Its shape comes from slices of x; the
    constant does not depend on x's values (no gradient flows into it)."""
    size = x.shape[dim]
    if size == 0:
        raise ValueError("pad: cannot pad along an empty dimension")
    reps, rest = divmod(width, size)
    parts = [x] * reps + ([_F.slice(x, dim, 0, rest)] if rest else [])
    like = parts[0] if len(parts) == 1 else _F.cat(parts, dim=dim)
    return _F.full_like(like, fill)


__all__ = ["relu6", "hardtanh", "hardsigmoid", "hardswish", "logsigmoid", "mish", "selu", "celu", "softsign",
           "tanhshrink", "normalize", "pad", "interpolate", "one_hot"]


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,  # noqa: A002
                recompute_scale_factor=None, antialias=False):
    """torch.nn.functional.interpolate: modes 'nearest' and 'nearest-exact' (3-, 4-, 5-D), 'linear'
    (3-D), 'bilinear' and 'bicubic' (4-D), 'trilinear' (5-D) and 'area' (adaptive average pooling to
    the output size). 4-D input is the native resampling op itself; the other ranks run it along one
    pair of axes at a time with the remaining axis resampled by exactly 1 (weights 1 and 0), so values
    and gradients are torch's."""
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")
    nd = input.ndim - 2
    ranks = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
    if mode not in ("nearest", "nearest-exact", "area", *ranks):
        raise NotImplementedError(f"interpolate: mode {mode!r} is not supported (nearest, nearest-exact, linear, "
                                  "bilinear, bicubic, trilinear, area)")
    if nd not in (1, 2, 3) or ranks.get(mode, nd) != nd:
        raise ValueError(f"interpolate: mode {mode!r} does not take {input.ndim}-D input")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    if align_corners is not None and mode not in ranks:
        raise ValueError(f"interpolate: align_corners is for the linear and cubic modes, not {mode!r}")
    sizes, scales = _per_dim(size, nd, int), _per_dim(scale_factor, nd, float)
    if mode == "area":
        out = sizes or [int(math.floor(n * s)) for n, s in zip(input.shape[2:], scales)]
        return _c.AdaptiveAvgPool(nd, out).forward(input)
    kind = mode if mode in ("nearest", "nearest-exact", "bicubic") else "bilinear"

    def resample(x, sz, sc):
        return _c.Upsample(sz or [], sc or [], kind, align_corners, bool(recompute_scale_factor)).forward(x)

    if nd == 2:
        return resample(input, sizes, scales)
    if nd == 1:  # (N, C, L) as (N, C, 1, L), the unit axis resampled by 1
        y = resample(_F.unsqueeze(input, 2), sizes and [1] + sizes, scales and [1.0] + scales)
        return _F.squeeze(y, 2)
    n, c, d, h, w = input.shape  # (H, W) of every depth slice, then depth with H*W resampled by 1
    y = resample(_F.reshape(input, (n, c * d, h, w)), sizes and sizes[1:], scales and scales[1:])
    h2, w2 = y.shape[2:]
    y = resample(_F.reshape(y, (n, c, d, h2 * w2)), sizes and [sizes[0], h2 * w2], scales and [scales[0], 1.0])
    return _F.reshape(y, (n, c, y.shape[2], h2, w2))


def _per_dim(value, nd, kind):
    if value is None:
        return None
    values = [value] * nd if isinstance(value, numbers.Real) else list(value)
    if len(values) != nd:
        raise ValueError(f"interpolate: expected {nd} values (one per spatial dim), got {value!r}")
    return [kind(v) for v in values]


def one_hot(tensor, num_classes=-1, dtype=None):
    """torch.nn.functional.one_hot. On an integer numpy array (data preparation): int64 of shape
    tensor.shape + (num_classes,), num_classes=-1 taking max + 1, as torch. On an integer symbol inside
    a traced forward or loss: 0/1 in the model's float dtype (or `dtype`), where torch gives int64 that
    code then converts with .float(); num_classes must be given (a plan's shapes are fixed), and a class
    value out of range is a ValueError when the step runs."""
    import numpy as np
    if isinstance(tensor, _c.Symbol):
        if num_classes is None or int(num_classes) <= 0:
            raise ValueError("one_hot: inside a forward, num_classes must be given (a plan's shapes are fixed)")
        name = np.dtype(_dtype_name(dtype, "one_hot")).name if dtype is not None else \
            (getattr(_tracing, "dtype", None) or "float32")
        return _F._one_hot(tensor, int(num_classes), name)
    labels = np.asarray(tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else tensor)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"one_hot: expected an integer array, got dtype {labels.dtype}")
    if num_classes == -1:
        num_classes = int(labels.max()) + 1 if labels.size else 0
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"one_hot: class values must be in [0, {num_classes}), got {labels.min()}..{labels.max()}")
    return (labels[..., None] == np.arange(num_classes)).astype(np.int64)
