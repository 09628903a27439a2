"""Activation modules (torch.nn's ReLU, GELU, Softmax, ...): each applies one native activation op."""
from . import _core
from .nn import _NativeModule

__all__ = ["ReLU", "LeakyReLU", "ELU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softplus", "Softmax", "LogSoftmax"]


def _activation(name, kind, params=(), doc=""):
    def __init__(self, *args, **kwargs):
        values = []
        for i, (pname, default) in enumerate(params):
            values.append(float(args[i] if i < len(args) else kwargs.pop(pname, default)))
        if kwargs:
            raise TypeError(f"{name}: unexpected arguments {sorted(kwargs)}")
        _NativeModule.__init__(self, _core.Activation(kind, *values))
        object.__setattr__(self, "_args", dict(zip([p for p, _ in params], values)))

    def extra_repr(self):
        return ", ".join(f"{k}={v:g}" for k, v in self._args.items())

    return type(name, (_NativeModule,), {"__init__": __init__, "extra_repr": extra_repr, "__doc__": doc})


ReLU = _activation("ReLU", "relu", doc="max(x, 0)")
LeakyReLU = _activation("LeakyReLU", "leaky_relu", [("negative_slope", 0.01)])
ELU = _activation("ELU", "elu", [("alpha", 1.0)])
SiLU = _activation("SiLU", "silu", doc="x * sigmoid(x)")
Tanh = _activation("Tanh", "tanh")
Sigmoid = _activation("Sigmoid", "sigmoid")
Softplus = _activation("Softplus", "softplus", [("beta", 1.0), ("threshold", 20.0)])


class GELU(_NativeModule):
    """GELU, exact (approximate="none") or with the tanh approximation (approximate="tanh")."""

    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        super().__init__(_core.Activation("gelu" if approximate == "none" else "gelu_tanh"))
        self.approximate = approximate


class Softmax(_NativeModule):
    def __init__(self, dim=-1):
        super().__init__(_core.Activation("softmax", float(dim)))
        self.dim = dim


class LogSoftmax(_NativeModule):
    def __init__(self, dim=-1):
        super().__init__(_core.Activation("log_softmax", float(dim)))
        self.dim = dim
