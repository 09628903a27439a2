"""Losses: descriptions the trainer compiles into the training plan.

Each class holds `_native`, the C++ `treadle._core.Loss`; the trainer takes that and records the
loss op on (prediction, target). Semantics follow torch.nn.functional: `reduction` is "mean" or
"sum" and the value is a 0-d scalar of the prediction's dtype.

    loss = tl.loss.CrossEntropy()          # logits (N, C) or (N, C, d...), int64 labels (N) or (N, d...)
    loss = tl.loss.Huber(delta=0.5, reduction="sum")
"""
import numpy as np

from . import _core

__all__ = ["Loss", "MSE", "L1", "Huber", "CrossEntropy", "BCEWithLogits"]


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
