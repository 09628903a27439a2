"""torch.nn's Transformer containers: TransformerDecoderLayer, TransformerEncoder, TransformerDecoder and
Transformer, composed of the native attention layers with torch's submodule names, state_dict order and
forward passes, so a torch model using them ports by renaming the import.

Masks are additive float symbols, as for MultiheadAttention (0 keeps a position, -inf drops it): a
model input, or a buffer (``self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(T))``).
A boolean torch mask becomes ``np.where(mask, -np.inf, 0)``. A numpy array built inside forward is not
a symbol: register it as a buffer or pass it as an input.

Differences from torch:
- ``is_causal`` / ``tgt_is_causal`` / ``memory_is_causal`` add a causal mask to the scores, on top of
  any mask given (torch reads them as a hint that the mask given is causal; with a causal mask the two
  agree). None (the containers' default) means False: the mask given is applied as it is, which is what
  torch's causal-mask detection amounts to. A causal flag without a mask is allowed (torch refuses it).
- The containers always take the standard path: no nested tensors (``enable_nested_tensor`` and
  ``mask_check`` are kept for the signature), so padded positions of the output hold values computed
  from the unpadded keys, as in torch's training path (torch's inference fast path gives zeros there).
- Copies of a layer are rebuilt from its ``config()`` and its values copied (torch deep-copies): a layer
  class without ``config()`` cannot be copied (TypeError).
- Bad arguments raise ValueError (torch raises RuntimeError for an unknown activation); num_layers < 1 is
  refused when the container is built.
- tl.save / tl.load(path) rebuild a Transformer with named activations and no custom encoder or decoder,
  and a TransformerDecoderLayer with a named activation (with a custom callable, tl.save of the layer as
  the whole model raises TypeError; inside a model class it is saved with the model's weights).
  TransformerEncoder and TransformerDecoder are saved as weights only: build the container and load
  into it with ``tl.load(path, model=net)`` (state_dict and load_state_dict work for all).
"""
import inspect
import numbers
import os

import numpy as np

from . import init
from .module import Module, _int_arg, _int_args
from .activations import _ACTIVATIONS, _activation_name
from .attention import MultiheadAttention, TransformerEncoderLayer
from .containers import ModuleList
from .layers import Dropout, LayerNorm, Linear

__all__ = ["TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder", "Transformer"]

_MODULE_BYTES = 4096  # the least a copy of a layer costs besides its parameters


def _dtype_name(dtype, owner):
    """"float32" (dtype None) or "float64": a string, a numpy dtype or a torch dtype."""
    if dtype is None:
        return "float32"
    original = dtype
    if str(dtype).startswith("torch."):
        dtype = str(dtype)[len("torch."):]
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in ("float32", "float64"):
        raise ValueError(f"{owner}: dtype must be float32 or float64, got {original!r}")
    return name


def _check_activation(activation, owner):
    if isinstance(activation, str) and activation not in _ACTIVATIONS:
        raise ValueError(f"{owner}: activation must be 'relu', 'gelu' or a callable, got {activation!r}")
    if not isinstance(activation, str) and not callable(activation):
        raise ValueError(f"{owner}: activation must be 'relu', 'gelu' or a callable, got "
                         f"{type(activation).__name__} {activation!r}")


