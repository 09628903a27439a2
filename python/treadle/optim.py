"""Optimizers, learning-rate schedules and gradient clipping, named and parameterised like torch.optim.

Optimizers take torch's arguments: ``tl.optim.Adam(model.parameters(), lr=1e-3)``, or parameter
groups with their own hyper-parameters::

    opt = tl.optim.SGD([{"params": model.base.parameters()},
                        {"params": model.head.parameters(), "lr": 1e-3}], lr=1e-2, momentum=0.9)

A Trainer binds the optimizer to the model's one flat parameter buffer and runs one fused C++
update per step (formulas identical to torch.optim's), walking the buffer segment by segment with
each group's options. Parameters in no group are not updated (torch semantics). Without a parameter
list (keyword hyper-parameters only) every trainable parameter is in one group.
``optimizer.param_groups`` is a list of dicts as in torch: change a group's "lr" (or, where the
state allows, another hyper-parameter) between steps and the next update uses it.

Each object wraps its compiled counterpart in ``_native``; the trainer takes ``optimizer._native``.
Without a trainer, an optimizer can drive flat numpy buffers directly::

    opt = tl.optim.Adam(lr=1e-3).bind([("weight", (4, 3)), ("bias", (4,))], "float64")
    opt.step(params, grads)          # both 1-D float64 arrays of 16 elements; params updated in place

Schedules (``tl.optim.lr_scheduler``) come in torch's form, bound to an optimizer and stepped once
per epoch (``StepLR(opt, step_size=30)``, ``scheduler.step()``), and in a closed form for
``Trainer(schedule=...)`` (``StepLR(step_size=30)``, evaluated per optimizer update).
"""
import numbers
import sys

import numpy as np

from . import _core
from .optim_groups import ParamGroup, betas_pair, native_options, normalize_groups, number, parameter_names

_native = _core.optim
_number = number

__all__ = [
    "Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "RowWiseAdagrad", "ColumnWiseAdagrad",
    "Adadelta", "Adamax", "NAdam", "RAdam", "LBFGS",
    "LRSchedule", "LRScheduler", "ConstantLR", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
    "WarmupCosineLR", "LambdaLR", "LinearLR", "OneCycleLR", "ReduceLROnPlateau", "SequentialLR",
    "lr_scheduler", "schedule", "clip_grad_norm_", "clip_grad_norm", "clip_grad_value_",
]


