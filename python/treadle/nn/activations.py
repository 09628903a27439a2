"""Activation modules (torch.nn's ReLU, GELU, Softmax, ...): each applies one native activation op."""
import numbers
import warnings

from .. import _core
from .. import functional as F
from .module import _NativeModule



def _activation(name, kind, params=(), doc=""):
    def __init__(self, *args, **kwargs):
        values = []
        for i, (pname, default) in enumerate(params):
            values.append(float(args[i] if i < len(args) else kwargs.pop(pname, default)))
        # torch's inplace flag (after the parameters, e.g. ReLU(True)): a plan places every value in its
        # own arena slot, so there is nothing to save; accepted and ignored.
        extra = list(args[len(params):]) + ([kwargs.pop("inplace")] if "inplace" in kwargs else [])
        if kwargs or len(extra) > 1 or any(not isinstance(v, bool) for v in extra):
            raise TypeError(f"{name}: unexpected arguments {sorted(kwargs) or extra}")
        _NativeModule.__init__(self, _core.Activation(kind, *values))
        object.__setattr__(self, "_args", dict(zip([p for p, _ in params], values)))
        object.__setattr__(self, "_init_args", dict(self._args))  # by name, for tl.save

    def extra_repr(self):
        return ", ".join(f"{k}={v:g}" for k, v in self._args.items())

    return type(name, (_NativeModule,), {"__init__": __init__, "extra_repr": extra_repr, "__doc__": doc})


# The pointwise activations (ReLU, LeakyReLU, ELU, SiLU, Tanh, Sigmoid, Softplus, ...) come from the core's
# one list of them (treadle/module.hpp, activation_modules): a new one there is a new class here.
_POINTWISE = [entry[0] for entry in _core.activation_modules()]
for _name, _op, _doc, _params, _ in _core.activation_modules():
    globals()[_name] = _activation(_name, _op, [tuple(p) for p in _params], _doc)
del _name, _op, _doc, _params


class GELU(_NativeModule):
    """GELU, exact (approximate="none") or with the tanh approximation (approximate="tanh")."""

    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        super().__init__(_core.Activation("gelu" if approximate == "none" else "gelu_tanh"))
        self.approximate = approximate


def _implicit_dim(name, ndim):
    """torch's legacy choice when a softmax is built without dim: 0 for 0-, 1- and 3-D input, else 1."""
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                  "as an argument.", UserWarning, stacklevel=4)
    return 0 if ndim in (0, 1, 3) else 1


class _Softmax(_NativeModule):
    _kind = "softmax"

    def __init__(self, dim=None):
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, numbers.Integral)):
            raise TypeError(f"{type(self).__name__}: dim must be an int or None, got {dim!r}")
        super().__init__(_core.Activation(self._kind, float(-1 if dim is None else dim)))
        self.dim = dim

    def forward(self, input):  # noqa: A002 (torch's keyword)
        x = input
        if self.dim is None:  # decided per input rank, as torch does (with its warning)
            return getattr(F, self._kind)(x, _implicit_dim(self._kind, x.ndim))
        return self._native.forward(x)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmax(_Softmax):
    """torch.nn.Softmax(dim=None): without dim, torch's legacy implicit dim (with its warning)."""


class LogSoftmax(_Softmax):
    """torch.nn.LogSoftmax(dim=None): without dim, torch's legacy implicit dim (with its warning)."""

    _kind = "log_softmax"


# torch's activation forms that the native encoder layer has, by its names for them.
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def _activation_name(activation):
    """"relu" or "gelu" for an activation the native encoder layer has (a name, F.relu / F.gelu, a
    ReLU or exact GELU module); None for any other callable."""
    if isinstance(activation, str):
        return activation if activation in _ACTIVATIONS else None
    for name, fn in _ACTIVATIONS.items():
        if activation is fn:
            return name
    if type(activation) is globals()["ReLU"]:  # made from the core's list above
        return "relu"
    if type(activation) is GELU and activation.approximate == "none":
        return "gelu"
    return None


__all__ = _POINTWISE + ["GELU", "Softmax", "LogSoftmax"]
