"""MultiheadAttention's kdim / vdim / add_bias_kv / add_zero_attn (the composed layer), against torch
in float64: state_dict names and order, outputs, attention weights (averaged and per head), masks, and
every parameter gradient."""
import numpy as np
import pytest
import torch

import treadle as tl
from opcheck import assert_grads_like_torch

E, H, L, S, N = 8, 2, 3, 5, 2
OPTIONS = [{"kdim": 3, "vdim": 6}, {"add_bias_kv": True}, {"add_zero_attn": True},
           {"kdim": 4, "vdim": 4, "add_bias_kv": True, "add_zero_attn": True, "bias": False}]


def _wrap(mha, average):
    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = mha

        def forward(self, q, k, v, kpm, mask):
            out, w = self.attn(q, k, v, key_padding_mask=kpm, attn_mask=mask, average_attn_weights=average)
            return out, w

    return Net()


def _compare_with_torch(net, ref, arrays, average, rng):
    """Outputs and attention weights of `net` (the layer wrapped by _wrap) against torch's `ref` on
    (q, k, v, key_padding_mask, attn_mask), then every parameter gradient of sum(out * seed); returns the
    weights."""
    q, k, v, kpm, mask = arrays
    t_out, t_w = ref(*(torch.tensor(a) for a in (q, k, v)), key_padding_mask=torch.tensor(kpm),
                     attn_mask=torch.tensor(mask), average_attn_weights=average)
    out, w = net.eval()(*arrays)
    np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(w, t_w.detach().numpy(), rtol=1e-11, atol=1e-12)
    seed = rng.standard_normal(t_out.shape)
    trainer = tl.Trainer(net, lambda outs, y: (outs[0] * y).sum(), tl.optim.SGD(lr=0.0))
    trainer.compute_gradients(list(arrays), seed)
    (t_out * torch.tensor(seed)).sum().backward()
    assert_grads_like_torch(net, ref, prefix="attn.")
    return w


@pytest.mark.parametrize("kw", OPTIONS)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("average", [True, False])
def test_options_match_torch(kw, batch_first, average):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=batch_first, **kw).double()
    mha = tl.nn.MultiheadAttention(E, H, batch_first=batch_first, dtype=torch.float64, **kw)
    net = _wrap(mha, average)
    assert [n for n, _ in net.named_parameters()] == ["attn." + n for n, _ in ref.named_parameters()]
    tl.io.from_torch(ref, mha)  # names equal: load the torch layer's state into the composed one
    rng = np.random.default_rng(1)
    kd, vd = kw.get("kdim", E), kw.get("vdim", E)
    seq = (lambda t, n, d: (n, t, d)) if batch_first else (lambda t, n, d: (t, n, d))
    q, k, v = (rng.standard_normal(seq(t, N, d)) for t, d in ((L, E), (S, kd), (S, vd)))
    kpm = np.zeros((N, S))
    kpm[1, -1] = -np.inf
    mask = 0.1 * rng.standard_normal((L, S))
    _compare_with_torch(net, ref, (q, k, v, kpm, mask), average, rng)


def test_plain_options_stay_native_and_bad_sizes_are_named():
    assert type(tl.nn.MultiheadAttention(E, H, kdim=E, vdim=E)) is tl.nn.MultiheadAttention
    with pytest.raises(ValueError, match="multiple of num_heads"):
        tl.nn.MultiheadAttention(7, 2, kdim=3)
    with pytest.raises(ValueError, match="set_backend"):
        tl.nn.MultiheadAttention(E, H, add_zero_attn=True, device="cuda")


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_layer_gives_per_head_weights(batch_first, bias):
    """average_attn_weights=False on the plain (fused) layer: the composed forward on its parameters."""
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(E, H, bias=bias, batch_first=batch_first).double()
    mha = tl.nn.MultiheadAttention(E, H, bias=bias, batch_first=batch_first, dtype=torch.float64)
    assert type(mha) is tl.nn.MultiheadAttention
    net = _wrap(mha, False)
    tl.io.from_torch(ref, mha)
    rng = np.random.default_rng(3)
    shape = (N, L, E) if batch_first else (L, N, E)
    q = rng.standard_normal(shape)
    kv = rng.standard_normal((N, L, E) if batch_first else (L, N, E))
    kpm, mask = np.zeros((N, L)), 0.1 * rng.standard_normal((L, L))
    w = _compare_with_torch(net, ref, (q, kv, kv, kpm, mask), False, rng)
    assert w.shape == (N, H, L, L)


def test_fused_layer_per_head_weights_unbatched():
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(E, H).double()
    mha = tl.nn.MultiheadAttention(E, H, dtype=torch.float64)

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = mha

        def forward(self, x):
            return self.attn(x, x, x, average_attn_weights=False)

    net = Net()
    tl.io.from_torch(ref, mha)
    x = np.random.default_rng(4).standard_normal((L, E))
    out, w = net.eval()(x)
    t_out, t_w = ref(*(torch.tensor(x),) * 3, average_attn_weights=False)
    np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(w, t_w.detach().numpy(), rtol=1e-11, atol=1e-12)
