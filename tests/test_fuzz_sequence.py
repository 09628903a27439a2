"""Property-based fuzzing of the sequence modules against torch.nn (hypothesis): MultiheadAttention and
TransformerEncoderLayer with masks of random shape, dtype and content (fully masked rows included),
mismatched embedding sizes; RNN, GRU and LSTM with initial states and lengths of random shape,
dtype and range. The properties are those of test_fuzz_modules.py (fuzzmodules.py).
"""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
torch = pytest.importorskip("torch")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import treadle as tl  # noqa: E402
from fuzzmodules import (DOCUMENTED, FLOATS, FUZZ, LAYOUTS, check_predict, check_step, expect_documented,  # noqa: E402
                         fill, layout, near, torch_pair)

# The reference is torch's explicit path (scores, softmax, weights): its fused inference path and its
# scaled_dot_product_attention kernel give 0 where a query is NaN or a row is fully masked, where
# the explicit path (and treadle) give NaN.
torch.backends.mha.set_fastpath_enabled(False)


def _explicit(mha):
    """Makes a torch MultiheadAttention always take the need_weights path (the weights are dropped
    by the callers that did not ask for them)."""
    forward = mha.forward

    def explicit(*args, **kwargs):
        wanted = kwargs.get("need_weights", True)
        kwargs["need_weights"] = True
        out, w = forward(*args, **kwargs)
        return out, w if wanted else None

    mha.forward = explicit
    return mha


def _rng(data):
    return np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))


@st.composite
def masks(draw, shape, dtype):
    """An additive mask near `shape`: 0 keeps, -inf drops (whole rows sometimes), or random values;
    sometimes bool or int64 (which treadle refuses: masks are additive floats)."""
    r = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["drop"] * 3 + ["values", "bool", "int64", "near"]))
    if kind == "near":
        return draw(near(shape, dtype))
    keep = r.random(shape) < 0.7
    if kind == "bool":
        return layout(~keep, draw(st.sampled_from(LAYOUTS)))
    if kind == "int64":
        return np.where(keep, 0, -1000).astype(np.int64)
    if kind == "values":
        return fill(r, shape, dtype)
    return layout(np.where(keep, 0, -np.inf).astype(dtype), draw(st.sampled_from(LAYOUTS)))


# ---- attention ----------------------------------------------------------------------------------------------

class _Attend(tl.nn.Module):
    """query, key, value and the chosen masks as model inputs; the output (and weights)."""

    def __init__(self, m, which, need_weights, causal):
        super().__init__()
        self.m, self.which, self.need_weights, self.causal = m, which, need_weights, causal

    def forward(self, q, k, v, *masks):
        kw = dict(zip(self.which, masks))
        out, w = self.m(q, k, v, key_padding_mask=kw.get("kpm"), attn_mask=kw.get("attn"),
                        need_weights=self.need_weights, is_causal=self.causal)
        return (out, w) if self.need_weights else out


class _TorchAttend(torch.nn.Module):
    def __init__(self, m, which, need_weights, causal):
        super().__init__()
        self.m, self.which, self.need_weights, self.causal = m, which, need_weights, causal

    def forward(self, q, k, v, *masks):
        kw = dict(zip(self.which, masks))
        attn = kw.get("attn")
        if self.causal and attn is None:  # torch's is_causal is a hint that needs the mask itself
            attn = torch.nn.Transformer.generate_square_subsequent_mask(q.shape[-2 if self.m.batch_first else 0],
                                                                        dtype=q.dtype)
        out, w = self.m(q, k, v, key_padding_mask=kw.get("kpm"), attn_mask=attn,
                        need_weights=self.need_weights, is_causal=self.causal and attn is not None)
        return (out, w) if self.need_weights else out


@FUZZ
@given(e=st.sampled_from([2, 4, 6]), heads=st.sampled_from([1, 2, 3, 2, 0]), batch_first=st.booleans(),
       bias=st.booleans(), dtype=st.sampled_from(FLOATS), data=st.data())