class Optimizer:
    """Base of the Python optimizers: a thin wrapper around the compiled optimizer in ``_native``.

    ``params`` (torch's first argument) is None (every trainable parameter, one group), an iterable
    of parameters (``model.parameters()``) or of group dicts. The parameters' names are resolved when
    a Trainer is built with the optimizer (``attach``); a parameter of another model is a ValueError.
    Parameters in no group are not updated (torch semantics).
    """

    def __init__(self, native, defaults, params=None):
        self._native = native
        self.defaults = defaults
        self._module = None
        owner = type(self).__name__
        if params is None:
            self._groups = None
            self.param_groups = [ParamGroup(self, 0, {"params": [], **defaults})]
            return
        groups = normalize_groups(owner, params, defaults)
        self._groups = groups
        self.param_groups = [ParamGroup(self, i, g) for i, g in enumerate(groups)]
        # Checked now (unknown keys, invalid values); the names are filled in by attach().
        native.set_param_groups([([], native_options(g, defaults)) for g in groups])

    def attach(self, module):
        """Resolves the parameters to `module`'s names and sets the compiled optimizer's groups. Called
        by the Trainer; a second call with the same module does nothing."""
        if self._module is module:
            return self
        if self._module is not None and self._groups is not None:
            raise ValueError(f"{type(self).__name__}: this optimizer's parameter groups belong to another model; "
                             "create one optimizer per model")
        if self._groups is not None:
            names = parameter_names(type(self).__name__, module, self._groups)
            self._native.set_param_groups([(n, native_options(g, self.defaults))
                                           for n, g in zip(names, self._groups)])
        else:
            dict.__setitem__(self.param_groups[0], "params", list(module.parameters()))
        self._module = module
        return self

    @property
    def lr(self):
        """The learning rate of group 0 (the only group without parameter groups)."""
        return self._native.lr

    @lr.setter
    def lr(self, value):
        self.param_groups[0]["lr"] = value

    @property
    def step_count(self):
        """Updates made so far (torch's per-parameter ``state['step']``)."""
        return self._native.step_count

    def bind(self, slots, dtype):
        """Allocates state for flat buffers holding ``slots`` = [(name, shape), ...] back to back."""
        self._native.bind([(str(n), tuple(int(d) for d in s)) for n, s in slots], dtype)
        return self

    def step(self, params=None, grads=None, lr=None, closure=None):
        """One update. ``step(params, grads)`` updates the flat 1-D numpy buffer ``params`` in place from
        ``grads`` (``lr`` overrides every group's learning rate for this update). ``step()`` or
        ``step(closure)`` updates the attached model from its gradient buffer, as torch's
        ``optimizer.step()`` after the gradients were computed (e.g. by ``trainer.compute_gradients``);
        a closure is called first and its loss returned."""
        if callable(params):
            params, closure = None, params
        if params is not None:
            self._native.step(params, grads, lr)
            return None
        loss = closure() if closure is not None else None
        flat_p, flat_g = self._model_buffers()
        self._native.step(flat_p, flat_g, lr)
        return loss

    def zero_grad(self, set_to_none=True):
        """Zeroes the attached model's gradients (set_to_none is accepted for torch's signature)."""
        self._require_module("zero_grad")._compiled().zero_grad()

    def _require_module(self, what):
        if self._module is None:
            raise RuntimeError(f"{type(self).__name__}.{what}: the optimizer is not attached to a model; build a "
                               "Trainer with it (or call attach(model)) first")
        return self._module

    def _model_buffers(self):
        model = self._require_module("step")._compiled()
        self._native.bind_model(model)  # a no-op while a Trainer holds the optimizer (it bound it)
        n = self._native.numel
        return model.flat_parameters()[:n], model.flat_gradients()[:n]

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

    def state_dict(self):
        """torch's layout: {"state": state buffers by name (flat, empty before binding), "step": updates
        made, "param_groups": each group's hyper-parameters with "params" as indices}."""
        groups, index = [], 0
        for g in self.param_groups:
            saved = {k: g[k] for k in g if k != "params"}
            saved["params"] = list(range(index, index + len(g["params"])))
            index += len(g["params"])
            groups.append(saved)
        return {"state": self.state() if self._native.bound else {}, "step": self.step_count, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Restores what state_dict() returned for an optimizer with the same groups: state buffers, step
        count and every group's hyper-parameters (ValueError, before anything changes, if the groups or
        the buffers differ)."""
        groups = list(state_dict["param_groups"])
        if len(groups) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(groups, self.param_groups)):
            raise ValueError(f"{type(self).__name__}.load_state_dict: the saved parameter groups "
                             f"({[len(s['params']) for s in groups]} parameters) differ from this optimizer's "
                             f"({[len(g['params']) for g in self.param_groups]})")
        if state_dict["state"]:
            if self._module is not None:  # attached but not stepped yet: its buffers are the model's
                self._native.bind_model(self._module._compiled())
            self.load_state(state_dict["state"], state_dict["step"])
        for g, saved in zip(self.param_groups, groups):
            for key, value in saved.items():
                if key != "params":
                    g[key] = value

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.defaults.items())
        return f"{type(self).__name__}({args})"


def _arguments(cls_name, args, kwargs, names):
    """torch's positional form: (params, then the hyper-parameters in torch's order); returns params and
    the hyper-parameters as keywords."""
    if len(args) > 1 + len(names):
        raise TypeError(f"{cls_name}: takes at most {1 + len(names)} positional arguments, got {len(args)}")
    params = args[0] if args else kwargs.pop("params", None)
    for name, value in zip(names, args[1:]):
        if name in kwargs:
            raise TypeError(f"{cls_name}: got multiple values for argument '{name}'")
        kwargs[name] = value
    return params, kwargs


def _torch_implementation_flags(cls_name, kwargs):
    """torch's choices of implementation (foreach, fused, capturable, differentiable) are accepted and
    have nothing to choose here: the update is always one fused pass. maximize=True is refused."""
    for key in ("foreach", "fused", "capturable", "differentiable"):
        kwargs.pop(key, None)
    if kwargs.pop("maximize", False):
        raise ValueError(f"{cls_name}: maximize=True is not supported; minimise the negated objective instead")


class _Fused(Optimizer):
    """An optimizer whose update is one compiled fused pass. Subclasses give torch's hyper-parameter
    names and defaults (`_defaults`, in torch's positional order) and the compiled factory."""

    _defaults = {}

    def __init__(self, *args, **kwargs):
        n = type(self).__name__
        params, kwargs = _arguments(n, args, dict(kwargs), list(self._defaults))
        _torch_implementation_flags(n, kwargs)
        unknown = sorted(set(kwargs) - set(self._defaults))
        if unknown:
            raise TypeError(f"{n}: unexpected argument(s) {unknown} (known: params, {', '.join(self._defaults)})")
        d = {}
        for key, default in self._defaults.items():
            value = kwargs.get(key, default)
            if isinstance(default, bool):
                d[key] = bool(value)
            elif key == "betas":
                d[key] = betas_pair(n, value)
            else:
                d[key] = number(n, key, value)
        native_kwargs = {k: v for k, v in d.items() if k != "betas"}
        if "betas" in d:
            native_kwargs["beta1"], native_kwargs["beta2"] = d["betas"]
        super().__init__(self._factory(**native_kwargs), d, params)


class SGD(_Fused):
    """Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""

    _factory = staticmethod(_native.sgd)
    _defaults = dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)


class Adam(_Fused):
    """Adam (optionally AMSGrad); weight_decay is added to the gradient (L2), as in torch.optim.Adam."""

    _factory = staticmethod(_native.adam)
    _defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False)


class AdamW(_Fused):
    """Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam step."""

    _factory = staticmethod(_native.adamw)
    _defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False)


class RMSprop(_Fused):
    """RMSprop, optionally with momentum and centered (variance-normalised) updates."""

    _factory = staticmethod(_native.rmsprop)
    _defaults = dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False)


class Adagrad(_Fused):
    """AdaGrad with learning-rate decay lr / (1 + (t - 1) * lr_decay) and an initial accumulator value.

    As in torch, every accumulator starts at the constructor's initial_accumulator_value; a parameter
    group's own value is accepted and ignored."""

    _factory = staticmethod(_native.adagrad)
    _defaults = dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10)


