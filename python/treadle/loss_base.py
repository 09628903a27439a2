"""The loss classes behind tl.loss (Loss, MSE, L1, Huber, CrossEntropy, BCEWithLogits, Custom): each
holds the native loss description the trainer records. tl.loss documents them; the torch-named
losses (nn/losses.py) build on them, so this file imports neither.
"""
import inspect

import numpy as np

from . import _core

__all__ = ["Loss", "MSE", "L1", "Huber", "CrossEntropy", "BCEWithLogits", "Custom"]


class Loss:
    """Base class: a thin handle on the native loss description."""

    __slots__ = ("_native",)
    op = ""  # the graph op this loss records

    @property
    def kind(self):
        return self._native.kind

    @property
    def reduction(self):
        return self._native.reduction

    def key(self):
        """Identifies the loss in a plan key (kind, reduction and parameters)."""
        return self._native.key()

    def target_dtype(self, pred_dtype):
        """The dtype name a target must have for a prediction of `pred_dtype` ("int64" for class indices)."""
        return self._native.target_dtype(pred_dtype)

    def check_target(self, pred_shape, pred_dtype, target):
        """Raises ValueError/TypeError if the numpy array `target` does not fit such a prediction."""
        self._native.check_target(list(pred_shape), pred_dtype, target)

    def _attrs(self):
        return {"reduction": self.reduction}

    def __call__(self, pred, target, backend=""):
        """Evaluates the loss on numpy arrays (one op call; for inspection, not for training loops)."""
        # Any layout is fine here (a copy when strided): the op itself checks dtypes and shapes.
        # np.asarray(order="C") keeps a 0-d target 0-d (np.ascontiguousarray would make it (1,)).
        arrays = [np.asarray(a, order="C") for a in (pred, target)]
        for what, a in zip(("prediction", "target"), arrays):
            if a.dtype.name not in ("float32", "float64", "int32", "int64"):
                raise TypeError(f"{type(self).__name__}: {what} has unsupported dtype {a.dtype} "
                                "(expected float32 or float64; int64 class indices for CrossEntropy)")
        outputs, _ = _core.run_op(self.op, arrays, self._attrs(), None, backend, False, 0)
        return outputs[0]

    def __eq__(self, other):
        return isinstance(other, Loss) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        return f"{type(self).__name__}(reduction={self.reduction!r})"


class MSE(Loss):
    """Mean squared error: reduce((pred - target)**2)."""

    __slots__ = ()
    op = "mse_loss"

    def __init__(self, reduction="mean"):
        self._native = _core.Loss.mse(reduction)


class L1(Loss):
    """Mean absolute error: reduce(|pred - target|)."""

    __slots__ = ()
    op = "l1_loss"

    def __init__(self, reduction="mean"):
        self._native = _core.Loss.l1(reduction)


class Huber(Loss):
    """Huber loss: 0.5 d**2 where |d| < delta, delta (|d| - 0.5 delta) beyond (d = pred - target)."""

    __slots__ = ()
    op = "huber_loss"

    def __init__(self, delta=1.0, reduction="mean"):
        self._native = _core.Loss.huber(float(delta), reduction)

    @property
    def delta(self):
        return self._native.delta

    def _attrs(self):
        return {"reduction": self.reduction, "delta": self.delta}

    def __repr__(self):
        return f"Huber(delta={self.delta!r}, reduction={self.reduction!r})"


class CrossEntropy(Loss):
    """Cross entropy of logits (N, C) or (N, C, d...) against int64 class indices (N) or (N, d...)."""

    __slots__ = ()
    op = "cross_entropy"

    def __init__(self, reduction="mean"):
        self._native = _core.Loss.cross_entropy(reduction)


class BCEWithLogits(Loss):
    """Binary cross entropy on logits (a numerically stable sigmoid + BCE); target of the logits' shape."""

    __slots__ = ()
    op = "bce_with_logits"

    def __init__(self, reduction="mean"):
        self._native = _core.Loss.bce_with_logits(reduction)


def _takes_three_arguments(fn):
    """Whether fn has three required positional parameters (output, target, input). A third
    parameter with a default is the function's own option, not the input."""
    try:
        params = inspect.signature(fn).parameters.values()
    except ValueError:  # no signature to inspect (some builtins): the two-argument form
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in positional and p.default is inspect.Parameter.empty) == 3


class Custom(Loss):
    """A loss function fn(output, target) or fn(output, target, input) -> 0-d symbol, traced into
    the training plan.

    `output` is the model's output symbol, or a tuple of them when the forward returns several;
    `target` is the target symbol (any dtype: integer labels too); `input`, passed when fn has a
    third required parameter, is the model's input symbol. fn runs while a plan is compiled,
    once per input signature, never per step; every op it records is differentiated with the
    step. The target's shape and dtype are checked by the ops fn uses, when the plan is compiled.
    """

    __slots__ = ("fn",)

    def __init__(self, fn, name=None):
        if not callable(fn):
            raise TypeError(f"Custom: expected a function fn(output, target), got {type(fn).__name__}")
        self.fn = fn
        label = name or f"loss function {getattr(fn, '__qualname__', type(fn).__name__)}"

        wants_input = _takes_three_arguments(fn)

        def traced(outputs, target, inputs):
            out = outputs[0] if len(outputs) == 1 else tuple(outputs)
            if wants_input:
                return fn(out, target, inputs[0] if len(inputs) == 1 else tuple(inputs))
            return fn(out, target)

        self._native = _core.Loss.custom(traced, label)

    @property
    def name(self):
        return self._native.name

    def __call__(self, pred, target, backend=""):
        raise TypeError(f"{self.name}: a custom loss runs inside a trainer's plan; evaluate it with "
                        "Trainer.evaluate(x, y)")

    def __repr__(self):
        return f"Custom({self.name!r})"

