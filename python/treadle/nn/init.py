"""Parameter initialisers with torch.nn.init's names, arguments and formulas.

Each writes into its argument in place and returns it: a parameter view (``layer.weight``, or what
``module.parameters()`` yields), a ``tl.nn.Parameter``, or any writable float numpy array. Draws come
from the generator that ``tl.manual_seed`` seeds (the one the layers' default initialisation uses), so
a seeded script initialises the same way on every run; the streams differ from torch's.
"""
import math
import numbers

import numpy as np

from .. import _core

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
]


def _target(tensor, fn):
    """The writable float array behind `tensor`."""
    array = tensor.data if isinstance(tensor, _core.Parameter) else tensor
    if not isinstance(array, np.ndarray):
        raise TypeError(f"nn.init.{fn}: expected a parameter or a numpy array, got {type(tensor).__name__}")
    if array.dtype.kind != "f":
        raise TypeError(f"nn.init.{fn}: expected a floating array, got dtype {array.dtype}")
    if not array.flags.writeable:
        raise ValueError(f"nn.init.{fn}: the array is read-only")
    return array


def _draws(shape, normal, a, b):
    return _core.init_draws(int(math.prod(shape)), normal, float(a), float(b)).reshape(shape)


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (torch.nn.init.calculate_gain's table)."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
              "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, numbers.Real) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _fans(array, fn):
    """(fan_in, fan_out) as torch computes them: dim 1 and dim 0 times the receptive field."""
    if array.ndim < 2:
        raise ValueError(f"nn.init.{fn}: fan in and fan out can not be computed for an array with fewer than "
                         f"2 dimensions (shape {array.shape})")
    receptive = math.prod(array.shape[2:])
    return array.shape[1] * receptive, array.shape[0] * receptive


def _fan(array, mode, fn):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"nn.init.{fn}: mode {mode!r} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _fans(array, fn)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a=0.0, b=1.0):
    array = _target(tensor, "uniform_")
    if not a <= b:
        raise ValueError(f"nn.init.uniform_: a ({a}) must not exceed b ({b})")
    array[...] = _draws(array.shape, False, a, b)
    return tensor


def normal_(tensor, mean=0.0, std=1.0):
    array = _target(tensor, "normal_")
    if not std >= 0:
        raise ValueError(f"nn.init.normal_: std must be >= 0, got {std}")
    array[...] = _draws(array.shape, True, mean, std) if std > 0 else mean
    return tensor


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0):
    """N(mean, std^2) restricted to [a, b] (rejection: values outside are drawn again)."""
    array = _target(tensor, "trunc_normal_")
    if not (std > 0 and a < b):
        raise ValueError(f"nn.init.trunc_normal_: needs std > 0 and a < b, got std={std}, a={a}, b={b}")
    values = _draws(array.shape, True, mean, std).ravel()
    for _ in range(1000):
        outside = np.flatnonzero((values < a) | (values > b))
        if outside.size == 0:
            break
        values[outside] = _draws(outside.shape, True, mean, std)
    else:
        raise ValueError(f"nn.init.trunc_normal_: [{a}, {b}] is too far in the tail of N({mean}, {std}^2)")
    array[...] = values.reshape(array.shape)
    return tensor


def constant_(tensor, val):
    _target(tensor, "constant_")[...] = val
    return tensor


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def eye_(tensor):
    array = _target(tensor, "eye_")
    if array.ndim != 2:
        raise ValueError(f"nn.init.eye_: only 2-D arrays are supported, got shape {array.shape}")
    array[...] = np.eye(*array.shape)
    return tensor


def dirac_(tensor, groups=1):
    """The identity for convolutions: out channel i of each group passes input channel i through."""
    array = _target(tensor, "dirac_")
    if array.ndim not in (3, 4, 5) or array.shape[0] % groups:
        raise ValueError(f"nn.init.dirac_: needs a 3-, 4- or 5-D array whose dim 0 divides into {groups} groups, "
                         f"got shape {array.shape}")
    out_per_group = array.shape[0] // groups
    array[...] = 0
    centre = tuple(k // 2 for k in array.shape[2:])
    for g in range(groups):
        for i in range(min(out_per_group, array.shape[1])):
            array[(g * out_per_group + i, i) + centre] = 1
    return tensor


def xavier_uniform_(tensor, gain=1.0):
    array = _target(tensor, "xavier_uniform_")
    fan_in, fan_out = _fans(array, "xavier_uniform_")
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    array[...] = _draws(array.shape, False, -bound, bound)
    return tensor


def xavier_normal_(tensor, gain=1.0):
    array = _target(tensor, "xavier_normal_")
    fan_in, fan_out = _fans(array, "xavier_normal_")
    array[...] = _draws(array.shape, True, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))
    return tensor


def kaiming_uniform_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    array = _target(tensor, "kaiming_uniform_")
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(_fan(array, mode, "kaiming_uniform_"))
    array[...] = _draws(array.shape, False, -bound, bound)
    return tensor


def kaiming_normal_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    array = _target(tensor, "kaiming_normal_")
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(array, mode, "kaiming_normal_"))
    array[...] = _draws(array.shape, True, 0.0, std)
    return tensor


def orthogonal_(tensor, gain=1.0):
    """A (semi-)orthogonal matrix from the QR decomposition of a normal draw (torch's construction); a
    3-D or larger array is treated as (dim 0, the rest)."""
    array = _target(tensor, "orthogonal_")
    if array.ndim < 2:
        raise ValueError(f"nn.init.orthogonal_: only arrays with 2 or more dimensions are supported, "
                         f"got shape {array.shape}")
    rows, cols = array.shape[0], array.size // array.shape[0]
    flat = _draws((rows, cols), True, 0.0, 1.0)
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    array[...] = (gain * q).reshape(array.shape)
    return tensor
