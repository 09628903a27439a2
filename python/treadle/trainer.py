"""Training driven by the host: one call per step, or the phases separately."""
import warnings
from typing import NamedTuple

import numpy as np

from . import _core
from . import loss as _loss
from .nn import _is_list_data, _list_data, _nested_inputs, _structured

_SEQUENCES = (list, tuple)  # data given as nested lists of numbers (copied once; see Trainer._listed)


def _require(obj, attribute, name, expected):
    """TypeError naming the argument and what it must be, instead of an AttributeError later."""
    if obj is None or not hasattr(obj, attribute):
        raise TypeError(f"Trainer: {name} must be {expected}, got {type(obj).__name__}")


class StepResult(NamedTuple):
    """What `step(x, y, return_outputs=True)` returns: the loss, the model's output as that step
    computed it (an array, or a tuple for a model with several outputs), and the named values the
    loss function returned next to its loss (`return loss, {"kl": kl}`), as arrays."""

    loss: float
    outputs: object
    values: dict


def _step_result(raw):
    loss, outputs, values = raw
    return StepResult(loss, outputs[0] if len(outputs) == 1 else tuple(outputs), values)


class Trainer:
    """A model, a loss and an optimizer, stepped from the host's own loop.

    `step(x, y)` runs zero_grad + forward + loss + backward + update in one C++ call with the GIL
    released. For an external scheduler the phases are separate: `forward`, `backward` (from a
    host-computed output gradient, optionally returning the input gradient), `compute_gradients`,
    `zero_grad` and `update`, so the host can interleave its own work (e.g. an allreduce). Finer
    still, `begin_step` hands the step out as per-module tasks with dependencies, for a task
    scheduler (examples/python_scheduler.py).

    Guards (all off by default; docs/hardening.md): `check_finite` rejects NaN/Inf data,
    `skip_nonfinite` skips updates whose loss or gradient norm is not finite (`skipped_steps`),
    `verify_parameters` checksums the parameters between updates and raises RuntimeError naming
    tensors changed outside an update, `memory_budget` (bytes) refuses an input signature whose
    parameters + gradients + optimizer state + activations exceed it, and `detect_anomaly` names the
    first node that produces NaN/Inf.

    Loss scaling for mixed precision (`model.set_precision("fp16")`; docs/hardening.md), as
    torch.amp.GradScaler: `loss_scale=None` (default) is off; a number is a fixed scale;
    "dynamic" starts at 65536, halves the scale after a step with a non-finite gradient (which is
    skipped: parameters and optimizer state untouched, counted in `skipped_steps`) and doubles it
    after 2000 consecutive good steps; a dict such as {"init_scale": 1024.0, "growth_factor": 2.0,
    "backoff_factor": 0.5, "growth_interval": 100} sets those numbers of a dynamic scale. The backward
    pass is seeded with the scale and `update` unscales the gradients before clipping; `step`
    returns the unscaled loss, and `loss_scale` is the current scale (1.0 when off). Checkpoints keep
    the dynamic scale.

    With backend "cuda" (a build with CUDA; docs/cuda.md) the step runs on the GPU, and
    `cuda_graph=True` captures it once per input signature and replays it. Inputs and targets may
    then also be CUDA arrays (CuPy, torch CUDA tensors: anything with `__cuda_array_interface__`),
    copied on the device instead of uploaded; a CPU model refuses them with TypeError.
    """

    def __init__(self, model, loss, optimizer, schedule=None, clip_grad_norm=None, check_finite=False, seed=0,
                 executor=None, skip_nonfinite=False, verify_parameters=False, memory_budget=None,
                 detect_anomaly=False, cuda_graph=False, loss_scale=None):
        _require(model, "_compiled", "model", "a treadle module (tl.nn.Module, tl.nn.Sequential, ...)")
        if callable(loss) and not hasattr(loss, "_native"):
            loss = _loss.Custom(loss)  # a plain function: fn(output, target) -> 0-d symbol
        _require(loss, "_native", "loss", "a treadle loss such as tl.loss.MSE() or a function fn(output, target)")
        _require(optimizer, "_native", "optimizer", "a treadle optimizer such as tl.optim.Adam(lr=1e-3)")
        options = _core.TrainerOptions()
        options.loss_scaling = _loss_scaling(loss_scale)
        if cuda_graph:
            if not hasattr(options, "cuda_graph"):
                raise ValueError("Trainer: cuda_graph=True needs a build with the CUDA backend "
                                 "(configure with -DTREADLE_WITH_CUDA=ON); this build has "
                                 f"{', '.join(_core.backends())}")
            options.cuda_graph = True
        if clip_grad_norm is not None:
            if not np.isfinite(clip_grad_norm) or clip_grad_norm <= 0:
                raise ValueError(f"Trainer: clip_grad_norm must be positive and finite, got {clip_grad_norm}")
            options.clip_grad_norm = float(clip_grad_norm)
        options.check_finite = bool(check_finite)
        options.skip_nonfinite = bool(skip_nonfinite)
        options.verify_parameters = bool(verify_parameters)
        if memory_budget is not None:
            if int(memory_budget) <= 0:
                raise ValueError(f"Trainer: memory_budget must be a positive number of bytes, got {memory_budget}")
            options.memory_budget = int(memory_budget)
        if hasattr(optimizer, "attach"):  # an optimizer given parameters learns their names in this model
            optimizer.attach(model)
        self.model, self.loss, self._optimizer, self.schedule = model, loss, optimizer, schedule
        self.executor = executor  # a tl.PoolExecutor lending the host's workers, or None (calling thread only)
        self._native = _core.Trainer(model._compiled(), loss._native, optimizer._native, options, int(seed), executor)
        if schedule is not None:
            self._native.set_schedule(schedule._native)
        self.detect_anomaly = detect_anomaly

    @property
    def optimizer(self):
        """The optimizer, its state current: with backend "cuda" the state is first copied back from
        the device (and uploaded again before the next update, since the caller may change it)."""
        self._native.optimizer_to_host()
        return self._optimizer

    def step(self, x, y, return_outputs=False):
        """One training step on a batch; returns the loss (float). return_outputs=True returns a
        StepResult (loss, outputs, values) instead: the model's outputs from this very step (its
        dropout and noise; no second forward) and the named values the loss returned."""
        if type(x) in _SEQUENCES or type(y) in _SEQUENCES:
            return self._from_sequences(self._native.step, x, y, return_outputs, "step")
        if return_outputs:
            return _step_result(self._native.step(x, y, True))
        return self._native.step(x, y)

    def compute_gradients(self, x, y, return_outputs=False):
        """Forward + loss + backward, adding into the gradients (no update); returns the loss (a
        StepResult with return_outputs=True, as `step`)."""
        if type(x) in _SEQUENCES or type(y) in _SEQUENCES:
            return self._from_sequences(self._native.compute_gradients, x, y, return_outputs, "compute_gradients")
        if return_outputs:
            return _step_result(self._native.compute_gradients(x, y, True))
        return self._native.compute_gradients(x, y)

    def evaluate(self, x, y, return_outputs=False):
        """The loss in eval mode (no dropout), touching neither gradients nor parameters (a
        StepResult with return_outputs=True, as `step`)."""
        if type(x) in _SEQUENCES or type(y) in _SEQUENCES:
            return self._from_sequences(self._native.evaluate, x, y, return_outputs, "evaluate")
        if return_outputs:
            return _step_result(self._native.evaluate(x, y, True))
        return self._native.evaluate(x, y)

    def _from_sequences(self, call, x, y, return_outputs, what):
        """step/compute_gradients/evaluate when x or y is a sequence: nested lists of numbers are
        data (copied once; floats in the model's dtype, integers int64); inputs nested in tuples
        (forward(data, (h, c))) go in flat, and the trace rebuilds the nesting."""
        dtype = self.model.dtype
        x, y = (_list_data(a, dtype, what) if _is_list_data(a) else a for a in (x, y))
        args = (True,) if return_outputs else ()
        if type(x) in _SEQUENCES and _nested_inputs(x):
            with _structured(x) as flat:
                result = call(flat, y, *args)
        else:
            result = call(x, y, *args)
        return _step_result(result) if return_outputs else result

    def forward(self, x, input_grad=False):
        """Training-mode forward; keeps activations for one `backward`. Returns the output (a tuple
        of them for a model with several outputs)."""
        if type(x) in _SEQUENCES and _nested_inputs(x):
            with _structured(x) as flat:
                return self._native.forward(flat, input_grad)
        return self._native.forward(x, input_grad)

    def backward(self, grad_output, input_grad=False):
        """Adds dL/dparams for dL/d(output) = grad_output; returns dL/d(input) if input_grad. A
        model with several outputs takes a tuple with one gradient per output (None where the loss
        does not depend on that output)."""
        if isinstance(grad_output, list) and grad_output and all(
                g is None or hasattr(g, "__array_interface__") or hasattr(g, "__cuda_array_interface__")
                for g in grad_output):
            grad_output = tuple(grad_output)  # a list of arrays: one per output
        return self._native.backward(grad_output, input_grad)

    def zero_grad(self):
        self._native.zero_grad()

    def update(self):
        """Gradient clipping (if set) and one optimizer step at the scheduled learning rate. With
        loss scaling the gradients are unscaled first, and a non-finite one skips the step."""
        self._native.update()

    def begin_step(self, x, y, depth=1):
        """Starts a training step handed out as tasks, for a host scheduler.

        Zeroes the gradients, checks and copies the batch, and returns the step's tasks: one per
        module (the first `depth` components of its path) and pass ("forward fc1", "loss",
        "backward fc1"), each with `deps` (indices of tasks that must finish first), `params` (the
        trainable parameters whose gradients are final once it has run) and `grad_ranges`
        (their [start, stop) element ranges in `model.flat_gradients()`). Run each with
        `run_task(i)` once its dependencies are done (from any thread; the GIL is released), then
        `finish_step()`. Any order that respects `deps` gives bitwise the result of `step(x, y)`.
        """
        return list(self._native.begin_step(x, y, int(depth)))

    def run_task(self, index):
        """Runs task `index` of the step begun by `begin_step`."""
        self._native.run_task(int(index))

    def finish_step(self):
        """After every task has run: clipping and the optimizer update, as in `step`; returns the loss."""
        return self._native.finish_step()

    @property
    def lr(self):
        """The learning rate the next update will use."""
        return self._native.lr

    @property
    def steps(self):
        """Number of updates so far."""
        return self._native.steps

    @property
    def context(self):
        return self._native.context

    @property
    def detect_anomaly(self):
        """Anomaly mode: every node's outputs are checked for NaN/Inf after its kernel, and the
        first offender raises ValueError naming its op, module scope, shape and pass. Slow; for
        debugging."""
        return self._native.context.check_numerics

    @detect_anomaly.setter
    def detect_anomaly(self, on):
        self._native.context.check_numerics = bool(on)

    @property
    def skipped_steps(self):
        """Updates skipped because the loss or gradient norm was not finite (skip_nonfinite=True) or
        a scaled gradient was not finite (loss_scale)."""
        return self._native.skipped_steps

    @property
    def loss_scale(self):
        """The loss scale the next backward pass is seeded with (1.0 without loss scaling)."""
        return self._native.loss_scale

    def reseal_parameters(self):
        """With verify_parameters=True: accept the current parameters as intended after writing them
        deliberately (loading a checkpoint, editing weights); otherwise the next step raises."""
        self._native.reseal_parameters()

    def memory_report(self, x_shape, y_shape, y_dtype=None):
        """Bytes a training step on batches of these shapes needs: {"parameters", "gradients",
        "optimizer_state", "activations", "total"}. Compiles the plan if new; reads no data."""
        return self._native.memory_report(list(x_shape), list(y_shape), y_dtype)

    def fit(self, x, y, epochs=1, batch_size=32, shuffle=True, validation=None, progress=False, seed=0,
            callback=None):
        """Mini-batch training over arrays; returns {"loss": [...], "val_loss": [...]} per epoch.

        Each batch is one `step`. `validation=(x_val, y_val)` is evaluated after every epoch.
        `progress=True` shows a tqdm bar (the `progress` extra). `callback(epoch, logs)` is called
        after every epoch; returning True stops training. Floating-point data of another precision
        than the model's (float64 arrays for a float32 model, numpy's default) is cast once for the
        whole run, with a warning; `step` never casts (it refuses and names the fix).
        """
        x, y = _model_precision(self.model, x, "x"), _model_precision(self.model, y, "y")
        n = len(x)
        if len(y) != n:
            raise ValueError(f"fit: x has {n} samples but y has {len(y)}")
        if n == 0:
            raise ValueError("fit: no samples")
        if batch_size <= 0 or epochs < 0:
            raise ValueError(f"fit: batch_size must be positive and epochs >= 0, got {batch_size}, {epochs}")
        if validation is not None:  # checked before the first step: a refusal leaves the model untouched
            if isinstance(validation, (tuple, list)) and len(validation) == 2:
                validation = (_model_precision(self.model, validation[0], "validation x"),
                              _model_precision(self.model, validation[1], "validation y"))
            validation = _validation_pair(validation, x, y)
        rng = np.random.default_rng(seed)
        history = {"loss": [], "val_loss": []}
        bar = _progress_bar(epochs * ((n + batch_size - 1) // batch_size)) if progress else None
        for epoch in range(epochs):
            order = rng.permutation(n) if shuffle else np.arange(n)
            total, count = 0.0, 0
            for start in range(0, n, batch_size):
                idx = order[start:start + batch_size]
                loss = self.step(x[idx], y[idx])
                total += loss * len(idx)
                count += len(idx)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.4g}")
            history["loss"].append(total / count)
            if validation is not None:
                history["val_loss"].append(self.evaluate(*validation))
            if callback is not None and callback(epoch, {k: v[-1] for k, v in history.items() if v}):
                break
        if bar is not None:
            bar.close()
        return history


def _model_precision(model, a, name):
    """`a` as a C-contiguous array; floating-point data cast to the model's float dtype, with a warning."""
    a = np.ascontiguousarray(a)
    want = getattr(model, "dtype", None)
    if want in ("float32", "float64") and np.issubdtype(a.dtype, np.floating) and a.dtype != want:
        warnings.warn(f"fit: casting {name} from {a.dtype} to the model's {want} once for the whole run "
                      f"(pass {want} data to skip the copy; step() never casts)", stacklevel=3)
        a = a.astype(want)
    return a


def _validation_pair(validation, x, y):
    """fit's validation=(x_val, y_val) as contiguous arrays, refused (ValueError) unless it matches the
    training data in per-sample shape and dtype and has samples."""
    if not isinstance(validation, (tuple, list)) or len(validation) != 2:
        raise ValueError(f"fit: validation must be a pair (x_val, y_val), got {type(validation).__name__}")
    xv, yv = (np.ascontiguousarray(a) for a in validation)
    if len(xv) == 0 or len(xv) != len(yv):
        raise ValueError(f"fit: validation needs as many targets as samples (at least one), got {len(xv)} and {len(yv)}")
    for name, got, want in (("x", xv, x), ("y", yv, y)):
        if got.shape[1:] != want.shape[1:] or got.dtype != want.dtype:
            raise ValueError(f"fit: validation {name} must be {want.dtype} samples of shape {want.shape[1:]} like the "
                             f"training {name}, got {got.dtype} of shape {got.shape[1:]}")
    return xv, yv


_LOSS_SCALE_KEYS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


def _loss_scaling(loss_scale):
    """TrainerOptions.loss_scaling from Trainer's loss_scale argument (values checked in C++)."""
    o = _core.LossScaling()
    if loss_scale is None:
        return o
    if isinstance(loss_scale, str):
        if loss_scale != "dynamic":
            raise ValueError(f"Trainer: loss_scale must be None, a number, 'dynamic' or a dict, got {loss_scale!r}")
        o.mode = "dynamic"
        return o
    if isinstance(loss_scale, dict):
        unknown = sorted(set(loss_scale) - set(_LOSS_SCALE_KEYS))
        if unknown:
            raise ValueError(f"Trainer: unknown loss_scale key(s) {unknown} (expected {', '.join(_LOSS_SCALE_KEYS)})")
        o.mode = "dynamic"
        for key, value in loss_scale.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"Trainer: loss_scale['{key}'] must be a number, got {value!r}")
            if key == "growth_interval" and int(value) != value:
                raise ValueError(f"Trainer: loss_scale['growth_interval'] must be an integer, got {value!r}")
            setattr(o, key, int(value) if key == "growth_interval" else float(value))
        return o
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float, np.integer, np.floating)):
        raise ValueError(f"Trainer: loss_scale must be None, a number, 'dynamic' or a dict, got {loss_scale!r}")
    o.mode, o.init_scale = "fixed", float(loss_scale)
    return o


def _progress_bar(total):
    try:
        from tqdm import tqdm
    except ImportError as e:  # an optional extra
        raise ImportError("fit(progress=True) needs tqdm: pip install 'treadle[progress]'") from e
    return tqdm(total=total, unit="step")