class TransformerDecoderLayer(Module):
    """torch.nn.TransformerDecoderLayer: self-attention, cross-attention over `memory`, feed-forward.

    Submodules in torch's order (self_attn, multihead_attn, linear1, dropout, linear2, norm1, norm2,
    norm3, dropout1, dropout2, dropout3), so state_dict keys are torch's. Post-norm by default,
    pre-norm with norm_first=True, as torch's forward. activation: "relu", "gelu" or a callable on
    symbols (F.relu, F.gelu, a module; a module is registered as the submodule `activation`, as in
    torch). forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False); the masks are additive
    float symbols (see the module docstring for the causal flags).
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, dtype=None):
        super().__init__()
        d_model, nhead, dim_feedforward = _int_args(self, d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward)
        if dim_feedforward <= 0:
            raise ValueError(f"TransformerDecoderLayer: dim_feedforward must be positive, got {dim_feedforward}")
        _check_activation(activation, "TransformerDecoderLayer")
        dtype = _dtype_name(dtype, "TransformerDecoderLayer")
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bool(bias), dtype)
        self.dropout = Dropout(float(dropout))
        self.linear2 = Linear(dim_feedforward, d_model, bool(bias), dtype)
        self.norm_first = bool(norm_first)
        self.norm1, self.norm2, self.norm3 = (LayerNorm(d_model, float(layer_norm_eps), bias=bool(bias), dtype=dtype)
                                              for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = (Dropout(float(dropout)) for _ in range(3))
        self.activation = _ACTIVATIONS[activation] if isinstance(activation, str) else activation
        self._config = {"d_model": d_model, "nhead": nhead, "dim_feedforward": dim_feedforward,
                        "dropout": float(dropout), "activation": _activation_name(activation) or activation,
                        "layer_norm_eps": float(layer_norm_eps), "batch_first": bool(batch_first),
                        "norm_first": bool(norm_first), "bias": bool(bias)}

    def config(self):
        """The constructor arguments (tl.save writes them, tl.load rebuilds the layer from them; the
        containers rebuild their copies from them). A custom activation is the callable itself."""
        return dict(self._config)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff_block(x))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False, attn_mask=attn_mask,
                           is_causal=bool(is_causal))[0]
        return self.dropout1(x)

    def _mha_block(self, x, memory, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, memory, memory, key_padding_mask=key_padding_mask, need_weights=False,
                                attn_mask=attn_mask, is_causal=bool(is_causal))[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def extra_repr(self):
        c = self._config
        return f"d_model={c['d_model']}, nhead={c['nhead']}, norm_first={c['norm_first']}"


def _parameter_dtype(objects):
    """The floating dtype of a layer's parameters (None when it has none)."""
    for _, p in objects:
        if p.data.dtype.kind == "f":
            return p.data.dtype.name
    return None


def _rebuild(layer, owner):
    """A new instance of layer's class from its config() (with its parameters' dtype)."""
    what = f"{owner}: cannot copy the {type(layer).__name__}"
    config = getattr(layer, "config", None)
    if not isinstance(layer, Module) or not callable(config):
        raise TypeError(f"{what}: the layer is copied by rebuilding it from config() (its constructor's "
                        "arguments), and it is not a treadle Module with a config() method")
    kwargs = dict(config())
    dtype = _parameter_dtype(layer.named_parameter_objects())
    if dtype is not None and "dtype" not in kwargs and "dtype" in inspect.signature(type(layer)).parameters:
        kwargs["dtype"] = dtype
    try:
        return type(layer)(**kwargs)
    except TypeError as e:
        raise TypeError(f"{what}: its constructor refuses its config() {kwargs}: {e}") from None


def _copy_layer(layer, owner):
    """An independent copy of `layer` holding its values (torch's deepcopy in _get_clones)."""
    copy = _rebuild(layer, owner)
    source, target = layer.named_parameter_objects(), copy.named_parameter_objects()
    have, want = [(n, p.shape) for n, p in target], [(n, p.shape) for n, p in source]
    if have != want:
        raise TypeError(f"{owner}: cannot copy the {type(layer).__name__}: rebuilt from config() it has the "
                        f"parameters {have}, not {want}")
    for (name, src), (_, dst) in zip(source, target):
        if dst is src:
            raise TypeError(f"{owner}: cannot copy the {type(layer).__name__}: its parameter '{name}' comes from a "
                            "module in its config() (a module activation with parameters), so copies would share it")
        dst.data[...] = src.data
        dst.requires_grad = src.requires_grad
    return copy.train(layer.training)


