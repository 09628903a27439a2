"""Files: models, training checkpoints, safetensors, PyTorch interchange and ONNX export.

Everything is written by the C++ core in the safetensors format (readable by the `safetensors`
package and PyTorch tools), atomically (temporary file, fsync, rename) and with a checksum that is
verified on load. A corrupt, truncated or mismatched file raises ValueError and changes nothing.

- ``tl.save(model, path)`` / ``tl.load(path)``: weights plus an architecture description, so that
  ``tl.load`` returns a ready model. ``tl.load(path, model=net)`` loads weights into an existing
  model (needed for custom Module subclasses, which cannot be rebuilt from a file).
- ``tl.save_checkpoint(path, trainer)`` / ``tl.load_checkpoint(path, trainer)``: parameters,
  optimizer state and step count (which drives the schedule), base lr and the dropout RNG state;
  a resumed run continues bit for bit.
- ``save_file`` / ``load_file``: plain dicts of arrays.
- ``from_torch`` / ``to_torch_state_dict``: PyTorch state_dicts (same names and layouts).
- ``export_onnx``: feed-forward models to ONNX.

Architecture descriptions (``{"format": "treadle-architecture/1", "model": node}``) are read, checked
and written by the C++ core (cpp/include/treadle/architecture.hpp): the layer types, their
keys, defaults and checks live there once, for this package and the C API alike. This module walks
the tl.nn tree, hands each layer's constructor arguments to the core, and makes tl.nn objects from
the checked configurations the core returns. Layers plug in through ``register_layer(cls,
config=None)``.
"""
import json
import os

import numpy as np

from . import _core, nn

__all__ = [
    "save", "load", "save_checkpoint", "load_checkpoint", "save_file", "load_file", "read_metadata",
    "describe", "build", "register_layer", "from_torch", "to_torch_state_dict", "export_onnx", "register_onnx",
]

_ARCH_KEY = "treadle.architecture"
_CLASS_KEY = "treadle.module_class"

# -- architecture descriptions ----------------------------------------------------------------

_LAYERS = {}  # registered type name -> (class, config function: module -> constructor kwargs)


def register_layer(cls, config=None, name=None):
    """Lets ``tl.save`` describe instances of ``cls`` and ``tl.load`` rebuild them as ``cls(**config(m))``.

    ``config(module)`` returns the constructor's keyword arguments (JSON values); by default the
    class's own ``config()`` method. Only instances of exactly ``cls`` match (a subclass with its own
    forward is a different layer). Usable as a class decorator.
    """
    if config is None:
        if not callable(getattr(cls, "config", None)):
            raise TypeError(f"register_layer: {cls.__name__} has no config() method; pass config=fn(module) -> kwargs")
        config = cls.config
    name = name or cls.__name__
    if name == "Sequential" or name in _core.architecture_types():
        raise ValueError(f"register_layer: '{name}' is built in")
    _LAYERS[name] = (cls, config)
    return cls


