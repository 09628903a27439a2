"""Optimizers, learning-rate schedules and gradient clipping, named and parameterised like torch.optim.

An optimizer here is not given parameters (hyper-parameters are keyword arguments, with torch's names
and defaults): the trainer binds it to the model's one flat parameter
buffer and runs one fused C++ update per step (formulas identical to torch.optim's). Each object
wraps its compiled counterpart in ``_native``; the trainer takes ``optimizer._native`` and
``schedule._native``.

Without a trainer, an optimizer can drive flat numpy buffers directly::

    opt = tl.optim.Adam(lr=1e-3).bind([("weight", (4, 3)), ("bias", (4,))], "float64")
    opt.step(params, grads)          # both 1-D float64 arrays of 16 elements; params updated in place

Schedules are closed forms: ``lr_at(t, base_lr)`` is the lr of optimizer update t + 1 (t = 0 first),
equal to what torch's scheduler of the same name gives after t calls of ``.step()``.
"""
import math
import numbers
import sys
import types

from . import _core

_native = _core.optim

__all__ = [
    "Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "RowWiseAdagrad", "ColumnWiseAdagrad",
    "LRSchedule", "ConstantLR", "StepLR", "ExponentialLR", "CosineAnnealingLR", "WarmupCosineLR",
    "lr_scheduler", "schedule", "clip_grad_norm_", "clip_grad_norm",
]


def _number(cls_name, what, value):
    """A hyper-parameter as a float: a real number, and finite (an infinite lr or eps would turn every
    parameter into NaN or Inf at the first update, far from the call that set it)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{cls_name}: {what} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{cls_name}: invalid {what} value: {value} (hyper-parameters must be finite)")
    return float(value)


def _no_positional(cls_name, args):
    """torch's first argument is a parameter list; here the trainer binds the optimizer instead."""
    if args:
        raise TypeError(f"{cls_name}: takes keyword hyper-parameters only (e.g. lr=0.1) and no parameter list: "
                        "the trainer binds the optimizer to the model's flat parameter buffer")


class Optimizer:
    """Base of the Python optimizers: a thin wrapper around the compiled optimizer in ``_native``."""

    def __init__(self, native, defaults):
        self._native = native
        self.defaults = defaults

    @property
    def lr(self):
        """The base learning rate (a schedule, if any, scales it per step)."""
        return self._native.lr

    @lr.setter
    def lr(self, value):
        value = _number(type(self).__name__, "lr", value)
        if not value >= 0.0:
            raise ValueError(f"{type(self).__name__}: invalid lr (learning rate) value: {value}")
        self._native.lr = value

    @property
    def step_count(self):
        """Updates made so far (torch's per-parameter ``state['step']``)."""
        return self._native.step_count

    def bind(self, slots, dtype):
        """Allocates state for flat buffers holding ``slots`` = [(name, shape), ...] back to back."""
        self._native.bind([(str(n), tuple(int(d) for d in s)) for n, s in slots], dtype)
        return self

    def step(self, params, grads, lr=None):
        """One update, in place, of the flat 1-D numpy buffer ``params`` from ``grads``."""
        self._native.step(params, grads, lr)

    def state(self):
        """Copies of the state buffers by torch's names ("exp_avg", "momentum_buffer", "sum", ...)."""
        return self._native.state()

    def load_state(self, state, step_count=None):
        """Restores state buffers (and optionally the step count) saved by ``state()``; a refused call
        changes nothing."""
        if step_count is not None:
            if isinstance(step_count, bool) or not isinstance(step_count, numbers.Integral):
                raise TypeError(f"{type(self).__name__}.load_state: step_count must be an integer, "
                                f"got {type(step_count).__name__}")
            if step_count < 0:
                raise ValueError(f"{type(self).__name__}.load_state: invalid step count {step_count} (must be >= 0)")
        self._native.load_state(dict(state))
        if step_count is not None:
            self._native.step_count = int(step_count)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.defaults.items())
        return f"{type(self).__name__}({args})"


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""

    def __init__(self, *args, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        n = "SGD"
        _no_positional(n, args)
        d = dict(lr=_number(n, "lr", lr), momentum=_number(n, "momentum", momentum),
                 dampening=_number(n, "dampening", dampening),
                 weight_decay=_number(n, "weight_decay", weight_decay), nesterov=bool(nesterov))
        super().__init__(_native.sgd(**d), d)


def _betas(cls_name, betas):
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"{cls_name}: betas must be a pair (beta1, beta2), got {betas!r}") from None
    return _number(cls_name, "betas[0]", b1), _number(cls_name, "betas[1]", b2)