def test_fuzz_multihead_attention(e, heads, batch_first, bias, dtype, data):
    names = ("MultiheadAttention", "attention", "attn", "mask")
    try:
        mha = tl.nn.MultiheadAttention(e, heads, bias=bias, batch_first=batch_first, dtype=dtype)
    except DOCUMENTED as err:
        expect_documented(err, names)
        return
    which = data.draw(st.sampled_from([(), ("kpm",), ("attn",), ("kpm", "attn")]))
    need_weights = data.draw(st.booleans())
    causal = "attn" not in which and data.draw(st.integers(0, 3)) == 0
    torch.manual_seed(0)
    ref = _TorchAttend(_explicit(torch.nn.MultiheadAttention(e, heads, bias=bias, batch_first=batch_first)), which,
                       need_weights, causal)
    ref, net = torch_pair(ref, _Attend(mha, which, need_weights, causal), dtype)
    n, lq, s = (data.draw(st.integers(1, 3)) for _ in range(3))
    if causal:
        s = lq
    seq = (lambda length, dim: (n, length, dim)) if batch_first else (lambda length, dim: (length, n, dim))
    kdim = e if data.draw(st.integers(0, 5)) else data.draw(st.sampled_from([e + 1, e - 1]))
    q = data.draw(near(seq(lq, e), dtype))
    k = data.draw(near(seq(s, kdim), dtype)) if data.draw(st.booleans()) else q
    v = k if data.draw(st.booleans()) else data.draw(near(seq(s if k is not q else lq, kdim), dtype))
    s = k.shape[1 if batch_first else 0] if k.ndim == 3 else s
    mask_shapes = {"kpm": (n, s), "attn": (lq, s) if data.draw(st.booleans()) else (n * max(heads, 1), lq, s)}
    extra = [data.draw(masks(mask_shapes[w], dtype)) for w in which]
    inputs = [q, k, v] + extra
    out = check_predict(net, ref, inputs, dtype, names)
    if out is not None and not need_weights and data.draw(st.booleans()):
        x0 = [fill(_rng(data), a.shape, dtype) for a in (q, k, v)] + [np.where(np.isfinite(m), m, -1e3) for m in extra]
        check_step(net, ref, x0, inputs, names, _rng(data))


class _Encode(tl.nn.Module):
    def __init__(self, m, which, causal):
        super().__init__()
        self.m, self.which, self.causal = m, which, causal

    def forward(self, src, *masks):
        kw = dict(zip(self.which, masks))
        return self.m(src, src_mask=kw.get("attn"), src_key_padding_mask=kw.get("kpm"), is_causal=self.causal)


class _TorchEncode(torch.nn.Module):
    def __init__(self, m, which, causal):
        super().__init__()
        self.m, self.which, self.causal = m, which, causal

    def forward(self, src, *masks):
        kw = dict(zip(self.which, masks))
        attn = kw.get("attn")
        if self.causal:
            attn = torch.nn.Transformer.generate_square_subsequent_mask(src.shape[1 if self.m.self_attn.batch_first
                                                                                  else 0], dtype=src.dtype)
        return self.m(src, src_mask=attn, src_key_padding_mask=kw.get("kpm"), is_causal=self.causal)


@FUZZ
@given(d=st.sampled_from([2, 4]), heads=st.sampled_from([1, 2, 3]), ff=st.sampled_from([3, 8, 0]),
       activation=st.sampled_from(["relu", "gelu", "relu", "gelu", "tanh"]), norm_first=st.booleans(),
       batch_first=st.booleans(), dtype=st.sampled_from(FLOATS), data=st.data())
def test_fuzz_transformer_encoder_layer(d, heads, ff, activation, norm_first, batch_first, dtype, data):
    names = ("TransformerEncoderLayer", "MultiheadAttention", "attention", "mask", "linear", "norm")
    kw = dict(dim_feedforward=ff, dropout=0.0, activation=activation, norm_first=norm_first, batch_first=batch_first)
    try:
        layer = tl.nn.TransformerEncoderLayer(d, heads, dtype=dtype, **kw)
    except DOCUMENTED as err:
        expect_documented(err, names)
        return
    which = data.draw(st.sampled_from([(), ("kpm",), ("attn",), ("kpm", "attn")]))
    causal = "attn" not in which and data.draw(st.integers(0, 3)) == 0
    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(d, heads, **kw)
    _explicit(ref.self_attn)
    ref = _TorchEncode(ref, which, causal)
    ref, net = torch_pair(ref, _Encode(layer, which, causal), dtype)
    n, length = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4))
    src = data.draw(near((n, length, d) if batch_first else (length, n, d), dtype))
    attn_shape = (length, length) if data.draw(st.booleans()) else (n * heads, length, length)
    extra = [data.draw(masks({"kpm": (n, length), "attn": attn_shape}[w], dtype)) for w in which]
    out = check_predict(net, ref, [src] + extra, dtype, names)
    if out is not None and data.draw(st.booleans()):
        x0 = [fill(_rng(data), src.shape, dtype)] + [np.where(np.isfinite(m), m, -1e3) for m in extra]
        check_step(net, ref, x0, [src] + extra, names, _rng(data))


# ---- recurrent ----------------------------------------------------------------------------------------------