def _builtin_class(name):
    """The tl.nn class that a built-in layer type name denotes (None if it is none)."""
    if name == "ProjectedLSTM":  # tl.nn.LSTM(proj_size > 0) builds it
        from .nn.lstm_projected import ProjectedLSTM
        return ProjectedLSTM
    cls = getattr(nn, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


def _arguments(module):
    """A layer's constructor arguments: its config() where it has one, else those it was made with."""
    config = getattr(module, "config", None)
    return dict(config()) if callable(config) else dict(getattr(module, "_init_args", {}))


def _layer_tree(module):
    """The module tree as the core's describe takes it: a list for a Sequential, else (type, class
    name, registered, constructor arguments); type is None for a class the format cannot name."""
    cls = type(module)
    if cls is nn.Sequential:
        return [_layer_tree(m) for m in module._modules.values()]
    class_name = f"{cls.__module__}.{cls.__qualname__}"
    for name, (c, config) in _LAYERS.items():
        if c is cls:
            return name, class_name, True, dict(config(module))
    if _builtin_class(cls.__name__) is not cls:
        return None, class_name, False, {}
    try:
        arguments = _arguments(module)
    except ValueError as e:  # a layer that cannot say how it was made (a custom encoder)
        raise ValueError(f"describe: {e}") from None
    return cls.__name__, class_name, False, arguments


def describe(model):
    """The architecture description of ``model`` (a dict), or ValueError for custom modules."""
    return json.loads(_core.architecture_describe(_layer_tree(model)))


def _make(node):
    if isinstance(node, list):
        return nn.Sequential(*[_make(n) for n in node])
    kind, config, where = node
    cls = _LAYERS[kind][0] if kind in _LAYERS else _builtin_class(kind)
    try:
        return cls(**config)
    except (TypeError, ValueError) as e:
        raise ValueError(f"build: cannot construct {kind} at {where} from {config}: {e}") from None


def build(description):
    """A fresh model (new parameters) from an architecture description (dict or JSON string)."""
    return _make(_core.architecture_parse(description, list(_LAYERS)))


# -- model files and checkpoints ----------------------------------------------------------------

def _user_metadata(metadata, who):
    out = {}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{who}: metadata keys and values must be strings, got {k!r}: {v!r}")
        if k.startswith("treadle."):
            raise ValueError(f"{who}: metadata keys starting with 'treadle.' are reserved, got {k!r}")
        out[k] = v
    return out


def _model_metadata(model, metadata, who):
    if not isinstance(model, nn.Module):
        raise TypeError(f"{who}: expected a treadle Module, got {type(model).__name__}")
    meta = _user_metadata(metadata, who)
    try:
        meta[_ARCH_KEY] = _core.architecture_describe(_layer_tree(model))
    except ValueError:
        meta[_CLASS_KEY] = f"{type(model).__module__}.{type(model).__qualname__}"
    return meta


def _only_user(meta):
    return {k: v for k, v in meta.items() if not k.startswith("treadle.")}


def save(model, path, metadata=None):
    """Writes the model's parameters, dtype and architecture to a safetensors file (atomically).

    ``metadata``: extra {str: str} entries (keys may not start with "treadle."). Custom Module
    subclasses are saved too (weights only); load them with ``tl.load(path, model=net)``.
    """
    meta = _model_metadata(model, metadata, "save")
    _core.save_model(os.fspath(path), model._compiled(), meta)


_BUILD_SLACK_BYTES = 16 << 20  # temporaries of the layers' initialisation


def load(path, model=None):
    """The model saved at ``path``; with ``model=net``, loads the weights into ``net`` and returns it.

    Works with files from ``tl.save``, ``tl.save_checkpoint`` and, given ``model``, any safetensors
    file with the model's parameter names and shapes (e.g. ``safetensors.torch.save_file`` of a torch
    state_dict). The file is fully checked (format, checksum, names, shapes, dtypes) before anything
    is written: on ValueError the model is unchanged.
    """
    path = os.fspath(path)
    if model is not None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"load: model must be a treadle Module, got {type(model).__name__}")
        _core.load_model(path, model._compiled())
        return model
    tensors, meta = _core.load_safetensors(path)  # verified before the description is trusted
    arch = meta.get(_ARCH_KEY)
    if arch is None:
        what = (f"weights of the custom module {meta[_CLASS_KEY]}" if _CLASS_KEY in meta
                else "no architecture description (it was not written by tl.save)")
        raise ValueError(f"load: '{path}' holds {what}; build the model yourself and pass it: "
                         f"tl.load(path, model=net)")
    dtype = meta.get("treadle.dtype", "float32")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"load: '{path}' declares dtype {dtype!r}")
    # The description is untrusted too: the model it builds may need no more memory than the file's
    # own tensors fill (three times: a float64 model is built in float32 first, and compiling copies
    # the parameters into one flat buffer), so a forged
    # Linear(70000, 70000) over an empty payload is refused before it is allocated.
    held = sum(t.nbytes for t in tensors.values())
    with _core.AllocationBudget(3 * held + _BUILD_SLACK_BYTES,
                                f"load: the architecture in '{path}' needs more memory than the {held} bytes of "
                                "tensors the file holds, so it does not describe them"):
        net = build(arch)
        if dtype != net.dtype:
            net.to(dtype)
    _core.load_model_tensors(net._compiled(), tensors, meta, path)
    return net