class Adam(Optimizer):
    """Adam (optionally AMSGrad); weight_decay is added to the gradient (L2), as in torch.optim.Adam."""

    _factory = staticmethod(_native.adam)

    def __init__(self, *args, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
        n = type(self).__name__
        _no_positional(n, args)
        b1, b2 = _betas(n, betas)
        d = dict(lr=_number(n, "lr", lr), betas=(b1, b2), eps=_number(n, "eps", eps),
                 weight_decay=_number(n, "weight_decay", weight_decay), amsgrad=bool(amsgrad))
        native = self._factory(lr=d["lr"], beta1=b1, beta2=b2, eps=d["eps"], weight_decay=d["weight_decay"],
                               amsgrad=d["amsgrad"])
        super().__init__(native, d)


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam step."""

    _factory = staticmethod(_native.adamw)

    def __init__(self, *args, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        super().__init__(*args, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


class RMSprop(Optimizer):
    """RMSprop, optionally with momentum and centered (variance-normalised) updates."""

    def __init__(self, *args, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False):
        n = "RMSprop"
        _no_positional(n, args)
        d = dict(lr=_number(n, "lr", lr), alpha=_number(n, "alpha", alpha), eps=_number(n, "eps", eps),
                 weight_decay=_number(n, "weight_decay", weight_decay), momentum=_number(n, "momentum", momentum),
                 centered=bool(centered))
        super().__init__(_native.rmsprop(**d), d)


class Adagrad(Optimizer):
    """AdaGrad with learning-rate decay lr / (1 + (t - 1) * lr_decay) and an initial accumulator value."""

    _factory = staticmethod(_native.adagrad)

    def __init__(self, *args, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10):
        n = type(self).__name__
        _no_positional(n, args)
        d = dict(lr=_number(n, "lr", lr), lr_decay=_number(n, "lr_decay", lr_decay),
                 weight_decay=_number(n, "weight_decay", weight_decay),
                 initial_accumulator_value=_number(n, "initial_accumulator_value", initial_accumulator_value),
                 eps=_number(n, "eps", eps))
        super().__init__(self._factory(**d), d)


class RowWiseAdagrad(Adagrad):
    """AdaGrad with one accumulator per row of each 2-D parameter (fed by the row's mean squared gradient).

    Parameters that are not 2-D are updated exactly as by Adagrad. The state "sum" is compact: per slot,
    R entries for an (R, C) matrix, numel entries otherwise.
    """

    _factory = staticmethod(_native.rowwise_adagrad)


class ColumnWiseAdagrad(Adagrad):
    """AdaGrad with one accumulator per column of each 2-D parameter; see RowWiseAdagrad."""

    _factory = staticmethod(_native.columnwise_adagrad)


class LRSchedule:
    """Base of the schedules: ``lr_at(step, base_lr)`` from the compiled schedule in ``_native``."""

    def __init__(self, native):
        self._native = native

    def lr_at(self, step, base_lr):
        return self._native.lr_at(int(step), float(base_lr))

    def __repr__(self):
        return self._native.name


class ConstantLR(LRSchedule):
    """base_lr * factor for the first total_iters steps, then base_lr (torch's defaults)."""

    def __init__(self, factor=1.0 / 3, total_iters=5):
        super().__init__(_native.constant_schedule(float(factor), int(total_iters)))


class StepLR(LRSchedule):
    """base_lr * gamma ** (t // step_size)."""

    def __init__(self, step_size, gamma=0.1):
        super().__init__(_native.step_schedule(int(step_size), float(gamma)))


class ExponentialLR(LRSchedule):
    """base_lr * gamma ** t."""

    def __init__(self, gamma):
        super().__init__(_native.exponential_schedule(float(gamma)))


class CosineAnnealingLR(LRSchedule):
    """eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2; like torch, it rises again past T_max."""

    def __init__(self, T_max, eta_min=0.0):  # noqa: N803 (torch's name)
        super().__init__(_native.cosine_schedule(int(T_max), float(eta_min)))


class WarmupCosineLR(LRSchedule):
    """Linear warm-up from start_factor * base_lr over warmup_steps, then cosine to eta_min at total_steps.

    Equals torch's SequentialLR([LinearLR(start_factor, total_iters=warmup_steps),
    CosineAnnealingLR(T_max=total_steps - warmup_steps, eta_min)], milestones=[warmup_steps]).
    """

    def __init__(self, warmup_steps, total_steps, eta_min=0.0, start_factor=0.0):
        super().__init__(_native.warmup_cosine_schedule(int(warmup_steps), int(total_steps), float(eta_min),
                                                        float(start_factor)))


def clip_grad_norm_(grads, max_norm):
    """Scales the flat 1-D gradient buffer ``grads`` in place so its L2 norm is at most ``max_norm``.

    Same rule as torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), capped at 1);
    returns the norm before clipping.
    """
    return _native.clip_grad_norm(grads, float(max_norm))


clip_grad_norm = clip_grad_norm_

# `tl.optim.lr_scheduler.StepLR` (torch's spelling) and `tl.optim.schedule.StepLR` both work, and so
# does `from treadle.optim.lr_scheduler import StepLR`.
lr_scheduler = types.ModuleType(__name__ + ".lr_scheduler", "Learning-rate schedules (closed forms).")
for _cls in (LRSchedule, ConstantLR, StepLR, ExponentialLR, CosineAnnealingLR, WarmupCosineLR):
    setattr(lr_scheduler, _cls.__name__, _cls)
sys.modules[lr_scheduler.__name__] = lr_scheduler
schedule = lr_scheduler
del _cls
