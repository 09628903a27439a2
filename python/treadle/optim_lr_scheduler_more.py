"""OneCycleLR, ReduceLROnPlateau and SequentialLR in torch's form (see optim_lr_scheduler.py)."""
import bisect
import math

from .optim_lr_scheduler_base import LRScheduler, _bind_args, _split, _torch_only


def _per_group(cls_name, what, optimizer, value):
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{cls_name}: expected {n} values for {what} (one per parameter group), got {len(value)}")
        return list(value)
    return [value] * n


class OneCycleLR(LRScheduler):
    """The 1cycle policy, stepped once per batch: lr rises from max_lr / div_factor to max_lr over
    pct_start of total_steps, then anneals to initial_lr / final_div_factor; with cycle_momentum the
    group's momentum (or betas[0]) moves the opposite way between max_momentum and base_momentum.
    Cycling momentum needs an optimizer created with that state (SGD with momentum > 0)."""

    _NAMES = ["max_lr", "total_steps", "epochs", "steps_per_epoch", "pct_start", "anneal_strategy", "cycle_momentum",
              "base_momentum", "max_momentum", "div_factor", "final_div_factor", "three_phase", "last_epoch"]
    _DEFAULTS = dict(total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3, anneal_strategy="cos",
                     cycle_momentum=True, base_momentum=0.85, max_momentum=0.95, div_factor=25.0,
                     final_div_factor=1e4, three_phase=False, last_epoch=-1)

    def __init__(self, *args, **kwargs):
        opt, args = _split("OneCycleLR", args, kwargs)
        _torch_only("OneCycleLR", opt)
        a = _bind_args("OneCycleLR", self._NAMES, self._DEFAULTS, args, kwargs)
        self._closed = None
        self.total_steps = self._total_steps(a)
        self._phases = self._make_phases(float(a["pct_start"]), bool(a["three_phase"]))
        if not 0 <= a["pct_start"] <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be a float in [0, 1], got {a['pct_start']}")
        if a["anneal_strategy"] not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {a['anneal_strategy']!r}")
        self._anneal = self._cos if a["anneal_strategy"] == "cos" else self._linear
        max_lrs = _per_group("OneCycleLR", "max_lr", opt, a["max_lr"])
        self.cycle_momentum = bool(a["cycle_momentum"])
        if self.cycle_momentum and "momentum" not in opt.defaults and "betas" not in opt.defaults:
            raise ValueError(f"OneCycleLR: {type(opt).__name__} has neither momentum nor betas; pass "
                             "cycle_momentum=False")
        self.use_beta1 = "betas" in opt.defaults
        if a["last_epoch"] == -1:
            for m, g in zip(max_lrs, opt.param_groups):
                g["initial_lr"] = m / a["div_factor"]
                g["max_lr"] = m
                g["min_lr"] = g["initial_lr"] / a["final_div_factor"]
            if self.cycle_momentum:
                maxs = _per_group("OneCycleLR", "max_momentum", opt, a["max_momentum"])
                bases = _per_group("OneCycleLR", "base_momentum", opt, a["base_momentum"])
                for m, b, g in zip(maxs, bases, opt.param_groups):
                    self._set_momentum(g, m)
                    g["max_momentum"], g["base_momentum"] = m, b
        self._bind(opt, a["last_epoch"])

    @staticmethod
    def _total_steps(a):
        if a["total_steps"] is not None:
            if not isinstance(a["total_steps"], int) or a["total_steps"] <= 0:
                raise ValueError(f"OneCycleLR: total_steps must be a positive integer, got {a['total_steps']}")
            return a["total_steps"]
        e, s = a["epochs"], a["steps_per_epoch"]
        if e is None or s is None:
            raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
        if not isinstance(e, int) or e <= 0 or not isinstance(s, int) or s <= 0:
            raise ValueError(f"OneCycleLR: epochs and steps_per_epoch must be positive integers, got {e}, {s}")
        return e * s

    def _make_phases(self, pct, three):
        n = self.total_steps
        if three:
            return [(float(pct * n) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                    (float(2 * pct * n) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                    (n - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        return [(float(pct * n) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (n - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]

    @staticmethod
    def _cos(start, end, pct):
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

    @staticmethod
    def _linear(start, end, pct):
        return (end - start) * pct + start

    def _set_momentum(self, group, value):
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def get_lr(self):
        t = self.last_epoch
        if t > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {t} times but total_steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr0, lr1, m0, m1) in enumerate(self._phases):
                if t <= end or i == len(self._phases) - 1:
                    pct = (t - start) / (end - start)
                    lr = self._anneal(group[lr0], group[lr1], pct)
                    momentum = self._anneal(group[m0], group[m1], pct) if self.cycle_momentum else None
                    break
                start = end
            lrs.append(lr)
            if momentum is not None:
                self._set_momentum(group, momentum)
        return lrs


class ReduceLROnPlateau(LRScheduler):
    """Multiplies every group's lr by factor once the metric passed to ``step(metric)`` has not improved
    for more than patience epochs (then waits cooldown epochs); never below min_lr."""

    _NAMES = ["mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps"]
    _DEFAULTS = dict(mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel", cooldown=0,
                     min_lr=0.0, eps=1e-8)

    def __init__(self, *args, **kwargs):
        opt, args = _split("ReduceLROnPlateau", args, kwargs)
        _torch_only("ReduceLROnPlateau", opt)
        a = _bind_args("ReduceLROnPlateau", self._NAMES, self._DEFAULTS, args, kwargs)
        if a["factor"] >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1.0, got {a['factor']}")
        if a["mode"] not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max', got {a['mode']!r}")
        if a["threshold_mode"] not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got {a['threshold_mode']!r}")
        self._closed = None
        self.optimizer = opt
        self.factor, self.patience, self.cooldown, self.eps = a["factor"], a["patience"], a["cooldown"], a["eps"]
        self.min_lrs = _per_group("ReduceLROnPlateau", "min_lr", opt, a["min_lr"])
        self.mode, self.threshold, self.threshold_mode = a["mode"], a["threshold"], a["threshold_mode"]
        self.mode_worse = math.inf if self.mode == "min" else -math.inf
        self.last_epoch = 0
        self._last_lr = self._lrs()
        self.best, self.cooldown_counter, self.num_bad_epochs = self.mode_worse, 0, 0

    def step(self, metrics, epoch=None):
        """One epoch with its metric (e.g. the validation loss)."""
        current = float(metrics)
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        if self._is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad epochs in cooldown do not count
        if self.num_bad_epochs > self.patience:
            for i, group in enumerate(self.optimizer.param_groups):
                old = float(group["lr"])
                new = max(old * self.factor, self.min_lrs[i])
                if old - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = self._lrs()

    def _is_better(self, a, best):
        if self.mode == "min":
            return a < best * (1.0 - self.threshold) if self.threshold_mode == "rel" else a < best - self.threshold
        return a > best * (self.threshold + 1.0) if self.threshold_mode == "rel" else a > best + self.threshold


class SequentialLR(LRScheduler):
    """Runs schedulers[i] from epoch milestones[i - 1] on (each restarted at its milestone), as torch."""

    def __init__(self, *args, **kwargs):
        opt, args = _split("SequentialLR", args, kwargs)
        _torch_only("SequentialLR", opt)
        a = _bind_args("SequentialLR", ["schedulers", "milestones", "last_epoch"], dict(last_epoch=-1), args, kwargs)
        schedulers, milestones = list(a["schedulers"]), [int(m) for m in a["milestones"]]
        if not schedulers:
            raise ValueError("SequentialLR: expects at least one scheduler")
        for i, s in enumerate(schedulers):
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError(f"SequentialLR: schedulers[{i}] is a ReduceLROnPlateau, whose step needs a metric")
            if getattr(s, "optimizer", None) is not opt:
                raise ValueError(f"SequentialLR: schedulers[{i}] ({type(s).__name__}) belongs to another optimizer")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: expects one milestone fewer than schedulers, got {len(schedulers)} "
                             f"schedulers and {len(milestones)} milestones")
        self._closed = None
        self._schedulers, self._milestones = schedulers, milestones
        self.last_epoch = a["last_epoch"] + 1
        self.optimizer = opt
        for group in opt.param_groups:  # undo what the schedulers' construction did
            group["lr"] = group["initial_lr"]
        self._undo(self)
        idx = bisect.bisect_right(milestones, 0)
        schedulers[idx]._initial_step()
        self._last_lr = schedulers[idx].get_last_lr()

    def _undo(self, sched):
        if hasattr(sched, "_schedulers"):
            for s in sched._schedulers:
                self._undo(s)
        elif hasattr(sched, "last_epoch"):
            sched.last_epoch -= 1

    def step(self):
        self.last_epoch += 1
        idx = bisect.bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()