def _require_trainer(trainer, who):
    if not isinstance(getattr(trainer, "_native", None), _core.Trainer):
        raise TypeError(f"{who}: expected a tl.Trainer (a checkpoint holds the optimizer state too; tl.save and "
                        f"tl.load handle a model alone), got {type(trainer).__name__}")


def save_checkpoint(path, trainer, metadata=None, buffers=None):
    """Writes a training checkpoint of ``trainer`` (a tl.Trainer) atomically.

    It holds the parameters, every optimizer state buffer, the optimizer's step count (the schedule
    position), its base lr, the trainer context's dropout RNG state and the architecture, so that
    ``load_checkpoint`` into freshly built objects continues the run bit for bit (and ``tl.load`` of
    the checkpoint returns the model). ``buffers`` ({name: tl.ReplayBuffer}) saves those buffers'
    contents, counters and generators with it, so a resumed run also samples the same batches.
    """
    _require_trainer(trainer, "save_checkpoint")
    meta = _model_metadata(trainer.model, metadata, "save_checkpoint")
    _core.save_checkpoint(os.fspath(path), trainer._native, meta, _native_buffers(buffers, "save_checkpoint"))


def load_checkpoint(path, trainer, buffers=None):
    """Restores a checkpoint into ``trainer`` (same architecture, dtype and optimizer kind) and into
    ``buffers`` ({name: tl.ReplayBuffer} of the same layouts as saved).

    Everything is checked first; on ValueError nothing changed. Returns the user metadata.
    """
    _require_trainer(trainer, "load_checkpoint")
    natives = _native_buffers(buffers, "load_checkpoint")
    return _only_user(_core.load_checkpoint(os.fspath(path), trainer._native, natives))


def _native_buffers(buffers, who):
    from .replay import ReplayBuffer
    out = {}
    for name, buf in dict(buffers or {}).items():
        if not isinstance(buf, ReplayBuffer):
            raise TypeError(f"{who}: buffers maps names to tl.ReplayBuffer, got {type(buf).__name__} for {name!r}")
        out[str(name)] = buf._native
    return out


def save_file(tensors, path, metadata=None):
    """Writes a dict of numpy arrays (float32/64, int32/64) and {str: str} metadata as safetensors."""
    arrays = {str(k): np.asarray(v, order="C") for k, v in dict(tensors).items()}
    _core.save_safetensors(os.fspath(path), arrays, _user_metadata(metadata, "save_file"))


def load_file(path, with_metadata=False):
    """The arrays of a safetensors file (any writer) as a dict; ``(arrays, metadata)`` if asked."""
    tensors, meta = _core.load_safetensors(os.fspath(path))
    return (tensors, meta) if with_metadata else tensors


def read_metadata(path):
    """The header metadata of a safetensors file (the header is checked; the payload is not read)."""
    return _core.read_safetensors_metadata(os.fspath(path))


# -- PyTorch interchange --------------------------------------------------------------------------

def _to_numpy(value, name):
    if isinstance(value, np.ndarray):
        return np.asarray(value, order="C")
    if hasattr(value, "detach"):  # a torch tensor
        t = value.detach().cpu()
        if t.dtype in _half_dtypes():
            t = t.float()
        return np.asarray(t.numpy(), order="C")
    raise TypeError(f"from_torch: '{name}' is a {type(value).__name__}, not a tensor or array")


def _half_dtypes():
    import torch
    return (torch.float16, torch.bfloat16)


def from_torch(source, model, strict=True):
    """Loads PyTorch weights into ``model`` and returns it.

    ``source``: a ``torch.nn.Module`` of the same architecture, a state_dict, or the path of a
    safetensors file (e.g. from ``safetensors.torch.save_file``). Names and layouts are torch's, so
    nothing is transposed; float16/bfloat16 are widened, and values are converted to the model's dtype.
    ``num_batches_tracked`` counters are skipped when the model has no such entries.
    """
    if isinstance(source, (str, os.PathLike)):
        state = load_file(source)
    elif callable(getattr(source, "state_dict", None)):
        state = source.state_dict()
    else:
        state = dict(source)
    names = {n for n, _ in model.named_parameter_objects()}
    state = {k: _to_numpy(v, k) for k, v in state.items()
             if not (k.endswith("num_batches_tracked") and k not in names)}
    model.load_state_dict(state, strict=strict)
    return model