class _Recur(tl.nn.Module):
    def __init__(self, m, has_state, has_lengths, states_out):
        super().__init__()
        self.m, self.has_state, self.has_lengths, self.states_out = m, has_state, has_lengths, states_out

    def forward(self, x, *rest):
        rest, lstm = list(rest), isinstance(self.m, tl.nn.LSTM)
        hx = ((rest.pop(0), rest.pop(0)) if lstm else rest.pop(0)) if self.has_state else None
        out, h = self.m(x, hx, rest.pop(0) if self.has_lengths else None)
        return ((out,) + (tuple(h) if lstm else (h,))) if self.states_out else out


class _TorchRecur(torch.nn.Module):
    """The same through pack_padded_sequence / pad_packed_sequence when lengths are given."""

    def __init__(self, m, has_state, has_lengths, states_out):
        super().__init__()
        self.m, self.has_state, self.has_lengths, self.states_out = m, has_state, has_lengths, states_out

    def forward(self, x, *rest):
        rest, lstm = list(rest), isinstance(self.m, torch.nn.LSTM)
        hx = ((rest.pop(0), rest.pop(0)) if lstm else rest.pop(0)) if self.has_state else None
        steps = x.shape[1 if self.m.batch_first else 0]
        if self.has_lengths:
            packed = torch.nn.utils.rnn.pack_padded_sequence(x, rest.pop(0), batch_first=self.m.batch_first,
                                                             enforce_sorted=False)
            out, h = self.m(packed, hx)
            out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=self.m.batch_first, total_length=steps)
        else:
            out, h = self.m(x, hx)
        return ((out,) + (tuple(h) if lstm else (h,))) if self.states_out else out


@FUZZ
@given(kind=st.sampled_from(["RNN", "GRU", "LSTM"]), num_layers=st.sampled_from([1, 2, 1, 0]),
       bidirectional=st.booleans(), batch_first=st.booleans(), has_state=st.booleans(), has_lengths=st.booleans(),
       dtype=st.sampled_from(FLOATS), data=st.data())
def test_fuzz_recurrent(kind, num_layers, bidirectional, batch_first, has_state, has_lengths, dtype, data):
    names = (kind, "recurrent", "lengths", "rnn", "gru", "lstm", "h0", "c0")
    inp, hidden = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
    try:
        layer = getattr(tl.nn, kind)(inp, hidden, dtype=dtype, **kw)
    except DOCUMENTED as err:
        expect_documented(err, names)
        return
    states_out = data.draw(st.booleans())
    torch.manual_seed(0)
    ref = _TorchRecur(getattr(torch.nn, kind)(inp, hidden, **kw), has_state, has_lengths, states_out)
    ref, net = torch_pair(ref, _Recur(layer, has_state, has_lengths, states_out), dtype)
    n, steps = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4))
    x = data.draw(near((n, steps, inp) if batch_first else (steps, n, inp), dtype))
    state_shape = (num_layers * (1 + bidirectional), n, hidden)
    inputs = [x] + [data.draw(near(state_shape, dtype)) for _ in range(has_state * (1 + (kind == "LSTM")))]
    if has_lengths and data.draw(st.integers(0, 3)):
        lengths = _rng(data).integers(1, steps + 1, size=n).astype(np.int64)
        inputs.append(layout(lengths, data.draw(st.sampled_from(LAYOUTS))))
    elif has_lengths:  # 0, -1 or steps + 1, a wrong shape or dtype
        inputs.append(data.draw(near((n,), "int64", lo=steps + 1)))
    out = check_predict(net, ref, inputs, dtype, names)
    if out is not None and not states_out and data.draw(st.booleans()):
        x0 = [fill(_rng(data), a.shape, dtype) if a.dtype.kind == "f" else a for a in inputs]
        check_step(net, ref, x0, inputs, names, _rng(data))



def test_refused_input_of_several_is_named_by_position():
    net = _Attend(tl.nn.MultiheadAttention(4, 2, batch_first=True), ("attn",), False, False)
    x = np.zeros((1, 3, 4), np.float32)
    with pytest.raises(TypeError, match=r"predict \(input 3 of 4\): unsupported dtype bool"):
        net.predict([x, x, x, np.zeros((3, 3), bool)])
    strided = np.arange(24, dtype=np.float32).reshape(1, 3, 8)[..., ::2]  # copied once into C order
    mask = np.zeros((3, 3), np.float32)
    np.testing.assert_array_equal(net.predict((strided, x, x, mask)),
                                  net.predict((np.ascontiguousarray(strided), x, x, mask)))
    with pytest.raises(TypeError, match=r"^predict: unsupported dtype bool"):  # one input: as before
        tl.nn.Sequential(tl.nn.Linear(2, 2)).predict([np.zeros((1, 2), bool)])
