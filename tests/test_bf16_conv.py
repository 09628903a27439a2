"""bf16 compute for convolutions (conv, and its data and weight gradients; precision="bf16", or
Model.set_precision("bf16")): both operands rounded to bfloat16, float32 accumulation and results.

Checked against a float64 reference on the rounded operands (PyTorch autograd in float64: dx and dW
come out of the same rounded operands as the definition says), on every built backend, plus the
model-level rewrite (convolutions and transposed convolutions marked bf16) and a training curve.
"""
import numpy as np
import pytest

import treadle as tl
from opcheck import BACKENDS, run

F32 = np.float32


def bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), as float64."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(F32).astype(np.float64)


def rel_err(got, ref):
    return float(np.max(np.abs(got - ref)) / max(1e-30, np.max(np.abs(ref))))


# (id, x shape, w shape, attrs)
CASES = [("conv2d-bias", (4, 3, 11, 9), (8, 3, 3, 3), {"padding": [1, 1]}),
         ("conv2d-stride-groups", (3, 4, 12, 10), (6, 2, 3, 3), {"stride": [2, 2], "groups": 2}),
         ("conv1d", (5, 3, 30), (7, 3, 5), {"padding": [2]}),
         ("conv3d", (2, 2, 6, 5, 4), (3, 2, 3, 3, 3), {"padding": [1, 1, 1]})]


def torch_reference(x, w, b, attrs, gy):
    import torch

    nd = x.ndim - 2
    conv = getattr(torch.nn.functional, f"conv{nd}d")
    tx = torch.tensor(bf16(x), requires_grad=True)
    tw = torch.tensor(bf16(w), requires_grad=True)
    y = conv(tx, tw, torch.tensor(b.astype(np.float64)), stride=tuple(attrs.get("stride", [1] * nd)),
             padding=tuple(attrs.get("padding", [0] * nd)), groups=attrs.get("groups", 1))
    y.backward(torch.tensor(bf16(gy)))
    db = gy.astype(np.float64).sum(axis=tuple(i for i in range(gy.ndim) if i != 1))
    return y.detach().numpy(), [tx.grad.numpy(), tw.grad.numpy(), db]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bf16_conv_and_gradients_match_rounded_reference(case, backend):
    seed = int(np.random.SeedSequence().entropy % 2**63)  # fresh inputs every run, named on failure
    _, xs, ws, attrs = case
    rng = np.random.default_rng(seed)
    x, w, b = (rng.standard_normal(s).astype(F32) for s in (xs, ws, (ws[0],)))
    (y32,), _ = run("conv", [x, w, b], attrs, None, "eigen")
    gy = rng.standard_normal(y32.shape).astype(F32)
    (y,), grads = run("conv", [x, w, b], dict(attrs, precision="bf16"), [gy], backend)
    ref_y, ref_grads = torch_reference(x, w, b, attrs, gy)
    for i, (got, ref) in enumerate(zip([y] + grads, [ref_y] + ref_grads)):
        assert got.dtype == F32 and got.shape == ref.shape
        err = rel_err(got, ref)
        assert err < 2e-6, f"{case[0]} output/grad {i} on {backend}: {err:.2e} relative (seed {seed})"
    # and it is not the float32 convolution: bf16 keeps 8 significant bits
    assert 1e-5 < rel_err(y, y32) < 3e-2


def test_bf16_conv_refuses_float64():
    x, w = np.ones((1, 1, 4, 4)), np.ones((1, 1, 3, 3))
    with pytest.raises(TypeError, match="conv: precision 'bf16' needs float32 operands, got float64"):
        run("conv", [x, w], {"precision": "bf16"})


def cnn(seed):
    tl.manual_seed(seed)
    return tl.nn.Sequential(tl.nn.Conv2d(1, 6, 3, padding=1), tl.nn.ReLU(), tl.nn.MaxPool2d(2),
                            tl.nn.ConvTranspose2d(6, 4, 2, stride=2), tl.nn.Tanh(), tl.nn.Flatten(),
                            tl.nn.Linear(4 * 12 * 12, 5))


def test_model_precision_marks_convolutions_and_transposed_convolutions():
    net = cnn(0).set_precision("bf16")
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 1, 12, 12)).astype(F32), rng.integers(0, 5, 16)
    out16, out32 = net.predict(x), cnn(0).predict(x)
    np.testing.assert_allclose(out16, out32, rtol=0, atol=3e-2 * np.abs(out32).max())
    assert rel_err(out16, out32) > 1e-5
    trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-3))
    trainer.step(x, y)
    lines = net._compiled().describe_plans().splitlines()
    convs = [ln for ln in lines if ln.split()[1].startswith("conv") and ln.split()[1] != "conv_backward_bias"]
    assert {ln.split()[1] for ln in convs} == {"conv", "conv_backward_data", "conv_backward_weight"}
    assert all(" bf16" in ln for ln in convs), "\n".join(convs)
    assert not any(" bf16" in ln for ln in lines if ln.split()[1] == "conv_backward_bias")


def test_bf16_cnn_training_curve_follows_float32():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((128, 1, 12, 12)).astype(F32), rng.integers(0, 5, 128)
    curves = {}
    for precision in ("float32", "bf16"):
        net = cnn(3).set_precision(precision)
        trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=3e-3))
        curves[precision] = np.array([trainer.fit(x, y, epochs=1, batch_size=32, shuffle=False)["loss"][-1]
                                      for _ in range(8)])
    assert curves["bf16"][-1] < 0.7 * curves["bf16"][0]
    np.testing.assert_allclose(curves["bf16"], curves["float32"], rtol=4e-2)