def to_torch_state_dict(model):
    """The model's parameters as a torch state_dict (torch tensors, copies), tied weights under every name."""
    import collections

    import torch
    own = model.state_dict()
    first, out = {}, collections.OrderedDict()
    for name, p in model.named_parameter_objects():
        if name not in own:
            continue  # a non-persistent buffer: not part of the state
        key = first.setdefault(id(p), name)
        out[name] = out[key] if key in out else torch.from_numpy(own[key])
    return out


# -- ONNX export ----------------------------------------------------------------------------------

_ONNX = {}  # layer type name -> fn(graph, module, config, x, shape) -> (y, shape)


def register_onnx(type_name, fn):
    """Adds an ONNX exporter for a layer type: ``fn(g, module, config, x, shape) -> (y, shape)``.

    ``x``/``y`` are value names in the graph ``g`` (see ``_OnnxGraph``: ``g.op``, ``g.const``), ``shape``
    a list of dims with None for the batch dimension.
    """
    _ONNX[type_name] = fn


class _OnnxGraph:
    """Nodes and initializers being emitted, with unique value names."""

    def __init__(self, onnx, dtype):
        self.onnx, self.dtype, self.nodes, self.inits, self._n = onnx, np.dtype(dtype), [], [], 0

    def _name(self, hint):
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value, hint="const", dtype=None):
        name = self._name(hint)
        arr = np.ascontiguousarray(np.asarray(value, dtype=dtype or self.dtype))
        self.inits.append(self.onnx.numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type, inputs, **attrs):
        out = self._name(op_type.lower())
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out


def _onnx_linear(g, m, cfg, x, shape):
    params = dict(m.named_parameter_objects())
    w = np.array(params["weight"].data)
    if shape[-1] != w.shape[1]:
        raise ValueError(f"export_onnx: Linear expects {w.shape[1]} input features, the input has {shape[-1]}")
    b = params.get("bias")
    if len(shape) == 2:
        inputs = [x, g.const(w, "weight")] + ([g.const(b.data, "bias")] if b is not None else [])
        y = g.op("Gemm", inputs, transB=1)
    else:
        y = g.op("MatMul", [x, g.const(w.T, "weight_t")])
        if b is not None:
            y = g.op("Add", [y, g.const(b.data, "bias")])
    return y, shape[:-1] + [w.shape[0]]


def _onnx_gelu(g, m, cfg, x, shape):
    half_x = g.op("Mul", [x, g.const(0.5)])
    if cfg.get("approximate", "none") == "tanh":
        cube = g.op("Mul", [g.op("Mul", [x, x]), x])
        inner = g.op("Add", [x, g.op("Mul", [cube, g.const(0.044715)])])
        t = g.op("Tanh", [g.op("Mul", [inner, g.const(np.sqrt(2.0 / np.pi))])])
    else:
        t = g.op("Erf", [g.op("Mul", [x, g.const(1.0 / np.sqrt(2.0))])])
    return g.op("Mul", [half_x, g.op("Add", [t, g.const(1.0)])]), shape


def _onnx_softplus(g, m, cfg, x, shape):
    beta, threshold = cfg.get("beta", 1.0), cfg.get("threshold", 20.0)
    bx = g.op("Mul", [x, g.const(beta)])
    soft = g.op("Div", [g.op("Softplus", [bx]), g.const(beta)])
    return g.op("Where", [g.op("Greater", [bx, g.const(threshold)]), x, soft]), shape


def _onnx_flatten(g, m, cfg, x, shape):
    rank = len(shape)
    s, e = cfg["start_dim"], cfg["end_dim"]
    s, e = s + rank if s < 0 else s, e + rank if e < 0 else e
    if not 0 <= s <= e < rank:
        raise ValueError(f"export_onnx: Flatten({cfg['start_dim']}, {cfg['end_dim']}) on a rank-{rank} input")
    merged = shape[s:e + 1]
    if any(d is None for d in merged) and len(merged) > 1:
        raise ValueError("export_onnx: Flatten would merge the batch dimension; give a fixed input_shape")
    new = shape[:s] + [None if None in merged else int(np.prod(merged))] + shape[e + 1:]
    target = [0 if d is None else d for d in new]  # 0 copies the (dynamic) batch dimension
    return g.op("Reshape", [x, g.const(target, "shape", np.int64)]), new


