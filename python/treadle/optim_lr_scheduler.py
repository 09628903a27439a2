"""Learning-rate schedules (``tl.optim.lr_scheduler``), in two forms.

torch's form: the schedule is built on an optimizer, sets each parameter group's "lr" itself and is
stepped once per epoch (or per batch, as your loop does), exactly as torch.optim.lr_scheduler::

    scheduler = tl.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
    for epoch in range(100):
        trainer.fit(x, y, epochs=1)
        scheduler.step()                     # ReduceLROnPlateau: scheduler.step(val_loss)

The formulas are torch's recursive ones (each step from the group's current lr), so chains such as
SequentialLR and a user's own lr changes behave as in torch. Do not also pass such a schedule to
``Trainer(schedule=...)``.

The closed form, for ``Trainer(schedule=...)``: built without an optimizer (``StepLR(step_size=30)``),
it is evaluated by the trainer per optimizer update: ``lr_at(t, base_lr)`` is the lr of update t + 1
(t = 0 first), what torch's scheduler of that name gives after t calls of ``.step()``. ConstantLR,
StepLR, ExponentialLR, CosineAnnealingLR and WarmupCosineLR have this form.
"""
import bisect
import math
from collections import Counter

from .optim_lr_scheduler_base import (  # noqa: F401 (LRSchedule, LRScheduler: tl.optim.lr_scheduler names)
    LRSchedule, LRScheduler, _bind_args, _native, _split, _torch_only)
from .optim_lr_scheduler_more import OneCycleLR, ReduceLROnPlateau, SequentialLR  # noqa: F401

__all__ = ["LRSchedule", "LRScheduler", "ConstantLR", "StepLR", "ExponentialLR", "CosineAnnealingLR", "WarmupCosineLR",
           "MultiStepLR", "LambdaLR", "LinearLR", "OneCycleLR", "ReduceLROnPlateau", "SequentialLR"]


class ConstantLR(LRScheduler):
    """base_lr * factor for the first total_iters epochs (updates, in the closed form), then base_lr."""

    def __init__(self, *args, **kwargs):
        opt, args = _split("ConstantLR", args, kwargs)
        a = _bind_args("ConstantLR", ["factor", "total_iters"] + (["last_epoch"] if opt else []),
                       dict(factor=1.0 / 3, total_iters=5, last_epoch=-1), args, kwargs)
        self.factor, self.total_iters = float(a["factor"]), int(a["total_iters"])
        super().__init__(_native.constant_schedule(self.factor, self.total_iters))
        if opt is not None:
            self._bind(opt, a["last_epoch"])

    def get_lr(self):
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._lrs()]
        if self.last_epoch != self.total_iters:
            return self._lrs()
        return [lr * (1.0 / self.factor) for lr in self._lrs()]

    def _closed_form(self):
        return [b * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor)) for b in self.base_lrs]


