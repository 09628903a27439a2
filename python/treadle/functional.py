"""Symbolic ops for a module's forward: relu, softmax, linear, concat, ... (torch.nn.functional names)."""
from . import _core as _c

_native = _c.functional
globals().update({name: getattr(_native, name) for name in dir(_native) if not name.startswith("_")})
__all__ = [name for name in dir(_native) if not name.startswith("_")]
