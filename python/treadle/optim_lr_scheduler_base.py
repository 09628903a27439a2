"""The base of the learning-rate schedules (LRSchedule, LRScheduler) and the argument handling they
share; optim_lr_scheduler.py and optim_lr_scheduler_more.py define the schedules on it.
"""
from . import _core

_native = _core.optim


def _is_optimizer(obj):
    return hasattr(obj, "param_groups") and hasattr(obj, "defaults")


class LRSchedule:
    """Base of the closed-form schedules: ``lr_at(step, base_lr)`` from the compiled schedule."""

    def __init__(self, native):
        self._closed = native

    @property
    def _native(self):
        closed = self.__dict__.get("_closed")
        if closed is None or "optimizer" in self.__dict__:
            raise TypeError(f"{type(self).__name__}(optimizer, ...) sets the optimizer's learning rates itself when "
                            "you call its step(); do not pass it to Trainer(schedule=...) (build it without the "
                            "optimizer for that)")
        return closed

    def lr_at(self, step, base_lr):
        return self._native.lr_at(int(step), float(base_lr))

    def __repr__(self):
        closed = self.__dict__.get("_closed")
        return closed.name if closed is not None else f"{type(self).__name__}(optimizer)"


class LRScheduler(LRSchedule):
    """Base of torch's form: bound to an optimizer, ``step()`` advances ``last_epoch`` and sets every
    group's "lr"; ``get_last_lr()`` lists them. ``base_lrs`` are the groups' "initial_lr"."""

    _is_initial = False

    def _bind(self, optimizer, last_epoch=-1):
        if not _is_optimizer(optimizer):
            raise TypeError(f"{type(self).__name__}: {type(optimizer).__name__} is not an optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"{type(self).__name__}: param_groups[{i}] has no 'initial_lr' to resume from "
                                   f"(last_epoch={last_epoch}); load the optimizer's groups first")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self):
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def _lrs(self):
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_lr(self):
        raise NotImplementedError

    def step(self, epoch=None):
        """One epoch (one call per epoch, after that epoch's optimizer updates, as in torch)."""
        if "optimizer" not in self.__dict__:
            raise TypeError(f"{type(self).__name__}: this schedule is the closed form (built without an optimizer) "
                            "for Trainer(schedule=...); build it as "
                            f"{type(self).__name__}(optimizer, ...) to call step()")
        self._step_count += 1
        self._update_lr(epoch)

    def _update_lr(self, epoch=None):
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = int(epoch)
            values = self._closed_form() if hasattr(self, "_closed_form") else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = self._lrs()

    def get_last_lr(self):
        return list(self._last_lr)

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_closed")}

    def load_state_dict(self, state):
        self.__dict__.update(state)


def _split(cls_name, args, kwargs):
    """(optimizer or None, remaining positional arguments): torch's form when the first argument (or
    optimizer=) is an optimizer."""
    if "optimizer" in kwargs:
        return kwargs.pop("optimizer"), args
    if args and _is_optimizer(args[0]):
        return args[0], args[1:]
    return None, args


def _bind_args(cls_name, names, defaults, args, kwargs):
    """Positional and keyword arguments as a dict over `names` (torch's order), with defaults."""
    if len(args) > len(names):
        raise TypeError(f"{cls_name}: takes at most {len(names)} arguments after the optimizer, got {len(args)}")
    out = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"{cls_name}: unexpected argument '{k}' (known: {', '.join(names)})")
        if k in out:
            raise TypeError(f"{cls_name}: got multiple values for argument '{k}'")
        out[k] = v
    for k in names:
        if k not in out:
            if k not in defaults:
                raise TypeError(f"{cls_name}: missing argument '{k}'")
            out[k] = defaults[k]
    return out


def _torch_only(cls_name, opt):
    if opt is None:
        raise TypeError(f"{cls_name}: takes the optimizer as its first argument (torch's form; it has no closed form "
                        "for Trainer(schedule=...))")
