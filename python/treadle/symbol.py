"""torch.Tensor's methods on the symbols a forward is traced with.

A forward written for torch calls methods on its tensors: ``x.view(b, -1)``, ``h.transpose(0, 1)``,
``x[:, -1]``, ``(a / b) ** 2``, ``z.exp()``, ``x.mean(dim=1)``. Each method here records the
treadle op of the same meaning (tl.functional), so the gradient is the op's own, checked one by one
in the op suite. Views (view, reshape, transpose, indexing) are recorded as reshape/permute/slice
nodes: a reshape costs nothing, a permute or slice copies once inside the plan, never on the host.

Installed on ``treadle._core.Symbol`` when treadle is imported.
"""
import math
import operator

from . import _core
from . import functional as F

Symbol = _core.Symbol


def _shape_args(name, args):
    """view(2, -1) and view((2, -1)) both mean the shape (2, -1)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    for a in args:
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(f"{name}: sizes must be integers, got {type(a).__name__}")
    return list(args)


def _number(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name}: expected a symbol or a Python number, got {type(v).__name__}")
    return float(v)


def _truediv(self, other):
    if isinstance(other, Symbol):
        return F.div(self, other)
    return F.div(self, _number("/", other))


def _rtruediv(self, other):
    return F.div(_core.functional._scalar_like(self, _number("/", other)), self)


def _pow(self, exponent):
    if isinstance(exponent, Symbol):
        raise TypeError("**: the exponent must be a Python number (a symbol exponent is not supported; "
                        "write (exponent * base.log()).exp() for a positive base)")
    return F.pow(self, _number("**", exponent))


def _rpow(self, base):
    base = _number("**", base)
    if base <= 0:
        raise ValueError(f"**: a number raised to a symbol needs a positive base, got {base}")
    return F.exp(self * math.log(base))


def _size(self, dim=None):
    if dim is None:
        return self.shape
    return self.shape[operator.index(dim)]


def _flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0:
        return F.reshape(self, [1])
    return F.flatten(self, start_dim, end_dim)


def _t(self):
    if self.ndim > 2:
        raise ValueError(f"t: expects a symbol of at most 2 dims, got {self.ndim} (use transpose(dim0, dim1))")
    return F.transpose(self, 0, -1) if self.ndim == 2 else self


def _split(self, split_size_or_sections, dim=0):
    return F.split(self, split_size_or_sections, dim)


def _index_items(key):
    items = list(key) if isinstance(key, tuple) else [key]
    if sum(1 for k in items if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    return items


def _getitem(self, key):
    """Basic indexing as torch: integers (the dim is dropped), slices with step 1, None (a new
    dim of size 1) and one Ellipsis. Out-of-range integers raise IndexError; slices clamp as Python's."""
    items = _index_items(key)
    consumed = sum(1 for k in items if k is not None and k is not Ellipsis)
    if consumed > self.ndim:
        raise IndexError(f"too many indices for a symbol of {self.ndim} dims: {consumed}")
    fill = [slice(None)] * (self.ndim - consumed)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = fill
    else:
        items += fill
    x, dim, out_shape = self, 0, []
    for k in items:
        if k is None:
            out_shape.append(1)
            continue
        n = self.shape[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step != 1:
                raise ValueError(f"indexing: only step 1 is supported, got a step of {step} in dim {dim}")
            stop = max(stop, start)
            if (start, stop) != (0, n):
                x = F.slice(x, dim, start, stop)
            out_shape.append(stop - start)
        elif isinstance(k, Symbol):
            raise TypeError("indexing with a symbol is not supported (use an Embedding for a lookup)")
        else:
            try:
                i = operator.index(k)
            except TypeError:
                raise TypeError(f"indices must be integers, slices, None or ..., got {type(k).__name__}") from None
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of range for dim {dim} of size {n}")
            i %= n
            x = F.slice(x, dim, i, i + 1)
        dim += 1
    return x if tuple(out_shape) == x.shape else F.reshape(x, out_shape)


def _method(fn):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    method.__name__ = fn.__name__
    method.__doc__ = fn.__doc__
    return method


_METHODS = {
    "__truediv__": _truediv,
    "__rtruediv__": _rtruediv,
    "__pow__": _pow,
    "__rpow__": _rpow,
    "__abs__": lambda self: F.abs(self),
    "__getitem__": _getitem,
    "exp": _method(F.exp),
    "log": _method(F.log),
    "log1p": _method(F.log1p),
    "sqrt": _method(F.sqrt),
    "abs": _method(F.abs),
    "pow": _method(F.pow),
    "clamp": lambda self, min=None, max=None: F.clamp(self, min, max),
    "relu": _method(F.relu),
    "sigmoid": _method(F.sigmoid),
    "tanh": _method(F.tanh),
    "softmax": lambda self, dim: F.softmax(self, dim),
    "log_softmax": lambda self, dim: F.log_softmax(self, dim),
    "sum": lambda self, dim=None, keepdim=False: F.sum(self, dim, keepdim),
    "mean": lambda self, dim=None, keepdim=False: F.mean(self, dim, keepdim),
    "view": lambda self, *shape: F.reshape(self, _shape_args("view", shape)),
    "reshape": lambda self, *shape: F.reshape(self, _shape_args("reshape", shape)),
    "flatten": _flatten,
    "transpose": lambda self, dim0, dim1: F.transpose(self, dim0, dim1),
    "permute": lambda self, *dims: F.permute(self, _shape_args("permute", dims)),
    "unsqueeze": lambda self, dim: F.unsqueeze(self, dim),
    "squeeze": lambda self, dim=None: F.squeeze(self, dim),
    "split": _split,
    "chunk": lambda self, chunks, dim=0: F.chunk(self, chunks, dim),
    "t": _t,
    "size": _size,
    "dim": lambda self: self.ndim,
    "numel": lambda self: math.prod(self.shape),
    "contiguous": lambda self: self,  # a plan's tensors are always contiguous
    # Comparisons give 0/1 masks in the operands' dtype (no bool dtype), for F.where and masking.
    # == and != stay Python's identity comparisons (symbols are used as dict keys); use .eq / .ne.
    "__gt__": lambda self, other: F.gt(self, other),
    "__lt__": lambda self, other: F.lt(self, other),
    "__ge__": lambda self, other: F.ge(self, other),
    "__le__": lambda self, other: F.le(self, other),
    "gt": lambda self, other: F.gt(self, other),
    "lt": lambda self, other: F.lt(self, other),
    "ge": lambda self, other: F.ge(self, other),
    "le": lambda self, other: F.le(self, other),
    "eq": lambda self, other: F.eq(self, other),
    "ne": lambda self, other: F.ne(self, other),
    "gather": lambda self, dim, index: F.gather(self, dim, index),
    "where": lambda self, condition, other: F.where(condition, self, other),
    "masked_fill": lambda self, mask, value: F.where(mask, value, self),
}

for _name, _fn in _METHODS.items():
    setattr(Symbol, _name, _fn)