def _check_memory(layer, num_layers, owner):
    """Refuses num_layers copies that no machine could hold (each at least its parameters' bytes, and
    a few kilobytes of objects), before any is built."""
    per_layer = _MODULE_BYTES
    if isinstance(layer, Module):
        per_layer += sum(p.data.nbytes for _, p in layer.named_parameter_objects())
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound
        return
    if num_layers * per_layer > memory:
        raise ValueError(f"{owner}: {num_layers} copies of the layer need at least {num_layers * per_layer} bytes, "
                         f"more than this machine's {memory} bytes of memory")


def _clones(layer, num_layers, owner):
    """torch's _get_clones: a ModuleList of num_layers independent copies of layer."""
    num_layers = _int_arg(owner, "num_layers", num_layers)
    if num_layers < 1:
        raise ValueError(f"{type(owner).__name__}: num_layers must be at least 1, got {num_layers}")
    _check_memory(layer, num_layers, type(owner).__name__)
    return ModuleList([_copy_layer(layer, type(owner).__name__) for _ in range(num_layers)])


def _check_norm(norm, owner):
    if norm is not None and not isinstance(norm, Module):
        raise TypeError(f"{owner}: norm must be a treadle Module or None, got {type(norm).__name__}")
    return norm


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: `layers` (a ModuleList of num_layers copies of encoder_layer, each
    independent and starting from encoder_layer's values; encoder_layer itself is not registered) and
    an optional final `norm`. forward(src, mask=None, src_key_padding_mask=None, is_causal=None) runs
    the layers in turn with the same masks, then the norm. Copies are made when the container is built:
    change encoder_layer's values before that, or the copies' values (``layers[i]``) after."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True):
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers, self)
        self.num_layers = len(self.layers)
        self.norm = _check_norm(norm, "TransformerEncoder")
        self.enable_nested_tensor, self.use_nested_tensor = bool(enable_nested_tensor), False
        self.mask_check = bool(mask_check)

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=mask, is_causal=bool(is_causal),
                           src_key_padding_mask=src_key_padding_mask)
        return output if self.norm is None else self.norm(output)

    def extra_repr(self):
        return f"num_layers={self.num_layers}"


