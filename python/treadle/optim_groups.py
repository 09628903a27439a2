"""Parameter groups of the optimizers (torch's ``param_groups``) and how their parameters are found.

A parameter here is what ``model.parameters()`` returns: a numpy view into the model's one flat
parameter buffer. An optimizer given parameters learns their names when a Trainer (or ``attach``)
binds it to the model: each view is matched by its data pointer and shape against the model's
layout (or, after the model repacked its buffer, e.g. ``model.double()``, by the parameter object the
view belongs to). The compiled optimizer then updates the flat buffer segment by segment with each
segment's group options, in one call.
"""
import math
import numbers

import numpy as np


def number(owner, what, value):
    """A hyper-parameter as a float: a real number, and finite (an infinite lr or eps would turn every
    parameter into NaN or Inf at the first update, far from the call that set it)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {what} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}: invalid {what} value: {value} (hyper-parameters must be finite)")
    return float(value)


def betas_pair(owner, betas):
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: betas must be a pair (beta1, beta2), got {betas!r}") from None
    return number(owner, "betas[0]", b1), number(owner, "betas[1]", b2)


def check_value(owner, key, value, default):
    """A group's value for `key`, checked like the constructor's argument of that name."""
    if isinstance(default, bool):
        if not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
            raise TypeError(f"{owner}: {key} must be a bool, got {value!r}")
        return bool(value)
    if key == "betas":
        return betas_pair(owner, value)
    if key == "lr":
        lr = number(owner, "lr", value)
        if lr < 0:
            raise ValueError(f"{owner}: invalid lr (learning rate) value: {lr} (must be >= 0)")
        return lr
    return number(owner, key, value)


def native_options(group, defaults):
    """A group's hyper-parameters under the compiled optimizer's names (betas as beta1, beta2)."""
    out = {}
    for key in defaults:
        value = group[key]
        if key == "betas":
            out["beta1"], out["beta2"] = float(value[0]), float(value[1])
        else:
            out[key] = float(value)
    return out


class ParamGroup(dict):
    """One entry of ``optimizer.param_groups``: a dict, as torch's. Setting "lr" (a schedule, or the
    user between steps) takes effect at the next update; other hyper-parameters may change too unless
    that would add or drop a state buffer (SGD's momentum from 0, amsgrad), which raises ValueError.
    Keys that are not hyper-parameters (a scheduler's "initial_lr", your own notes) are kept as is."""

    def __init__(self, optimizer, index, values):
        super().__init__(values)
        self._optimizer, self._index = optimizer, index

    def __getitem__(self, key):
        if key == "lr" and self._live():
            return self._optimizer._native.group_lr(self._index)
        return super().__getitem__(key)

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __setitem__(self, key, value):
        opt = self._optimizer
        owner = f"{type(opt).__name__}.param_groups[{self._index}]"
        if key == "params":
            raise ValueError(f"{owner}: 'params' is fixed when the optimizer is created; create a new optimizer")
        if key in opt.defaults:
            value = check_value(owner, key, value, opt.defaults[key])
            if self._live():
                if key == "betas":
                    opt._native.set_group_option(self._index, "beta1", value[0])
                    opt._native.set_group_option(self._index, "beta2", value[1])
                else:
                    opt._native.set_group_option(self._index, key, float(value))
        super().__setitem__(key, value)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def _live(self):
        native = getattr(self._optimizer, "_native", None)
        return native is not None and self._index < native.num_groups


def normalize_groups(owner, params, defaults):
    """torch's first argument (an iterable of parameters, or of dicts with "params" and per-group
    hyper-parameters) as a list of complete group dicts, checked: known keys, valid values, no
    parameter twice."""
    if isinstance(params, np.ndarray):
        raise TypeError(f"{owner}: params must be an iterable of parameters or of dicts, got one array; "
                        "pass model.parameters() or [array]")
    if isinstance(params, dict):
        params = [params]
    try:
        items = list(params)
    except TypeError:
        raise TypeError(f"{owner}: params must be an iterable of parameters or of dicts, got "
                        f"{type(params).__name__}") from None
    if not items:
        raise ValueError(f"{owner}: got an empty parameter list")
    raw = items if isinstance(items[0], dict) else [{"params": items}]
    groups, seen = [], {}
    for i, g in enumerate(raw):
        if not isinstance(g, dict):
            raise TypeError(f"{owner}: param_groups[{i}] must be a dict with 'params', got {type(g).__name__} "
                            "(do not mix dicts and parameters)")
        if "params" not in g:
            raise ValueError(f"{owner}: param_groups[{i}] has no 'params'")
        unknown = sorted(set(g) - set(defaults) - {"params"})
        if unknown:
            raise ValueError(f"{owner}: unknown key(s) {unknown} in param_groups[{i}] "
                             f"(known: params, {', '.join(defaults)})")
        plist = [g["params"]] if isinstance(g["params"], np.ndarray) else list(g["params"])
        for j, p in enumerate(plist):
            if not isinstance(p, np.ndarray):
                raise TypeError(f"{owner}: param_groups[{i}]['params'][{j}] must be a parameter (a numpy view from "
                                f"model.parameters()), got {type(p).__name__}")
            key = (p.__array_interface__["data"][0], p.shape, p.dtype.str)
            if key in seen:
                raise ValueError(f"{owner}: a parameter of shape {p.shape} appears in param_groups[{seen[key]}] and "
                                 f"param_groups[{i}]; a parameter belongs to at most one group")
            seen[key] = i
        group = {"params": plist}
        for k, default in defaults.items():
            group[k] = check_value(f"{owner}: param_groups[{i}]", k, g.get(k, default), default)
        groups.append(group)
    return groups


def parameter_names(owner, module, groups):
    """For each group, the names of its parameters in `module`'s layout (ValueError naming the first
    array that is not one of the module's parameters)."""
    model = module._compiled()
    flat = model.flat_parameters()
    base, size = flat.__array_interface__["data"][0], flat.dtype.itemsize
    by_offset = {int(offset): (name, tuple(shape)) for name, shape, offset in model.layout}
    by_object = {id(p): n for n, p in module.named_parameter_objects()}
    out = []
    for i, g in enumerate(groups):
        names = []
        for j, p in enumerate(g["params"]):
            name = None
            delta = p.__array_interface__["data"][0] - base
            if p.dtype == flat.dtype and delta % size == 0:
                hit = by_offset.get(delta // size)
                if hit is not None and hit[1] == tuple(p.shape):
                    name = hit[0]
            if name is None:  # a view of a parameter taken before the model repacked its buffer
                name = by_object.get(id(getattr(p, "base", None)))
            if name is None:
                raise ValueError(f"{owner}: param_groups[{i}]['params'][{j}] (shape {p.shape}, {p.dtype}) is not a "
                                 f"parameter of this {type(module).__name__}; pass model.parameters() (or views "
                                 "from named_parameters()) of the model the Trainer trains")
            names.append(name)
        out.append(names)
    return out
