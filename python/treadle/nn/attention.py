"""Attention layers (torch.nn names and parameter layouts)."""
from .. import _core
from .. import functional as F
from ..trace_state import _tracing
from .activations import _activation_name  # the one mapping of torch's activation forms
from .module import _check_cpu, _NativeModule, _int_args

__all__ = ["MultiheadAttention", "TransformerEncoderLayer"]


def _native_activation(activation):
    """The native layer's activation name for torch's forms: "relu", "gelu", F.relu / F.gelu, ReLU(),
    GELU(); another callable cannot run inside the fused layer."""
    if isinstance(activation, str):
        return activation
    name = _activation_name(activation)
    if name is None:
        raise ValueError(f"TransformerEncoderLayer: activation must be relu or gelu (a name, F.relu / F.gelu, "
                         f"ReLU() or GELU()), got {activation!r}")
    return name


class MultiheadAttention(_NativeModule):
    """torch.nn.MultiheadAttention: in_proj_weight (3E, E), in_proj_bias, out_proj.{weight,bias}.

    forward(query, key=None, value=None, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False), torch's order, returns (output, weights averaged over
    heads or None). Masks are symbolic
    float tensors added to the attention scores (0 keeps a position, -inf drops it): pass a boolean
    mask from numpy as `np.where(mask, -np.inf, 0).astype(dtype)`. A query whose every key is
    masked gets NaN outputs (a softmax over no positions), as torch's need_weights path gives; torch's
    fused inference path returns zeros there instead. Keep at least one key per query unmasked.
    """

    def __new__(cls, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        if cls is MultiheadAttention and (add_bias_kv or add_zero_attn or kdim not in (None, embed_dim)
                                          or vdim not in (None, embed_dim)):
            # torch's rarer options: the composed layer (attention_composed.py), same names and forward.
            from .attention_composed import ComposedMultiheadAttention
            return ComposedMultiheadAttention(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn,
                                              kdim, vdim, batch_first, device=device, dtype=dtype)
        return super().__new__(cls)

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        _check_cpu(device, "MultiheadAttention")
        dtype = dtype or "float32"
        embed_dim, num_heads = _int_args(self, embed_dim=embed_dim, num_heads=num_heads)
        super().__init__(_core.MultiheadAttention(embed_dim, num_heads, float(dropout), bool(bias),
                                                  bool(batch_first), dtype))
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first
        self.dropout, self.bias = float(dropout), bool(bias)

    def config(self):
        """The constructor arguments (tl.save writes them; tl.load rebuilds the layer from them)."""
        return {"embed_dim": self.embed_dim, "num_heads": self.num_heads, "dropout": self.dropout, "bias": self.bias,
                "batch_first": bool(self.batch_first)}

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if need_weights and not average_attn_weights:  # per-head weights: the composed forward on these parameters
            return self._per_head(query, key, value, key_padding_mask, attn_mask, is_causal)
        key = query if key is None else key
        value = key if value is None else value
        if query.ndim == 2:  # unbatched (L, E), as torch: a batch of one
            at = 0 if self.batch_first else 1
            query, key, value = (F.unsqueeze(t, at) for t in (query, key, value))
            kpm = None if key_padding_mask is None else F.unsqueeze(key_padding_mask, 0)
            out, weights = self._native.attend(query, key, value, kpm, attn_mask, is_causal, need_weights)
            return F.squeeze(out, at), None if weights is None else F.squeeze(weights, 0)
        return self._native.attend(query, key, value, key_padding_mask, attn_mask, is_causal, need_weights)

    def _per_head(self, query, key, value, key_padding_mask, attn_mask, is_causal):
        """torch's average_attn_weights=False: the fused kernel averages the heads' weights, so this
        forward runs the composed attention (attention_composed.attend) on the layer's own parameters."""
        from .attention_composed import AttentionParts, attend

        graph, e = _tracing.graph, self.embed_dim
        params = {n: graph.parameter(p) for n, p in self._native.named_parameters()}
        w_in, b_in = params["in_proj_weight"], params.get("in_proj_bias")
        weights = [F.slice(w_in, 0, i * e, (i + 1) * e) for i in range(3)]
        biases = [None] * 3 if b_in is None else [F.slice(b_in, 0, i * e, (i + 1) * e) for i in range(3)]
        out_w, out_b = params["out_proj.weight"], params.get("out_proj.bias")
        parts = AttentionParts(e, self.num_heads, self.batch_first, self.dropout, False, weights, biases,
                               (None, None), lambda t: F.linear(t, out_w, out_b))
        if query.ndim == 2:  # unbatched (L, E): a batch of one
            at = 0 if self.batch_first else 1
            query, key, value = (None if t is None else F.unsqueeze(t, at) for t in (query, key, value))
            kpm = None if key_padding_mask is None else F.unsqueeze(key_padding_mask, 0)
            out, w = attend(parts, query, key, value, kpm, True, attn_mask, False, is_causal)
            return F.squeeze(out, at), F.squeeze(w, 0)
        return attend(parts, query, key, value, key_padding_mask, True, attn_mask, False, is_causal)

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


class TransformerEncoderLayer(_NativeModule):
    """torch.nn.TransformerEncoderLayer (self_attn, linear1, linear2, norm1, norm2; post-norm by default).

    forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False); masks are additive float
    symbols as for MultiheadAttention. activation is "relu" or "gelu".
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, dtype="float32"):
        d_model, nhead, dim_feedforward = _int_args(self, d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward)
        activation = _native_activation(activation)
        super().__init__(_core.TransformerEncoderLayer(d_model, nhead, dim_feedforward, float(dropout),
                                                       str(activation), float(layer_norm_eps), bool(batch_first),
                                                       bool(norm_first), bool(bias), dtype))
        self.d_model, self.nhead, self.norm_first = d_model, nhead, norm_first
        self._config = {"d_model": d_model, "nhead": nhead, "dim_feedforward": dim_feedforward,
                        "dropout": float(dropout), "activation": str(activation), "layer_norm_eps": float(layer_norm_eps),
                        "batch_first": bool(batch_first), "norm_first": bool(norm_first), "bias": bool(bias)}

    def config(self):
        """The constructor arguments (tl.save writes them; tl.load rebuilds the layer from them)."""
        return dict(self._config)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        if src.ndim == 2:  # unbatched (S, E), as torch: a batch of one
            at = 0 if self._config["batch_first"] else 1
            kpm = None if src_key_padding_mask is None else F.unsqueeze(src_key_padding_mask, 0)
            return F.squeeze(self._native.encode(F.unsqueeze(src, at), src_mask, kpm, is_causal), at)
        return self._native.encode(src, src_mask, src_key_padding_mask, is_causal)

    def extra_repr(self):
        return f"d_model={self.d_model}, nhead={self.nhead}, norm_first={self.norm_first}"