class TransformerDecoder(Module):
    """torch.nn.TransformerDecoder: `layers` (num_layers independent copies of decoder_layer, as in
    TransformerEncoder) and an optional final `norm`. forward(tgt, memory, tgt_mask=None,
    memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=None,
    memory_is_causal=False) runs the layers in turn on the same memory and masks, then the norm."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers, self)
        self.num_layers = len(self.layers)
        self.norm = _check_norm(norm, "TransformerDecoder")

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        output = tgt
        for layer in self.layers:
            output = layer(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                           tgt_key_padding_mask=tgt_key_padding_mask,
                           memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=bool(tgt_is_causal),
                           memory_is_causal=bool(memory_is_causal))
        return output if self.norm is None else self.norm(output)

    def extra_repr(self):
        return f"num_layers={self.num_layers}"


class Transformer(Module):
    """torch.nn.Transformer: `encoder` (a TransformerEncoder with a final LayerNorm) and `decoder` (a
    TransformerDecoder with a final LayerNorm), or custom_encoder / custom_decoder in their place; every
    parameter with more than one dimension initialised by xavier_uniform_, as torch's
    _reset_parameters (drawn from the generator tl.manual_seed seeds).

    forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
    memory_is_causal=False) encodes src and decodes tgt over it. The encoder layers are native and take
    activation "relu" or "gelu" (or F.relu, F.gelu, ReLU(), GELU()); for another activation pass a
    custom_encoder.
    """

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048,
                 dropout=0.1, activation="relu", custom_encoder=None, custom_decoder=None, layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, dtype=None):
        super().__init__()
        d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward = _int_args(
            self, d_model=d_model, nhead=nhead, num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers, dim_feedforward=dim_feedforward)
        _check_activation(activation, "Transformer")
        dtype = _dtype_name(dtype, "Transformer")
        layer_args = (d_model, nhead, dim_feedforward, dropout)
        tail = (layer_norm_eps, batch_first, norm_first, bias)
        if custom_encoder is not None:
            self.encoder = _check_custom(custom_encoder, "custom_encoder")
        else:
            name = _activation_name(activation)
            if name is None:
                raise ValueError(f"Transformer: the native encoder layer takes activation 'relu' or 'gelu', got "
                                 f"{activation!r}; pass a custom_encoder for another activation")
            layer = TransformerEncoderLayer(*layer_args, name, *tail, dtype=dtype)
            self.encoder = TransformerEncoder(layer, num_encoder_layers, self._final_norm(d_model, tail, dtype))
        if custom_decoder is not None:
            self.decoder = _check_custom(custom_decoder, "custom_decoder")
        else:
            layer = TransformerDecoderLayer(*layer_args, activation, *tail, dtype=dtype)
            self.decoder = TransformerDecoder(layer, num_decoder_layers, self._final_norm(d_model, tail, dtype))
        self._reset_parameters()
        self.d_model, self.nhead, self.batch_first = d_model, nhead, bool(batch_first)
        self._config = {"d_model": d_model, "nhead": nhead, "num_encoder_layers": num_encoder_layers,
                        "num_decoder_layers": num_decoder_layers, "dim_feedforward": dim_feedforward,
                        "dropout": float(dropout), "activation": _activation_name(activation),
                        "custom": custom_encoder is not None or custom_decoder is not None,
                        "layer_norm_eps": float(layer_norm_eps), "batch_first": bool(batch_first),
                        "norm_first": bool(norm_first), "bias": bool(bias)}

    @staticmethod
    def _final_norm(d_model, tail, dtype):
        layer_norm_eps, _, _, bias = tail
        return LayerNorm(d_model, eps=float(layer_norm_eps), bias=bool(bias), dtype=dtype)

    def _reset_parameters(self):
        for _, p in self._unique_parameter_objects():
            if len(p.shape) > 1:
                init.xavier_uniform_(p)

    def config(self):
        """The constructor arguments, for tl.save / tl.load; ValueError (tl.save then writes weights
        only) with a custom encoder or decoder, or an activation other than relu or gelu."""
        c = dict(self._config)
        if c.pop("custom") or c["activation"] is None:
            raise ValueError("Transformer: a custom encoder, decoder or activation cannot be described by "
                             "constructor arguments")
        return c

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        self._check_inputs(src, tgt)
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    def _check_inputs(self, src, tgt):
        batch = 0 if self.batch_first else 1
        if src.ndim == 3 and tgt.ndim == 3 and src.shape[batch] != tgt.shape[batch]:
            raise ValueError(f"Transformer: the batch number of src and tgt must be equal (dim {batch}), got "
                             f"src {src.shape} and tgt {tgt.shape}")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ValueError(f"Transformer: the feature number of src and tgt must be equal to d_model "
                             f"({self.d_model}), got src {src.shape} and tgt {tgt.shape}")

    @staticmethod
    def generate_square_subsequent_mask(sz, dtype=np.float32, device=None):
        """A causal mask of shape (sz, sz) as a numpy array: 0 on and below the diagonal, -inf above.
        Pass it as a model input or keep it as a buffer (register_buffer). dtype: float32 (also for
        None) or float64, a numpy, string or torch dtype; device is accepted for torch's signature."""
        if isinstance(sz, bool) or not isinstance(sz, numbers.Integral) or sz < 0:
            raise ValueError(f"generate_square_subsequent_mask: sz must be a non-negative int, got {sz!r}")
        dtype = _dtype_name(dtype, "generate_square_subsequent_mask")
        return np.triu(np.full((int(sz), int(sz)), -np.inf, dtype=dtype), k=1)

    def extra_repr(self):
        return f"d_model={self.d_model}, nhead={self.nhead}, batch_first={self.batch_first}"


def _check_custom(module, what):
    if not isinstance(module, Module):
        raise TypeError(f"Transformer: {what} must be a treadle Module, got {type(module).__name__}")
    return module

