"""The base of every module: Module (submodules, parameters, buffers, compilation, inference) and
_NativeModule (a layer implemented in the C++ core), with the argument checks the layers share.
The layers live in the sibling files and import from here; this file imports none of them.
"""
import contextlib
import functools
import inspect
import math
import numbers
import os
import weakref

import numpy as np

from .. import _core
from ..trace_state import _dtype_name, _tracing
from .inputs import _flatten_inputs, _is_list_data, _list_data, _nested_inputs, _unflatten_inputs
from .state import _compiled_roots, _ParameterState
from .parameter import _as_parameter, _default_float, _host_array

__all__ = ["Module"]


def _int_arg(owner, name, value):
    """A size or count argument as an int: a float (2.9) or a bool is refused rather than truncated,
    as torch.nn refuses it; numpy integers are ints."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{type(owner).__name__}: {name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _int_args(owner, **named):
    """_int_arg for several arguments, in order: ``a, b = _int_args(self, a=a, b=b)``."""
    values = tuple(_int_arg(owner, name, value) for name, value in named.items())
    return values if len(values) > 1 else values[0]


def _shaped_input(shape, dtype):
    """An uninitialised array of `shape` for memory_report, refused with the shape named when no machine
    could hold it (instead of numpy's own error)."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"memory_report: shape {shape} has a negative dimension")
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes >= 2 ** 63:
        raise ValueError(f"memory_report: an input of shape {shape} overflows a 64-bit byte count")
    # Refused before numpy is asked: a malloc of petabytes may abort (under a sanitizer) rather than fail.
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: let numpy decide
        memory = None
    if memory and nbytes > memory:
        raise ValueError(f"memory_report: an input of shape {shape} needs {nbytes} bytes, more than this "
                         f"machine's {memory} bytes of memory")
    try:
        return np.empty(shape, dtype=dtype)
    except (MemoryError, ValueError) as e:
        raise ValueError(f"memory_report: an input of shape {shape} ({nbytes} bytes) cannot be allocated "
                         f"on this machine: {e}") from None



def _bound_arguments(signature, module, args, kw):
    """A constructor's arguments by name, defaults included (tl.save describes a layer by them)."""
    try:
        bound = signature.bind(module, *args, **kw)
    except TypeError:  # the constructor itself refuses the call, with its own message
        return {}
    bound.apply_defaults()
    out = {}
    for name, value in list(bound.arguments.items())[1:]:
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            out[name] = value
    return out


class Module(_ParameterState):
    """Base class: holds submodules, parameters and buffers (set as attributes, or with
    register_buffer) and compiles into a model on first use."""

    _native_buffers = ()  # names of a native layer's parameters that torch calls buffers
    _is_child = False  # registered under another module: its parameters live in that module's model

    def __init__(self):
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_model", None)
        object.__setattr__(self, "training", True)

    def __init_subclass__(cls, **kwargs):
        # treadle's own modules take torch's factory keywords on every constructor: dtype as a torch
        # dtype, a numpy dtype or a name, and device="cpu" (a model's placement is its backend).
        super().__init_subclass__(**kwargs)
        own_init = cls.__dict__.get("__init__")
        if own_init is None or not cls.__module__.startswith("treadle."):
            return
        signature = inspect.signature(own_init)
        takes_device = "device" in signature.parameters

        @functools.wraps(own_init)
        def torch_factory_keywords(self, *args, **kw):
            if "dtype" in kw:
                kw["dtype"] = _dtype_name(kw["dtype"], cls.__name__)
            if not takes_device and "device" in kw:
                _check_cpu(kw.pop("device"), cls.__name__)
            if "_init_args" not in self.__dict__:  # the outermost constructor: what the user passed
                object.__setattr__(self, "_init_args", _bound_arguments(signature, self, args, kw))
            own_init(self, *args, **kw)

        cls.__init__ = torch_factory_keywords

    def train(self, mode=True):
        """Sets the mode flag of this module and every submodule (torch's train()); returns self.
        Eager calls on arrays (module(x)) need eval mode; a Trainer's steps always run in training
        mode and its evaluate/predict in eval mode, whatever the flag says."""
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self):
        """train(False): module(x) on arrays then runs inference, as predict does."""
        return self.train(False)

    def __setattr__(self, name, value):
        if isinstance(value, (Module, _core.Parameter)) and "_modules" not in self.__dict__:
            raise AttributeError("call super().__init__() before assigning submodules or parameters")
        param = _as_parameter(value)
        if param is not None:
            return self._set_parameter(name, param)
        if name in self.__dict__.get("_buffers", ()):
            return self._set_buffer(name, value)
        if name in self.__dict__.get("_parameters", ()) and value is not None:
            raise TypeError(f"cannot assign {type(value).__name__} as parameter '{name}' (a tl.nn.Parameter is "
                            f"expected; to change its values, write into it: self.{name}[...] = values)")
        if isinstance(value, Module):
            self._invalidate()
            self._modules[name] = value
            object.__setattr__(value, "_is_child", True)
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # Only reached when ordinary lookup fails: parameters and buffers are kept out of __dict__ so
        # that forward sees symbols while the model is traced, and numpy views otherwise.
        d = self.__dict__
        for store in (d.get("_parameters", {}), d.get("_buffers", {})):
            if name in store:
                p = store[name]
                if p is None:
                    return None
                graph = getattr(_tracing, "graph", None)
                return graph.parameter(p) if graph is not None else p.data
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _set_parameter(self, name, param):
        self._invalidate()
        old = self._parameters.get(name)
        if old is not None and old.packed and old is not param:
            raise RuntimeError(f"{type(self).__name__}.{name}: cannot replace a parameter of a compiled model; "
                               f"write into it instead (self.{name}[...] = values)")
        native = self.__dict__.get("_native")
        if native is not None and name in dict(native.named_parameters()):
            native.tie_parameter(name, param)  # a native layer's own parameter: tie it
            return
        self._buffers.pop(name, None)
        self.__dict__.pop(name, None)
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """State a module uses but does not train (torch's register_buffer): a causal mask, a
        positional table, running statistics. In forward, ``self.<name>`` is its symbol. Persistent
        buffers are in state_dict; all follow ``model.double()``. Stored as float32 (float64 for a
        float64 torch tensor), like parameters: the model keeps one floating dtype."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("call super().__init__() before register_buffer")
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"register_buffer: buffer name must be a non-empty string without '.', got {name!r}")
        if name in self.__dict__ or name in self._parameters or name in self._modules:
            raise KeyError(f"register_buffer: attribute '{name}' already exists")
        self._invalidate()
        self._buffers[name] = None if tensor is None else _core.Parameter(
            _host_array(tensor), False, _default_float(tensor, None))
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def _set_buffer(self, name, value):
        """self.<buffer> = array: a new value; once the buffer is in a compiled model's flat buffer,
        the values are copied in place (same shape)."""
        current = self._buffers[name]
        if current is not None and current.packed:
            if value is None or np.shape(_host_array(value)) != current.shape:
                raise ValueError(f"buffer '{name}' has shape {current.shape} in the compiled model; "
                                 f"assign an array of that shape, got {np.shape(_host_array(value))}")
            current.data[...] = _host_array(value)
            return
        self._buffers[name] = None if value is None else _core.Parameter(
            _host_array(value), False, _default_float(value, None))

    def forward(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def __call__(self, *inputs, **kwargs):
        # While a model is traced, each submodule records its ops under its name ("0", "encoder.fc1"),
        # so profiles and anomaly errors can say which module a node came from.
        graph, names = getattr(_tracing, "graph", None), getattr(_tracing, "names", None)
        if graph is None and any(isinstance(x, np.ndarray) or _is_list_data(x) for x in inputs):
            # Eager inference on arrays, through the cached inference plan (predict). A training-mode
            # forward (dropout, batch statistics) runs inside a Trainer step, so train mode refuses
            # instead of silently computing the eval-mode answer.
            if self.training:
                raise TypeError(f"{type(self).__name__}(x) on a numpy array runs inference: call .eval() first "
                                "(as torch code does before evaluating) or .predict(x); training-mode forwards "
                                "run inside a tl.Trainer step")
            if kwargs:
                raise TypeError(f"{type(self).__name__}(x) on arrays takes the inputs only, got {sorted(kwargs)}")
            return self.predict(inputs[0] if len(inputs) == 1 else list(inputs))
        name = names.get(id(self)) if names else None
        if not name:
            if graph is not None and names is not None and self.named_parameter_objects():
                raise ValueError(f"{type(self).__name__} is used in the forward but is not registered with the "
                                 "model, so its parameters are not the model's: assign it as an attribute "
                                 "(self.layer = ...) or keep it in a tl.nn.ModuleList or ModuleDict, not in a plain "
                                 "list or dict")
            return self.forward(*inputs, **kwargs)
        graph.push_scope(name)
        path = getattr(_tracing, "path", None)
        if path is not None:
            path.append(name)
        try:
            return self.forward(*inputs, **kwargs)
        except (ValueError, TypeError) as e:
            _name_the_module(e, path, self)
            raise
        finally:
            graph.pop_scope()
            if path:
                path.pop()

    def _scope_names(self):
        """id(submodule) -> its name under its parent (first name wins for a shared submodule)."""
        names, stack = {}, [self]
        while stack:
            module = stack.pop()
            for name, child in module._modules.items():
                if id(child) not in names and child is not self:
                    names[id(child)] = name
                    stack.append(child)
        return names

    # -- submodules (torch.nn.Module's names) ---------------------------------------------------
    def named_children(self):
        """(name, module) for each direct submodule, in registration order."""
        return iter(list(self._modules.items()))

    def children(self):
        return iter([m for _, m in self._modules.items()])

    def named_modules(self, prefix=""):
        """(name, module) for this module ("" or `prefix`) and every submodule below it, each once."""
        seen, out, stack = set(), [], [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            out.append((name, module))
            stack.extend(reversed([(f"{name}.{n}" if name else n, m) for n, m in module._modules.items()]))
        return iter(out)

    def modules(self):
        return iter([m for _, m in self.named_modules()])

    def apply(self, fn):
        """Calls fn on every submodule (children first, as torch does), then on this module; returns it."""
        for child in self._modules.values():
            child.apply(fn)
        fn(self)
        return self

    # -- compilation and inference ------------------------------------------------------------
    def _invalidate(self):
        if self.__dict__.get("_model") is not None:
            raise RuntimeError(f"{type(self).__name__}: cannot change submodules after the model was compiled")

    def _compiled(self):
        """The native model (flat parameter buffer + plan cache), created on first use."""
        if self._model is None:
            ref = weakref.ref(self)  # the native model must not keep this module alive

            def trace(graph, inputs):
                root = ref()
                keys = ("graph", "names", "path", "dtype")
                saved = [getattr(_tracing, k, None) for k in keys]
                # dtype: of constants a forward creates (tl.zeros) unless it names one
                values = (graph, root._scope_names(), [], root._model.dtype if root._model is not None else None)
                for k, v in zip(keys, values):
                    setattr(_tracing, k, v)
                try:
                    out = root.forward(*_unflatten_inputs(inputs, getattr(_tracing, "structure", None)))
                finally:
                    for k, v in zip(keys, saved):
                        setattr(_tracing, k, v)
                return _flatten_outputs(out)

            object.__setattr__(self, "_model", _core.Model(trace, self.named_parameter_objects()))
            _compiled_roots.add(self)
        return self._model

    def predict(self, x, out=None, context=None):
        """Inference (eval mode) on a numpy batch; safe to call from many threads at once.

        On backend "cuda", `x` and `out` may be CUDA arrays (CuPy, torch CUDA tensors): the batch is
        copied on the device, and the result written into `out` there (without `out`, a numpy array
        is returned)."""
        model = self._model  # the compiled model, looked up inline: this is the batch-1 hot path
        if model is None:
            model = self._compiled()
        if type(x) in (list, tuple):
            if _is_list_data(x):
                x = _list_data(x, model.dtype, "predict")
            elif _nested_inputs(x):  # forward(x, (h, c)): flat arrays in, the structure for the trace
                with _structured(x) as flat:
                    return model.predict(flat, context, out)
        return model.predict(x, context, out)

    def memory_report(self, x_shape, training=True, dtype=None):
        """Bytes this model needs for inputs of shape `x_shape` (a tuple, or a list of tuples for
        several inputs): {"parameters", "gradients", "optimizer_state" (0 here; see
        Trainer.memory_report), "activations" (the plan's arena), "total"}. Compiles the plan for
        that signature if new; reads no data. `dtype` defaults to the model's (give an integer
        dtype for index inputs).
        """
        shapes = x_shape if x_shape and isinstance(x_shape[0], (tuple, list)) else [x_shape]
        model = self._compiled()
        dtypes = dtype if isinstance(dtype, (tuple, list)) else [dtype] * len(shapes)
        xs = [_shaped_input(s, model.dtype if dt is None else dt) for s, dt in zip(shapes, dtypes)]
        return model.memory_report(xs, bool(training))

    def to(self, dtype):
        """Converts parameters to float32 or float64 (like torch's .float() / .double())."""
        self._compiled().to(dtype)
        return self

    def double(self):
        return self.to("float64")

    def float(self):
        return self.to("float32")

    @property
    def dtype(self):
        return self._compiled().dtype

    def set_backend(self, name):
        """Pins every plan to one backend ("eigen", ...; "cuda:1" names the device of a device backend);
        "auto": per node as the measured dispatch table says (treadle.dispatch); "" restores automatic
        dispatch in priority order."""
        self._compiled().set_backend(name)
        return self

    @property
    def deterministic(self):
        """Deterministic mode (off by default): plans skip kernels a backend marks non-deterministic,
        and backend "auto" uses the fixed priority order instead of the measured dispatch table, so
        runs with the same seed, data and executor chunking agree to the bit whatever the
        environment. Setting it drops compiled plans. See docs/hardening.md."""
        return self._compiled().deterministic

    @deterministic.setter
    def deterministic(self, on):
        self._compiled().deterministic = bool(on)

    @property
    def fusion(self):
        """Activation fusion (on by default): a Linear whose output only a ReLU, Tanh or Sigmoid
        reads applies that activation itself, as the epilogue of its product. Turn it off to run
        every node as traced (e.g. to see pre-activations under detect_anomaly). Setting it drops
        compiled plans."""
        return self._compiled().fusion

    @fusion.setter
    def fusion(self, on):
        self._compiled().fusion = bool(on)

    @property
    def plan_cache_limit(self):
        """Compiled plans kept (one per input signature and mode; 64 by default), the least recently
        used evicted first, so a host that feeds a new batch size every step stays within bounded
        memory. Each plan holds its kernels (oneDNN's JIT code included)."""
        return self._compiled().plan_cache_limit

    @plan_cache_limit.setter
    def plan_cache_limit(self, limit):
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1:
            raise ValueError(f"plan_cache_limit must be an integer >= 1, got {limit!r}")
        self._compiled().plan_cache_limit = int(limit)

    def set_precision(self, name):
        """Compute precision of the matrix products and convolutions: "float32" (default), "bf16" or
        "fp16" (operands rounded to bfloat16 or IEEE half, float32 accumulation; parameters stay
        float32). Float32 models only. Training in fp16 usually needs loss scaling
        (``tl.Trainer(..., loss_scale="dynamic")``)."""
        self._compiled().set_precision(name)
        return self

    def __repr__(self):
        if not self._modules:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"  ({n}): " + repr(m).replace("\n", "\n  ") for n, m in self._modules.items()]
        return f"{type(self).__name__}(\n" + "\n".join(lines) + "\n)"

    def extra_repr(self):
        return ""



def _check_cpu(device, owner):
    if device is not None and str(device) != "cpu":
        raise ValueError(f"{owner}: device={str(device)!r}: a module is built on the CPU; a model runs where its "
                         "backend does (model.set_backend(\"cuda\"))")


def _name_the_module(error, path, module):
    """Prefixes a trace-time error with the innermost module it came from, once:
    "module 'layers.2' (Linear(in_features=7, ...)): linear: expected input of shape (N, 7), got (3, 8)"."""
    if getattr(error, "_module_named", False) or not path or not error.args or not isinstance(error.args[0], str):
        return
    first = repr(module).splitlines()[0].rstrip("(")
    error.args = (f"module '{'.'.join(path)}' ({first}): {error.args[0]}",) + error.args[1:]
    error._module_named = True


@contextlib.contextmanager
def _structured(inputs):
    """The flat list of `inputs`' arrays; while inside, a trace on this thread rebuilds the nesting."""
    flat, structure = _flatten_inputs(inputs)
    saved = getattr(_tracing, "structure", None)
    _tracing.structure = structure
    try:
        yield flat
    finally:
        _tracing.structure = saved


def _flatten_outputs(out):
    """A forward's result as a flat list of symbols: (y, (h, c)) -> [y, h, c]; None entries dropped."""
    if isinstance(out, (tuple, list)):
        return [leaf for item in out for leaf in _flatten_outputs(item)]
    return [] if out is None else [out]


class _NativeModule(Module):
    """A layer implemented in the C++ core."""

    def __init_subclass__(cls, **kwargs):
        # A size the core refuses (an overflowing or absurd parameter shape) is named by the layer
        # that asked for it: "Linear(1, 4611686018427387904): Tensor: shape ... needs ...".
        super().__init_subclass__(**kwargs)
        own_init = cls.__dict__.get("__init__")
        if own_init is None:
            return

        @functools.wraps(own_init)
        def checked_init(self, *args, **kw):
            try:
                own_init(self, *args, **kw)
            except (ValueError, OverflowError, MemoryError) as e:
                if str(e).startswith(("Tensor:", "shape (")):  # the core's size checks
                    shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kw.items()])
                    raise type(e)(f"{type(self).__name__}({shown}): {e}") from None
                raise

        cls.__init__ = checked_init

    def __init__(self, native):
        super().__init__()
        object.__setattr__(self, "_native", native)

    def _own_parameters(self):
        return self._native.named_parameters() + super()._own_parameters()

    def forward(self, input):  # noqa: A002 (torch's keyword)
        x = input
        return self._native.forward(x)