def _onnx_simple(op_type, **attr_from_cfg):
    def fn(g, m, cfg, x, shape):
        attrs = {a: float(cfg.get(k, d)) for a, (k, d) in attr_from_cfg.items()}
        return g.op(op_type, [x], **attrs), shape
    return fn


def _onnx_axis(op_type):
    return lambda g, m, cfg, x, shape: (g.op(op_type, [x], axis=int(cfg.get("dim", -1))), shape)


# The pointwise activations that are one ONNX operator come from the core's list of them
# (activation_modules: operator and attribute names); the others compose operators here.
for _name, _op, _doc, _params, _onnx in _core.activation_modules():
    if _onnx is not None:
        _op_type, _attributes = _onnx
        register_onnx(_name, _onnx_simple(_op_type, **{a: p for a, p in zip(_attributes, _params)}))
for _name, _fn in {
    "Linear": _onnx_linear, "GELU": _onnx_gelu, "Softplus": _onnx_softplus,
    "SiLU": lambda g, m, cfg, x, shape: (g.op("Mul", [x, g.op("Sigmoid", [x])]), shape),
    "Softmax": _onnx_axis("Softmax"), "LogSoftmax": _onnx_axis("LogSoftmax"),
    "Dropout": _onnx_simple("Identity"), "Identity": _onnx_simple("Identity"), "Flatten": _onnx_flatten,
}.items():
    register_onnx(_name, _fn)
del _name, _op, _doc, _params, _onnx, _fn


def _leaves(module, node):
    if node["type"] == "Sequential":
        for child, sub in zip(module._modules.values(), node["layers"]):
            yield from _leaves(child, sub)
    else:
        yield module, node


def _atomic_write_bytes(path, data):
    import tempfile
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".tmp.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def export_onnx(model, path, input_shape=None, opset=17, input_name="input", output_name="output"):
    """Writes a feed-forward model as an ONNX file (inference: dropout is the identity).

    ``input_shape``: the input's shape with None (or any value) for the batch dimension, which stays
    dynamic; by default ``(None, in_features)`` of the first Linear. Returns the onnx ModelProto.
    Needs the ``onnx`` package (``pip install 'treadle[onnx]'``).
    """
    try:
        import onnx
        import onnx.numpy_helper  # noqa: F401
    except ImportError as e:
        raise ImportError("export_onnx needs the onnx package: pip install 'treadle[onnx]'") from e
    leaves = list(_leaves(model, describe(model)["model"]))
    if input_shape is None:
        first = next((node for _, node in leaves if node["type"] == "Linear"), None)
        if first is None:
            raise ValueError("export_onnx: give input_shape (the model starts with no Linear layer)")
        input_shape = (None, first["config"]["in_features"])
    shape = [None] + [int(d) for d in list(input_shape)[1:]]
    g = _OnnxGraph(onnx, model.dtype)
    elem = onnx.TensorProto.FLOAT if model.dtype == "float32" else onnx.TensorProto.DOUBLE
    x = input_name
    in_dims = ["batch"] + shape[1:]
    for module, node in leaves:
        fn = _ONNX.get(node["type"])
        if fn is None:
            raise ValueError(f"export_onnx: no ONNX exporter for {node['type']} (tl.io.register_onnx adds one)")
        x, shape = fn(g, module, node.get("config", {}), x, shape)
    g.nodes.append(onnx.helper.make_node("Identity", [x], [output_name], name="output"))
    graph = onnx.helper.make_graph(
        g.nodes, "treadle", [onnx.helper.make_tensor_value_info(input_name, elem, in_dims)],
        [onnx.helper.make_tensor_value_info(output_name, elem, ["batch" if d is None else d for d in shape])],
        initializer=g.inits)
    opsets = [onnx.helper.make_opsetid("", int(opset))]
    proto = onnx.helper.make_model(graph, opset_imports=opsets, producer_name="treadle",
                                   producer_version=_core.serialize_version())
    proto.ir_version = onnx.helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(proto, full_check=True)
    _atomic_write_bytes(os.fspath(path), proto.SerializeToString())
    return proto