class StepLR(LRScheduler):
    """base_lr * gamma ** (epoch // step_size); the closed form counts optimizer updates instead."""

    def __init__(self, *args, **kwargs):
        opt, args = _split("StepLR", args, kwargs)
        a = _bind_args("StepLR", ["step_size", "gamma"] + (["last_epoch"] if opt else []),
                       dict(gamma=0.1, last_epoch=-1), args, kwargs)
        self.step_size, self.gamma = int(a["step_size"]), float(a["gamma"])
        super().__init__(_native.step_schedule(self.step_size, self.gamma))
        if opt is not None:
            self._bind(opt, a["last_epoch"])

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]

    def _closed_form(self):
        return [b * self.gamma ** (self.last_epoch // self.step_size) for b in self.base_lrs]


class ExponentialLR(LRScheduler):
    """base_lr * gamma ** epoch."""

    def __init__(self, *args, **kwargs):
        opt, args = _split("ExponentialLR", args, kwargs)
        a = _bind_args("ExponentialLR", ["gamma"] + (["last_epoch"] if opt else []), dict(last_epoch=-1), args, kwargs)
        self.gamma = float(a["gamma"])
        super().__init__(_native.exponential_schedule(self.gamma))
        if opt is not None:
            self._bind(opt, a["last_epoch"])

    def get_lr(self):
        if self._is_initial:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]

    def _closed_form(self):
        return [b * self.gamma ** self.last_epoch for b in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2; like torch, it rises again past T_max."""

    def __init__(self, *args, **kwargs):
        opt, args = _split("CosineAnnealingLR", args, kwargs)
        a = _bind_args("CosineAnnealingLR", ["T_max", "eta_min"] + (["last_epoch"] if opt else []),
                       dict(eta_min=0.0, last_epoch=-1), args, kwargs)
        self.T_max, self.eta_min = int(a["T_max"]), float(a["eta_min"])  # noqa: N815 (torch's name)
        super().__init__(_native.cosine_schedule(self.T_max, self.eta_min))
        if opt is not None:
            self._bind(opt, a["last_epoch"])

    def get_lr(self):
        t, T, e = self.last_epoch, self.T_max, self.eta_min  # noqa: N806
        groups = self.optimizer.param_groups
        if self._is_initial:
            return self._lrs()
        if self._step_count == 1 and t > 0:
            return [e + (b - e) * (1 + math.cos(t * math.pi / T)) / 2 for b in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [g["lr"] + (b - e) * (1 - math.cos(math.pi / T)) / 2 for b, g in zip(self.base_lrs, groups)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T)) * (g["lr"] - e) + e
                for g in groups]

    def _closed_form(self):
        e = self.eta_min
        return [e + (b - e) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2 for b in self.base_lrs]


class WarmupCosineLR(LRSchedule):
    """Linear warm-up from start_factor * base_lr over warmup_steps, then cosine to eta_min at total_steps
    (closed form only). Equals torch's SequentialLR([LinearLR(start_factor, total_iters=warmup_steps),
    CosineAnnealingLR(T_max=total_steps - warmup_steps, eta_min)], milestones=[warmup_steps])."""

    def __init__(self, warmup_steps, total_steps, eta_min=0.0, start_factor=0.0):
        super().__init__(_native.warmup_cosine_schedule(int(warmup_steps), int(total_steps), float(eta_min),
                                                        float(start_factor)))



class MultiStepLR(LRScheduler):
    """lr * gamma at each epoch listed in milestones (a milestone listed twice multiplies twice)."""

    def __init__(self, *args, **kwargs):
        opt, args = _split("MultiStepLR", args, kwargs)
        _torch_only("MultiStepLR", opt)
        a = _bind_args("MultiStepLR", ["milestones", "gamma", "last_epoch"], dict(gamma=0.1, last_epoch=-1),
                       args, kwargs)
        self.milestones, self.gamma = Counter(int(m) for m in a["milestones"]), float(a["gamma"])
        self._closed = None
        self._bind(opt, a["last_epoch"])

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return self._lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._lrs()]

    def _closed_form(self):
        n = bisect.bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return [b * self.gamma ** n for b in self.base_lrs]


class LambdaLR(LRScheduler):
    """base_lr * lr_lambda(epoch), one function for every group or one per group."""

    def __init__(self, *args, **kwargs):
        opt, args = _split("LambdaLR", args, kwargs)
        _torch_only("LambdaLR", opt)
        a = _bind_args("LambdaLR", ["lr_lambda", "last_epoch"], dict(last_epoch=-1), args, kwargs)
        fn, n = a["lr_lambda"], len(opt.param_groups)
        if isinstance(fn, (list, tuple)):
            if len(fn) != n:
                raise ValueError(f"LambdaLR: expected {n} lr_lambdas (one per parameter group), got {len(fn)}")
            self.lr_lambdas = list(fn)
        else:
            self.lr_lambdas = [fn] * n
        for f in self.lr_lambdas:
            if not callable(f):
                raise TypeError(f"LambdaLR: lr_lambda must be callable, got {type(f).__name__}")
        self._closed = None
        self._bind(opt, a["last_epoch"])

    def get_lr(self):
        return [b * f(self.last_epoch) for f, b in zip(self.lr_lambdas, self.base_lrs)]


class LinearLR(LRScheduler):
    """lr scaled linearly from start_factor to end_factor over total_iters epochs, then held."""

    def __init__(self, *args, **kwargs):
        opt, args = _split("LinearLR", args, kwargs)
        _torch_only("LinearLR", opt)
        a = _bind_args("LinearLR", ["start_factor", "end_factor", "total_iters", "last_epoch"],
                       dict(start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1), args, kwargs)
        self.start_factor, self.end_factor = float(a["start_factor"]), float(a["end_factor"])
        self.total_iters = int(a["total_iters"])
        if not 0 < self.start_factor <= 1:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], got {self.start_factor}")
        if not 0 <= self.end_factor <= 1:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], got {self.end_factor}")
        self._closed = None
        self._bind(opt, a["last_epoch"])

    def get_lr(self):
        s, e, n, t = self.start_factor, self.end_factor, self.total_iters, self.last_epoch
        if t == 0:
            return [lr * s for lr in self._lrs()]
        if self._is_initial or t > n:
            return self._lrs()
        return [lr * (1.0 + (e - s) / (n * s + (t - 1) * (e - s))) for lr in self._lrs()]

    def _closed_form(self):
        s, e, n = self.start_factor, self.end_factor, self.total_iters
        return [b * (s + (e - s) * min(n, self.last_epoch) / n) for b in self.base_lrs]

