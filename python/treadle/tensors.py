"""torch's tensor factories (zeros, ones, full) for code that builds tensors both in __init__ and in
forward: outside a traced forward they return numpy arrays (a positional table for register_buffer);
inside one, constant symbols of that shape (an RNN's zero initial state, torch.zeros(n, 51)).
"""
import numbers

import numpy as np

from .trace_state import _dtype_name, _tracing

__all__ = ["zeros", "ones", "full"]


def _size(name, size):
    dims = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise TypeError(f"{name}: sizes must be non-negative ints, got {tuple(size)}")
    return tuple(int(d) for d in dims)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False):
    """A tensor of `size` filled with fill_value: a constant symbol inside a traced forward (in the
    model's dtype unless given), a numpy array elsewhere (float32 unless given)."""
    if device is not None and str(device) != "cpu":
        raise ValueError(f"full: device={str(device)!r}: a model runs where its backend does")
    shape = _size("full", tuple(size) if isinstance(size, (tuple, list)) else (size,))
    named = None if dtype is None else np.dtype(_dtype_name(dtype, "full")).name
    graph = getattr(_tracing, "graph", None)
    if graph is not None:
        return graph.constant(list(shape), _number(fill_value), named or getattr(_tracing, "dtype", None) or "float32")
    return np.full(shape, fill_value, dtype=named or np.float32)


def _number(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"full: fill_value must be a number, got {type(value).__name__}")
    return float(value)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    """torch.zeros: see full."""
    return full(_size("zeros", size), 0.0, dtype=dtype, device=device)


def ones(*size, dtype=None, device=None, requires_grad=False):
    """torch.ones: see full."""
    return full(_size("ones", size), 1.0, dtype=dtype, device=device)
