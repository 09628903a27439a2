"""Attention layers (torch.nn names and parameter layouts)."""
from . import _core
from .nn import _NativeModule

__all__ = ["MultiheadAttention"]


class MultiheadAttention(_NativeModule):
    """torch.nn.MultiheadAttention: in_proj_weight (3E, E), in_proj_bias, out_proj.{weight,bias}.

    forward(query, key=None, value=None, key_padding_mask=None, need_weights=True, attn_mask=None,
    is_causal=False) returns (output, weights averaged over heads or None). Masks are symbolic
    float tensors added to the attention scores (0 keeps a position, -inf drops it): pass a boolean
    mask from numpy as `np.where(mask, -np.inf, 0).astype(dtype)`.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, batch_first=False, dtype="float32"):
        super().__init__(_core.MultiheadAttention(int(embed_dim), int(num_heads), float(dropout), bool(bias),
                                                  bool(batch_first), dtype))
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=True, attn_mask=None,
                is_causal=False):
        key = query if key is None else key
        value = key if value is None else value
        return self._native.attend(query, key, value, key_padding_mask, attn_mask, is_causal, need_weights)

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"
