"""MultiheadAttention with torch's less common options (kdim / vdim other than embed_dim, add_bias_kv,
add_zero_attn), composed from verified ops: separate projections, the appended key/value rows, the
head split, scaled scores, softmax, dropout and the output projection, step for step as torch's
multi_head_attention_forward. tl.nn.MultiheadAttention builds this module when such an option is set;
the plain case is the native fused layer.
"""
import math

import numpy as np

from .. import functional as F
from .layers import Linear
from .module import Module, _int_args
from .init import constant_, xavier_normal_, xavier_uniform_
from .parameter import Parameter

__all__ = []


class ComposedMultiheadAttention(Module):
    """torch.nn.MultiheadAttention with kdim / vdim / add_bias_kv / add_zero_attn: torch's parameter
    names (q/k/v_proj_weight when kdim or vdim differs, else in_proj_weight; in_proj_bias; bias_k,
    bias_v; out_proj), initialisation rules and forward. Masks are additive float symbols, as for
    the native layer. Not in tl.save's rebuildable layers: save the weights (state_dict)."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, dtype=None):
        super().__init__()
        embed_dim, num_heads = _int_args(self, embed_dim=embed_dim, num_heads=num_heads)
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be a positive multiple of "
                             f"num_heads ({num_heads})")
        kdim = embed_dim if kdim is None else _int_args(self, kdim=kdim)
        vdim = embed_dim if vdim is None else _int_args(self, vdim=vdim)
        self.embed_dim, self.num_heads, self.kdim, self.vdim = embed_dim, num_heads, kdim, vdim
        self.dropout, self.batch_first, self.add_zero_attn = float(dropout), bool(batch_first), bool(add_zero_attn)
        self._same_dims = kdim == embed_dim and vdim == embed_dim
        dtype = dtype or "float32"

        def param(*shape):
            return Parameter(np.zeros(shape), dtype=dtype)

        # torch's _reset_parameters: xavier_uniform_ on the projections, zero biases, xavier_normal_
        # on bias_k / bias_v; the out_proj weight keeps Linear's default.
        if self._same_dims:
            self.in_proj_weight = param(3 * embed_dim, embed_dim)
            xavier_uniform_(self.in_proj_weight)
        else:
            for name, width in (("q_proj_weight", embed_dim), ("k_proj_weight", kdim), ("v_proj_weight", vdim)):
                setattr(self, name, param(embed_dim, width))
                xavier_uniform_(getattr(self, name))
        if bias:
            self.in_proj_bias = param(3 * embed_dim)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        if bias:
            constant_(self.out_proj.bias, 0.0)
        if add_bias_kv:
            self.bias_k, self.bias_v = param(1, 1, embed_dim), param(1, 1, embed_dim)
            xavier_normal_(self.bias_k)
            xavier_normal_(self.bias_v)

    def _parts(self):
        e, params = self.embed_dim, self.__dict__["_parameters"]
        bias = params.get("in_proj_bias")
        b = [None] * 3 if bias is None else [F.slice(self.in_proj_bias, 0, i * e, (i + 1) * e) for i in range(3)]
        if self._same_dims:
            w = [F.slice(self.in_proj_weight, 0, i * e, (i + 1) * e) for i in range(3)]
        else:
            w = [self.q_proj_weight, self.k_proj_weight, self.v_proj_weight]
        kv = (self.bias_k, self.bias_v) if "bias_k" in params else (None, None)
        return AttentionParts(e, self.num_heads, self.batch_first, self.dropout, self.add_zero_attn, w, b, kv,
                              self.out_proj)

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        return attend(self._parts(), query, key, value, key_padding_mask, need_weights, attn_mask,
                      average_attn_weights, is_causal)

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kdim={self.kdim}, vdim={self.vdim}, "
                f"batch_first={self.batch_first}")


class AttentionParts:
    """What one attention forward reads: sizes and options, the q/k/v projection weights and biases
    (symbols; biases may be None), bias_k / bias_v (or None) and the output projection (a callable)."""

    def __init__(self, embed_dim, num_heads, batch_first, dropout, add_zero_attn, weights, biases, bias_kv, out_proj):
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first
        self.dropout, self.add_zero_attn = float(dropout), add_zero_attn
        self.weights, self.biases, self.bias_kv, self.out_proj = weights, biases, bias_kv, out_proj


def attend(p, query, key=None, value=None, key_padding_mask=None, need_weights=True, attn_mask=None,
           average_attn_weights=True, is_causal=False):
    """torch's multi_head_attention_forward, step for step, for the parts `p` (AttentionParts)."""
    key = query if key is None else key
    value = key if value is None else value
    if is_causal and attn_mask is None:
        raise ValueError("MultiheadAttention: is_causal needs attn_mask here (torch's hint; give the mask)")
    if p.batch_first:  # the composition runs in torch's (L, N, E) layout
        query, key, value = (F.transpose(t, 0, 1) for t in (query, key, value))
    q, k, v = (F.linear(x, w, b) for x, w, b in zip((query, key, value), p.weights, p.biases))
    batch, heads, hd = q.shape[1], p.num_heads, p.embed_dim // p.num_heads
    if p.bias_kv[0] is not None:
        k = F.cat([k, F.zeros_like(F.slice(k, 0, 0, 1)) + p.bias_kv[0]], dim=0)
        v = F.cat([v, F.zeros_like(F.slice(v, 0, 0, 1)) + p.bias_kv[1]], dim=0)
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)

    def heads_first(t):  # (S, N, E) -> (N * heads, S, hd)
        return F.transpose(F.reshape(t, (t.shape[0], batch * heads, hd)), 0, 1)

    q, k, v = heads_first(q), heads_first(k), heads_first(v)
    if p.add_zero_attn:
        k = F.cat([k, F.zeros_like(F.slice(k, 1, 0, 1))], dim=1)
        v = F.cat([v, F.zeros_like(F.slice(v, 1, 0, 1))], dim=1)
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
    scores = F.bmm(q * (1.0 / math.sqrt(hd)), k, False, True)  # (N * heads, L, S)
    if attn_mask is not None:
        scores = scores + (attn_mask if attn_mask.ndim == 3 else F.unsqueeze(attn_mask, 0))
    if key_padding_mask is not None:  # (N, S) -> each sample's row once per head: (N * heads, 1, S)
        per_head = F.cat([F.unsqueeze(key_padding_mask, 1)] * heads, dim=1)
        scores = scores + F.reshape(per_head, (batch * heads, 1, key_padding_mask.shape[-1]))
    weights = F.softmax(scores, -1)
    out = F.bmm(F.dropout(weights, p.dropout) if p.dropout > 0 else weights, v)  # (N * heads, L, hd)
    out = p.out_proj(F.reshape(F.transpose(out, 0, 1), (out.shape[1], batch, p.embed_dim)))
    if p.batch_first:
        out = F.transpose(out, 0, 1)
    if not need_weights:
        return out, None
    weights = F.reshape(weights, (batch, heads) + tuple(weights.shape[1:]))
    return out, (F.mean(weights, 1) if average_attn_weights else weights)


def _pad_last(mask):
    """A mask with one more (kept) key column: 0 appended along the last dim."""
    if mask is None:
        return None
    return F.cat([mask, F.zeros_like(F.slice(mask, mask.ndim - 1, 0, 1))], dim=mask.ndim - 1)
