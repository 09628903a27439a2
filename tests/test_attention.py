"""Attention: bmm / permute / causal mask ops, and MultiheadAttention against torch.nn.MultiheadAttention."""
import numpy as np
import pytest
import torch

import opcheck
import treadle as tl
from treadle import functional as F

DTYPES = ["float32", "float64"]


@pytest.mark.parametrize("backend", opcheck.BACKENDS)
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_bmm_gradcheck_and_torch(backend, ta, tb):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4, 5) if ta else (3, 5, 4))
    b = rng.standard_normal((3, 6, 4) if tb else (3, 4, 6))
    opcheck.gradcheck("bmm", [a, b], {"trans_a": ta, "trans_b": tb}, backend=backend)
    outs, _ = opcheck.run("bmm", [a, b], {"trans_a": ta, "trans_b": tb}, backend=backend)
    ref = (a.transpose(0, 2, 1) if ta else a) @ (b.transpose(0, 2, 1) if tb else b)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", opcheck.BACKENDS)
@pytest.mark.parametrize("dims", [[1, 0], [0, 2, 1], [2, 0, 1], [0, 2, 1, 3], [3, 1, 0, 2]])
def test_permute(backend, dims):
    rng = np.random.default_rng(2)
    x = rng.standard_normal([2, 3, 4, 5][: len(dims)])
    outs, _ = opcheck.run("permute", [x], {"dims": dims}, backend=backend)
    np.testing.assert_array_equal(outs[0], np.transpose(x, dims))
    opcheck.gradcheck("permute", [x], {"dims": dims}, backend=backend)


def test_permute_rejects_bad_dims():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match="permute"):
        opcheck.run("permute", [x], {"dims": [0, 0]})
    with pytest.raises(ValueError, match="permute"):
        opcheck.run("permute", [x], {"dims": [0, 1, 2]})


def test_causal_mask_values():
    outs, _ = opcheck.run("causal_mask", [], {"rows": 3, "cols": 4, "dtype": "float64"})
    expected = np.triu(np.full((3, 4), -np.inf), k=1)
    np.testing.assert_array_equal(outs[0], expected)


class SelfAttention(tl.nn.Module):
    def __init__(self, mha, causal=False):
        super().__init__()
        self.mha, self.causal = mha, causal

    def forward(self, x):
        return self.mha(x, is_causal=self.causal, need_weights=False)[0]


class CrossAttention(tl.nn.Module):
    """One input holding the query (first `lq` positions along the sequence) and the keys/values."""

    def __init__(self, mha, lq, axis):
        super().__init__()
        self.mha, self.lq, self.axis = mha, lq, axis

    def forward(self, x):
        n = x.shape[self.axis]
        q = F.slice(x, self.axis, 0, self.lq)
        kv = F.slice(x, self.axis, self.lq, n)
        return self.mha(q, kv, kv, need_weights=False)[0]


def make_pair(e, h, batch_first, dtype, bias=True):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first, dtype=getattr(torch, dtype))
    # Non-zero biases so every parameter matters.
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    mine = tl.nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first, dtype=dtype)
    return ref, mine


def torch_state(ref):
    return {k: v.detach().numpy() for k, v in ref.state_dict().items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_torch(dtype, batch_first, causal):
    e, h, n, length = 8, 2, 3, 5
    ref, mha = make_pair(e, h, batch_first, dtype)
    model = SelfAttention(mha, causal)
    model.load_state_dict({"mha." + k: v for k, v in torch_state(ref).items()})
    rng = np.random.default_rng(3)
    shape = (n, length, e) if batch_first else (length, n, e)
    x = rng.standard_normal(shape).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)

    tx = torch.tensor(x, requires_grad=True)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(length, dtype=tx.dtype) if causal else None
    ty, _ = ref(tx, tx, tx, need_weights=False, attn_mask=mask, is_causal=causal)
    ty.backward(torch.tensor(gy))

    tol = opcheck.tol(dtype)
    np.testing.assert_allclose(model.predict(x), ty.detach().numpy(), **tol)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    y = trainer.forward(x, input_grad=True)
    np.testing.assert_allclose(y, ty.detach().numpy(), **tol)
    gx = trainer.backward(gy, input_grad=True)
    np.testing.assert_allclose(gx, tx.grad.numpy(), **tol)
    grads = model.named_gradients()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads["mha." + name], p.grad.numpy(), **tol, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
