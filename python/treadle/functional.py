"""Symbolic ops for a module's forward: relu, softmax, linear, concat, ... (torch.nn.functional names)."""
from . import _core as _c

_native = _c.functional
globals().update({name: getattr(_native, name) for name in dir(_native) if not name.startswith("_")})
__all__ = [name for name in dir(_native) if not name.startswith("_")]


def _as_list(what, value, allow_none=False):
    """A Symbol or a sequence of them (None entries where allowed) as a list."""
    if isinstance(value, _c.Symbol) or (allow_none and value is None):
        return [value]
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if not (isinstance(v, _c.Symbol) or (allow_none and v is None)):
                raise TypeError(f"grad: {what}[{i}] is a {type(v).__name__}, expected a Symbol")
        return list(value)
    raise TypeError(f"grad: {what} must be a Symbol or a sequence of Symbols, got {type(value).__name__}")


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=True, allow_unused=None,
         materialize_grads=False):
    """torch.autograd.grad inside a traced forward or loss: the gradients of outputs with respect to
    inputs (weighted by grad_outputs; may be omitted for scalar outputs), returned as a tuple of
    Symbols. They are ordinary graph values, so the loss built from them is differentiated again in
    the training step (create_graph is always true; retain_graph has nothing to retain). An input
    the outputs do not depend on is an error, unless allow_unused (None in its place) or
    materialize_grads (zeros)."""
    outs = _as_list("outputs", outputs)
    ins = _as_list("inputs", inputs)
    if grad_outputs is None:
        seeds = [None] * len(outs)
    else:
        seeds = _as_list("grad_outputs", grad_outputs, allow_none=True)
    if allow_unused is None:
        allow_unused = materialize_grads
    if materialize_grads and not allow_unused:
        raise ValueError("grad: materialize_grads=True needs allow_unused to be True or unset")
    result = _native._grad(outs, ins, seeds, bool(allow_unused))
    if materialize_grads:
        result = [zeros_like(x) if g is None else g for g, x in zip(result, ins)]  # noqa: F821 (bound above)
    return tuple(result)


__all__.append("grad")

# torch's loss functions with their options (reduction "none", weights, ...); the plain cases are
# the fused loss ops bound above.
from .functional_losses import *  # noqa: E402,F401,F403
from .functional_losses import __all__ as _loss_names  # noqa: E402

__all__ += [n for n in _loss_names if n not in __all__]


def normal(mean, std=1.0):
    """torch.normal(mean, std) inside a forward: mean + std * (standard normal noise of mean's
    shape), drawn anew each step from the context's RNG like randn_like. Gradients flow into mean
    and std (the reparameterisation), none into the noise."""
    if not isinstance(mean, _c.Symbol):
        raise TypeError(f"normal: mean must be a Symbol (its shape sets the noise's), got {type(mean).__name__}")
    return mean + std * randn_like(mean)  # noqa: F821 (bound from the native module above)


__all__.append("normal")

# torch.nn.functional's remaining activations, normalize and constant pad, as compositions.
from .functional_extra import *  # noqa: E402,F401,F403
from .functional_extra import __all__ as _extra_names  # noqa: E402

__all__ += [n for n in _extra_names if n not in __all__]