class RowWiseAdagrad(Adagrad):
    """AdaGrad with one accumulator per row of each 2-D parameter (fed by the row's mean squared gradient).

    Parameters that are not 2-D are updated exactly as by Adagrad. The state "sum" is compact: per slot,
    R entries for an (R, C) matrix, numel entries otherwise. Parameter groups are not supported.
    """

    _factory = staticmethod(_native.rowwise_adagrad)


class ColumnWiseAdagrad(Adagrad):
    """AdaGrad with one accumulator per column of each 2-D parameter; see RowWiseAdagrad."""

    _factory = staticmethod(_native.columnwise_adagrad)


class Adadelta(_Fused):
    """Adadelta (torch.optim.Adadelta): RMS of updates over RMS of gradients, scaled by lr."""

    _factory = staticmethod(_native.adadelta)
    _defaults = dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0)


class Adamax(_Fused):
    """Adamax (torch.optim.Adamax): Adam with an infinity-norm second moment."""

    _factory = staticmethod(_native.adamax)
    _defaults = dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


class NAdam(_Fused):
    """NAdam (torch.optim.NAdam): Adam with Nesterov momentum and torch's momentum_decay schedule.

    torch keeps the product of momentum factors (mu_product) as a scalar of its default dtype; here it
    is kept in the parameters' dtype, so float64 runs match torch under torch.set_default_dtype(float64).
    """

    _factory = staticmethod(_native.nadam)
    _defaults = dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                     decoupled_weight_decay=False)


class RAdam(_Fused):
    """RAdam (torch.optim.RAdam): Adam whose adaptive term is rectified once the variance estimate is
    reliable (rho_t > 5), plain momentum SGD before that."""

    _factory = staticmethod(_native.radam)
    _defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False)


def clip_grad_norm_(grads, max_norm):
    """Scales the flat 1-D gradient buffer ``grads`` in place so its L2 norm is at most ``max_norm``.

    Same rule as torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), capped at 1);
    returns the norm before clipping.
    """
    if isinstance(grads, np.ndarray):
        _refuse_parameters(grads, "clip_grad_norm_")
    return _native.clip_grad_norm(grads, float(max_norm))


def _refuse_parameters(array, what):
    """A parameter view given where gradients are expected would clip the weights themselves: torch's
    form (parameters in, their gradients clipped) is tl.nn.utils'."""
    if isinstance(array.base, _core.Parameter):
        raise TypeError(f"{what}: got a parameter, not a gradient buffer; for torch's form "
                        f"{what}(model.parameters(), ...) use tl.nn.utils.{what}")


clip_grad_norm = clip_grad_norm_


def clip_grad_value_(grads, clip_value):
    """Clamps every gradient to [-clip_value, clip_value] in place, as torch.nn.utils.clip_grad_value_.

    ``grads`` is a flat gradient buffer (``model.flat_gradients()``), one array, or an iterable of arrays
    (``model.named_gradients().values()``); arrays are written in place (one vectorised pass each)."""
    value = number("clip_grad_value_", "clip_value", clip_value)
    arrays = [grads] if isinstance(grads, np.ndarray) else list(grads)
    for g in arrays:
        if not isinstance(g, np.ndarray):
            raise TypeError(f"clip_grad_value_: expected numpy gradient arrays, got {type(g).__name__}")
        _refuse_parameters(g, "clip_grad_value_")
        if not g.flags.writeable:
            raise ValueError("clip_grad_value_: the gradient array is read-only (it is clipped in place)")
        np.clip(g, -value, value, out=g)


from . import optim_lr_scheduler as lr_scheduler  # noqa: E402
from .optim_lbfgs import LBFGS  # noqa: E402,F401
from .optim_lr_scheduler import (  # noqa: E402,F401
    ConstantLR, CosineAnnealingLR, ExponentialLR, LambdaLR, LinearLR, LRSchedule, LRScheduler, MultiStepLR,
    OneCycleLR, ReduceLROnPlateau, SequentialLR, StepLR, WarmupCosineLR)

# `tl.optim.lr_scheduler.StepLR` (torch's spelling) and `tl.optim.schedule.StepLR` both work, and so
# does `from treadle.optim.lr_scheduler import StepLR`.
sys.modules[__name__ + ".lr_scheduler"] = lr_scheduler
schedule = lr_scheduler