def test_cross_attention_matches_torch(dtype, batch_first):
    e, h, n, lq, s = 6, 3, 2, 3, 4
    ref, mha = make_pair(e, h, batch_first, dtype)
    axis = 1 if batch_first else 0
    model = CrossAttention(mha, lq, axis)
    model.load_state_dict({"mha." + k: v for k, v in torch_state(ref).items()})
    rng = np.random.default_rng(4)
    shape = (n, lq + s, e) if batch_first else (lq + s, n, e)
    x = rng.standard_normal(shape).astype(dtype)
    tx = torch.tensor(x, requires_grad=True)
    q, kv = (tx[:, :lq], tx[:, lq:]) if batch_first else (tx[:lq], tx[lq:])
    ty, _ = ref(q, kv, kv, need_weights=False)
    gy = rng.standard_normal(ty.shape).astype(dtype)
    ty.backward(torch.tensor(gy))
    tol = opcheck.tol(dtype)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    np.testing.assert_allclose(trainer.forward(x, input_grad=True), ty.detach().numpy(), **tol)
    np.testing.assert_allclose(trainer.backward(gy, input_grad=True), tx.grad.numpy(), **tol)
    grads = model.named_gradients()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads["mha." + name], p.grad.numpy(), **tol, err_msg=name)


class MaskedAttention(tl.nn.Module):
    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x, key_padding_mask, attn_mask):
        return self.mha(x, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_masks_and_weights_match_torch(dtype):
    e, h, n, length = 8, 4, 2, 5
    ref, mha = make_pair(e, h, True, dtype)
    model = MaskedAttention(mha)
    model.load_state_dict({"mha." + k: v for k, v in torch_state(ref).items()})
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, length, e)).astype(dtype)
    pad = np.zeros((n, length), dtype=bool)
    pad[0, 3:] = True  # sample 0 has 3 valid keys
    attn = rng.standard_normal((length, length)).astype(dtype)
    kpm = np.where(pad, -np.inf, 0).astype(dtype)
    out, weights = model.predict([x, kpm, attn])
    ty, tw = ref(torch.tensor(x), torch.tensor(x), torch.tensor(x), key_padding_mask=torch.tensor(kpm),
                 attn_mask=torch.tensor(attn), need_weights=True)
    tol = opcheck.tol(dtype)
    np.testing.assert_allclose(out, ty.detach().numpy(), **tol)
    np.testing.assert_allclose(weights, tw.detach().numpy(), **tol)
    assert np.all(weights[0, :, 3:] == 0)


def test_parameter_names_and_init_match_torch():
    mha = tl.nn.MultiheadAttention(16, 4)
    ref = torch.nn.MultiheadAttention(16, 4)
    model = SelfAttention(mha)
    state = model.state_dict()
    assert sorted(k[len("mha."):] for k in state) == sorted(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert state["mha." + k].shape == tuple(v.shape)
    assert np.all(state["mha.in_proj_bias"] == 0) and np.all(state["mha.out_proj.bias"] == 0)
    bound = np.sqrt(6.0 / (16 + 48))
    w = state["mha.in_proj_weight"]
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        tl.nn.MultiheadAttention(10, 3)
    model = SelfAttention(tl.nn.MultiheadAttention(8, 2, batch_first=True))
    with pytest.raises(ValueError, match="MultiheadAttention: expected inputs of shape"):
        model.predict(np.zeros((2, 3, 7), np.float32))


class Encoder(tl.nn.Module):
    def __init__(self, layer, causal=False):
        super().__init__()
        self.layer, self.causal = layer, causal

    def forward(self, x):
        return F.mean(self.layer(x, is_causal=self.causal), 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer_matches_torch(dtype, norm_first, activation):
    d, h, ff, n, length = 16, 4, 32, 3, 6
    torch.manual_seed(1)
    ref = torch.nn.TransformerEncoderLayer(d, h, ff, dropout=0.0, activation=activation, batch_first=True,
                                           norm_first=norm_first, dtype=getattr(torch, dtype))
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    layer = tl.nn.TransformerEncoderLayer(d, h, ff, dropout=0.0, activation=activation, batch_first=True,
                                          norm_first=norm_first, dtype=dtype)
    model = Encoder(layer)
    state = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    assert list(k[len("layer."):] for k in model.state_dict()) == list(state)
    model.load_state_dict({"layer." + k: v for k, v in state.items()})
    rng = np.random.default_rng(6)
    x = rng.standard_normal((n, length, d)).astype(dtype)
    tx = torch.tensor(x, requires_grad=True)
    ty = ref(tx).mean(dim=1)
    gy = rng.standard_normal(ty.shape).astype(dtype)
    ty.backward(torch.tensor(gy))
    tol = opcheck.tol(dtype)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    np.testing.assert_allclose(trainer.forward(x, input_grad=True), ty.detach().numpy(), **tol)
    np.testing.assert_allclose(trainer.backward(gy, input_grad=True), tx.grad.numpy(), **tol)
    grads = model.named_gradients()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads["layer." + name], p.grad.numpy(), **tol, err_msg=name)


def test_mean_and_sum_ops():
    class Reduce(tl.nn.Module):
        def forward(self, x):
            return F.mean(x, 1) + F.sum(x, -2, keepdim=False) * 0.5

    x = np.random.default_rng(7).standard_normal((2, 5, 3)).astype(np.float32)  # no parameters: float32
    np.testing.assert_allclose(Reduce().predict(x), x.mean(1) + 0.5 * x.sum(1), rtol=1e-6)
