"""fp16 compute for matrix products and convolutions (node attribute precision="fp16", or
Model.set_precision("fp16") for a whole model): both operands rounded to IEEE binary16 (nearest
even, subnormals kept, beyond the range +-Inf, NaN stays NaN), float32 accumulation, float32 results;
the gradient rules' products and convolutions likewise.

The reference is PyTorch computing the same definition: operands `.half().float()`, then float32
math (a torch autograd function rounds the operands of each product and its output gradient in the
backward pass). The only difference left is the float32 summation order (~1e-6 relative). Loss
scaling, which fp16 training needs, is tested in tests/test_loss_scaling.py.
"""
import numpy as np
import pytest
import torch

import treadle as tl
from opcheck import BACKENDS, run

F32 = np.float32
HAS_ONEDNN = "onednn" in tl.backends()


def h(t):
    """A torch tensor's values rounded to fp16, as float32."""
    return t.half().float()


class HalfOperandMatmul(torch.autograd.Function):
    """a @ b in the fp16 definition: rounded operands, float32 products; in the backward pass the
    output gradient and the operands are rounded too (dA = h(dY) h(B)^T, dB = h(A)^T h(dY))."""

    @staticmethod
    def forward(ctx, a, b):
        a16, b16 = h(a), h(b)
        ctx.save_for_backward(a16, b16)
        return a16 @ b16

    @staticmethod
    def backward(ctx, g):
        a16, b16 = ctx.saved_tensors
        g16 = h(g)
        return g16 @ b16.mT, a16.mT @ g16


def mm16(a, b):
    return HalfOperandMatmul.apply(a, b)


def rel_err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(got - ref)) / max(1e-30, np.max(np.abs(ref))))


def assert_same_specials_and_close(got, ref, what, rtol=1e-5):
    """Inf/NaN at the same places (with the same signs), the finite rest within rtol of its scale."""
    got, ref = np.asarray(got), np.asarray(ref)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"{what}: NaN positions")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref), err_msg=f"{what}: +Inf positions")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref), err_msg=f"{what}: -Inf positions")
    fin = np.isfinite(ref)
    if fin.any():
        err = rel_err(got[fin], ref[fin])
        assert err < rtol, f"{what}: {err:.2e} relative"


def randn(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(F32)


# ---- the rounding itself -------------------------------------------------------------------------

def special_values():
    v = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e5, -1e9, np.inf, -np.inf, np.nan,
         2.0 ** -14, 2.0 ** -14 * (1 - 2 ** -11), 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 3 * 2.0 ** -26,
         5 * 2.0 ** -26, 2.0 ** -26, 1e-7, -1e-7, 6e-8, 1e-30, 1e-40, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11,
         2048.0 + 1.0, 2048.0 + 3.0, 3.4e38, 0.1, 1 / 3]
    return np.array(v, dtype=F32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_operand_rounding_equals_torch_half_bitwise(backend):
    """linear(x, [[1]]) returns the rounded x itself: compared bitwise with torch's float -> half
    conversion on special values (ties, the fp16 range's edge, subnormals, Inf, NaN) and on 2^18
    random float32 bit patterns of every exponent."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(F32)
    near = (rng.standard_normal(1 << 16) * 2.0 ** rng.integers(-30, 18, 1 << 16)).astype(F32)
    x = np.concatenate([special_values(), bits, near]).reshape(-1, 1)
    (y,), _ = run("linear", [x, np.ones((1, 1), F32)], {"precision": "fp16"}, None, backend)
    ref = h(torch.from_numpy(x)).numpy()
    same = (y == ref) | (np.isnan(y) & np.isnan(ref))
    assert same.all(), f"first mismatches: x={x[~same][:5]}, got {y[~same][:5]}, torch {ref[~same][:5]}"
    assert np.isinf(y[x[:, 0] == F32(65520.0)]).all() and y[x[:, 0] == F32(65519.99)][0] == 65504.0
    assert y[x[:, 0] == F32(2.0 ** -25)][0] == 0.0 and y[x[:, 0] == F32(3 * 2.0 ** -26)][0] == F32(2.0 ** -24)


# ---- products: linear, matmul, bmm, forward and gradients -----------------------------------------

LINEAR = [("linear-bias", "linear", [(30, 17), (11, 17), (11,)], {}),
          ("linear-nobias", "linear", [(16, 12), (9, 12)], {}),
          ("linear-3d", "linear", [(3, 7, 13), (5, 13), (5,)], {})]
MATMUL = [(f"matmul-{ta}{tb}", "matmul", [((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))],
           {"trans_a": ta, "trans_b": tb})
          for ta in (0, 1) for tb in (0, 1) for (m, k, n) in [(19, 23, 14)]]
BMM = [(f"bmm-{ta}{tb}", "bmm", [((b, k, m) if ta else (b, m, k)), ((b, n, k) if tb else (b, k, n))],
        {"trans_a": ta, "trans_b": tb})
       for ta in (0, 1) for tb in (0, 1) for (b, m, k, n) in [(4, 9, 12, 7)]]
PRODUCTS = LINEAR + MATMUL + BMM


def torch_product(op, inputs, attrs, gy):
    """Forward and input gradients of the fp16 definition in torch (float32 math)."""
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    if op == "linear":
        x, w = ts[0], ts[1]
        y = mm16(x.reshape(-1, x.shape[-1]), w.T).reshape(*x.shape[:-1], w.shape[0])
        if len(ts) == 3:
            y = y + ts[2]
    else:
        a = ts[0].mT if attrs.get("trans_a") else ts[0]
        b = ts[1].mT if attrs.get("trans_b") else ts[1]
        y = mm16(a, b)
    y.backward(torch.tensor(gy))
    return y.detach().numpy(), [t.grad.numpy() for t in ts]


def product_case(case, rng, scale=(1.0, 1.0)):
    _, op, shapes, attrs = case
    x = [randn(rng, *s, scale=sc) for s, sc in zip(shapes, list(scale) + [1.0] * (3 - len(scale)))]
    (y,), _ = run(op, x, attrs, None, "eigen")
    return op, x, dict(attrs, precision="fp16"), randn(rng, *y.shape)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", PRODUCTS, ids=[c[0] for c in PRODUCTS])
def test_fp16_products_and_gradients_match_torch(case, backend):
    seed = int(np.random.SeedSequence().entropy % 2**63)  # fresh inputs every run, named on failure
    op, x, attrs, gy = product_case(case, np.random.default_rng(seed))
    (y,), grads = run(op, x, attrs, [gy], backend)
    ref_y, ref_grads = torch_product(op, x, attrs, gy)
    for i, (got, ref) in enumerate(zip([y] + grads, [ref_y] + ref_grads)):
        assert got.dtype == F32 and got.shape == ref.shape
        err = rel_err(got, ref)
        assert err < 1e-5, f"{case[0]} output/grad {i} on {backend}: {err:.2e} relative (seed {seed})"
    (y32,), _ = run(op, x, {k: v for k, v in attrs.items() if k != "precision"}, None, backend)
    # fp16 keeps 11 significant bits (relative rounding 2^-12 per operand): N(0, 1) products differ
    # from float32 by ~1e-4 of their scale.
    assert 1e-6 < rel_err(y, y32) < 3e-3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [LINEAR[0], MATMUL[1], BMM[2]], ids=lambda c: c[0])
def test_operands_beyond_the_fp16_range_give_inf(case, backend):
    """Operands from 65520 up round to Inf (so their products are Inf, or NaN against a 0 or an
    opposite Inf), as do gradients; products of in-range operands may exceed 65504 freely, since
    accumulation and results are float32."""
    op, x, attrs, gy = product_case(case, np.random.default_rng(1))
    x[0].flat[[0, 40]] = 7e4   # Inf in fp16
    x[0].flat[100] = -1e6      # -Inf in fp16
    x[1].flat[::5] = 6e4       # in range
    gy.flat[[5, 77]] = 1e5     # the output gradient overflows too: Inf/NaN in the gradients
    (y,), grads = run(op, x, attrs, [gy], backend)
    ref_y, ref_grads = torch_product(op, x, attrs, gy)
    assert np.isinf(y).any() and np.isfinite(y).any()
    for i, (got, ref) in enumerate(zip([y] + grads[:2], [ref_y] + ref_grads[:2])):
        assert_same_specials_and_close(got, ref, f"{case[0]} output/grad {i}")
    # With x[0] in range too, products reach ~1e5, beyond fp16's range, in float32.
    x[0] = np.clip(x[0], -2, 2)
    (y,), _ = run(op, x, attrs, None, backend)
    assert np.isfinite(y).all() and np.abs(y).max() > 65504


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [LINEAR[0], MATMUL[2], BMM[1]], ids=lambda c: c[0])
def test_subnormal_operands_are_kept(case, backend):
    """Operands of ~1e-6 are fp16 subnormals (below 2^-14 = 6.1e-5): kept with their coarse
    spacing of 2^-24, not flushed to zero, and 2^-25 and below rounds to zero."""
    rng = np.random.default_rng(2)
    op, x, attrs, gy = product_case(case, rng, scale=(1e-6, 1.0, 1e-6))
    x[0].flat[::9] = 2.0 ** -26  # below half the smallest subnormal: zero
    (y,), grads = run(op, x, attrs, [gy], backend)
    ref_y, ref_grads = torch_product(op, x, attrs, gy)
    for i, (got, ref) in enumerate(zip([y] + grads, [ref_y] + ref_grads)):
        assert rel_err(got, ref) < 1e-5, f"{case[0]} output/grad {i}"
    assert np.abs(y).max() > 0
    (y32,), _ = run(op, x, {k: v for k, v in attrs.items() if k != "precision"}, None, backend)
    assert 1e-3 < rel_err(y, y32) < 0.2  # 11 bits only near 6e-5; at 1e-6 about 4 remain


# ---- convolutions ----------------------------------------------------------------------------------

CONVS = [("conv2d-bias", (3, 3, 9, 8), (6, 3, 3, 3), {"padding": [1, 1]}),
         ("conv2d-stride-groups", (2, 4, 10, 9), (6, 2, 3, 3), {"stride": [2, 2], "groups": 2}),
         ("conv1d", (4, 3, 20), (5, 3, 5), {"padding": [2]}),
         ("conv3d", (2, 2, 5, 5, 4), (3, 2, 3, 3, 3), {"padding": [1, 1, 1]})]


def torch_conv(x, w, b, attrs, gy):
    """The fp16 convolution and its data and weight gradients in torch: autograd through a
    convolution of rounded leaves with a rounded output gradient gives exactly dX = conv^T(h(dY), h(W))
    and dW = corr(h(X), h(dY))."""
    nd = x.ndim - 2
    conv = getattr(torch.nn.functional, f"conv{nd}d")
    tx, tw = h(torch.tensor(x)).requires_grad_(), h(torch.tensor(w)).requires_grad_()
    y = conv(tx, tw, torch.tensor(b), stride=tuple(attrs.get("stride", [1] * nd)),
             padding=tuple(attrs.get("padding", [0] * nd)), groups=attrs.get("groups", 1))
    y.backward(h(torch.tensor(gy)))
    db = gy.astype(np.float64).sum(axis=tuple(i for i in range(gy.ndim) if i != 1))
    return y.detach().numpy(), [tx.grad.numpy(), tw.grad.numpy(), db]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CONVS, ids=[c[0] for c in CONVS])
def test_fp16_conv_and_gradients_match_torch(case, backend):
    seed = int(np.random.SeedSequence().entropy % 2**63)
    _, xs, ws, attrs = case
    rng = np.random.default_rng(seed)
    x, w, b = (randn(rng, *s) for s in (xs, ws, (ws[0],)))
    (y32,), _ = run("conv", [x, w, b], attrs, None, "eigen")
    gy = randn(rng, *y32.shape)
    (y,), grads = run("conv", [x, w, b], dict(attrs, precision="fp16"), [gy], backend)
    ref_y, ref_grads = torch_conv(x, w, b, attrs, gy)
    for i, (got, ref) in enumerate(zip([y] + grads, [ref_y] + ref_grads)):
        assert got.dtype == F32 and got.shape == ref.shape
        err = rel_err(got, ref)
        assert err < 1e-5, f"{case[0]} output/grad {i} on {backend}: {err:.2e} relative (seed {seed})"
    assert 1e-6 < rel_err(y, y32) < 3e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp16_conv_overflow_and_subnormals(backend):
    _, xs, ws, attrs = CONVS[0]
    rng = np.random.default_rng(3)
    x, w, b = randn(rng, *xs, scale=1e-6), randn(rng, *ws), randn(rng, ws[0])
    # Inf operands, away from the borders: the Eigen weight gradient (float32 too) turns an Inf at a
    # border into NaN in kernel taps that never read it (zero padding times Inf), where torch stays finite.
    x[0, 0, 4, 4] = x[1, 2, 5, 3] = 8e4
    (y32,), _ = run("conv", [x, w, b], attrs, None, "eigen")
    gy = randn(rng, *y32.shape)
    (y,), grads = run("conv", [x, w, b], dict(attrs, precision="fp16"), [gy], backend)
    ref_y, ref_grads = torch_conv(x, w, b, attrs, gy)
    assert np.isinf(y).any() and np.isfinite(y).any()
    for i, (got, ref) in enumerate(zip([y] + grads[:2], [ref_y] + ref_grads[:2])):
        assert_same_specials_and_close(got, ref, f"conv output/grad {i}")


# ---- attention: the projections and both bmm of MultiheadAttention ------------------------------------

def torch_attention(x, params, heads, gy):
    """Self-attention (batch first) in the fp16 definition: every product through mm16."""
    t = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tx = torch.tensor(x, requires_grad=True)
    n, length, e = x.shape
    d = e // heads
    qkv = mm16(tx.reshape(-1, e), t["in_proj_weight"].T).reshape(n, length, 3 * e) + t["in_proj_bias"]

    def split(z):
        return z.reshape(n, length, heads, d).permute(0, 2, 1, 3).reshape(n * heads, length, d)

    q, k, v = (split(qkv[..., i * e:(i + 1) * e]) for i in range(3))
    p = torch.softmax(mm16(q, k.mT) * (1.0 / np.sqrt(d)), dim=-1)
    o = mm16(p, v).reshape(n, heads, length, d).permute(0, 2, 1, 3).reshape(n * length, e)
    y = (mm16(o, t["out_proj.weight"].T) + t["out_proj.bias"]).reshape(n, length, e)
    y.backward(torch.tensor(gy))
    return y.detach().numpy(), tx.grad.numpy(), {k: v.grad.numpy() for k, v in t.items()}


class SelfAttention(tl.nn.Module):
    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, need_weights=False)[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_in_fp16_matches_torch(backend):
    rng = np.random.default_rng(4)
    x = randn(rng, 3, 10, 16)
    tl.manual_seed(5)
    net = SelfAttention(tl.nn.MultiheadAttention(16, 4, batch_first=True))
    net.load_state_dict({k: v + randn(rng, *v.shape, scale=0.1) for k, v in net.state_dict().items()})
    net.set_backend(backend).set_precision("fp16")
    params = {k[len("mha."):]: v.copy() for k, v in net.state_dict().items()}
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    y = trainer.forward(x)
    gy = randn(rng, *y.shape)
    trainer.backward(gy)
    ref_y, _, ref_grads = torch_attention(x, params, 4, gy)
    # Values chained through several products: a float32 difference in an intermediate can put it on
    # the other side of an fp16 rounding boundary (one fp16 ulp, 2^-11 relative, on that element).
    assert rel_err(y, ref_y) < 1e-5
    grads = net.named_gradients()
    for name, ref in ref_grads.items():
        assert rel_err(grads["mha." + name], ref) < 1e-4, name
    y32 = net.set_precision("float32").predict(x)
    assert rel_err(y, y32) > 1e-6


# ---- whole models: Model.set_precision("fp16") ------------------------------------------------------

def mlp(seed, widths=(40, 96, 96, 7)):
    tl.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        if i:
            layers.append(tl.nn.Tanh())
        layers.append(tl.nn.Linear(a, b))
    return tl.nn.Sequential(*layers)


def test_precision_names_and_errors():
    x, w = np.ones((4, 3), F32), np.ones((2, 3), F32)
    with pytest.raises(ValueError, match=r"linear: unknown precision 'fp8' \(expected 'float32', 'bf16' or 'fp16'\)"):
        run("linear", [x, w], {"precision": "fp8"})
    with pytest.raises(TypeError, match="matmul: precision 'fp16' needs float32 operands, got float64"):
        run("matmul", [x.astype(np.float64), np.ones((3, 2))], {"precision": "fp16"})
    with pytest.raises(TypeError, match="conv: precision 'fp16' needs float32 operands, got float64"):
        run("conv", [np.ones((1, 1, 4, 4)), np.ones((1, 1, 3, 3))], {"precision": "fp16"})
    net = mlp(0)
    with pytest.raises(ValueError, match="Model.set_precision: unknown precision 'half' "
                                         r"\(expected 'float32', 'bf16' or 'fp16'\)"):
        net.set_precision("half")
    net.to("float64")
    with pytest.raises(TypeError, match="Model.set_precision: precision 'fp16' needs a float32 model, got float64"):
        net.set_precision("fp16")
    net.to("float32").set_precision("fp16")
    assert net._compiled().precision == "fp16"
    with pytest.raises(TypeError, match="Model.to: precision 'fp16' needs float32 parameters"):
        net.to("float64")


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_forward_and_gradients_in_fp16_match_torch(backend):
    """A two-layer MLP's prediction and one step's parameter gradients against torch with every
    product through mm16."""
    rng = np.random.default_rng(6)
    x, t = randn(rng, 64, 40), randn(rng, 64, 7)
    net = mlp(7, widths=(40, 48, 7)).set_backend(backend).set_precision("fp16")
    params = {k: torch.tensor(v, requires_grad=True) for k, v in net.state_dict().items()}
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    loss = trainer.step(x, t)
    hid = torch.tanh(mm16(torch.tensor(x), params["0.weight"].T) + params["0.bias"])
    y = mm16(hid, params["2.weight"].T) + params["2.bias"]
    ref_loss = torch.nn.functional.mse_loss(y, torch.tensor(t))
    ref_loss.backward()
    assert abs(loss - ref_loss.item()) < 1e-5 * ref_loss.item()
    np.testing.assert_allclose(net.predict(x), y.detach().numpy(), rtol=1e-5, atol=1e-5 * y.abs().max().item())
    grads = net.named_gradients()
    for name, p in params.items():
        assert rel_err(grads[name], p.grad.numpy()) < 1e-4, name  # chained: see the attention test


def test_plan_listing_marks_fp16_products():
    net = mlp(3, widths=(8, 16, 4)).set_precision("fp16")
    x, y = np.ones((5, 8), F32), np.zeros((5, 4), F32)
    tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1)).step(x, y)
    lines = net._compiled().describe_plans().splitlines()
    products = [ln for ln in lines if ln.split()[1] in ("linear", "matmul")]
    assert len(products) >= 5 and all(ln.split()[3] == "fp16" for ln in products), lines
    assert not any(" bf16" in ln for ln in lines)


@pytest.mark.skipif(not HAS_ONEDNN, reason="treadle was built without oneDNN")
def test_onednn_declines_fp16_nodes_and_eigen_takes_them():
    rng = np.random.default_rng(8)
    x, w, b = randn(rng, 300, 70), randn(rng, 500, 70), randn(rng, 500)
    gy = randn(rng, 300, 500)
    attrs = {"precision": "fp16"}
    plan = tl._core.describe_op("linear", [x, w, b], attrs, [gy], "onednn")
    products = [ln for ln in plan.splitlines() if ln.split()[1] in ("linear", "matmul")]
    assert products and all("[eigen]" in ln for ln in products), plan
    fast, ref = run("linear", [x, w, b], attrs, [gy], "onednn"), run("linear", [x, w, b], attrs, [gy], "eigen")
    for a, r in zip(fast[0] + fast[1], ref[0] + ref[1]):
        np.testing.assert_array_equal(a, r)


def curve(precision, epochs=20):
    rng = np.random.default_rng(0)
    x, y = randn(rng, 256, 40), rng.integers(0, 7, 256)
    trainer = tl.Trainer(mlp(3).set_precision(precision), tl.loss.CrossEntropy(), tl.optim.Adam(lr=3e-3))
    return np.array([trainer.fit(x, y, epochs=1, batch_size=64, shuffle=False)["loss"][-1] for _ in range(epochs)])


def test_training_in_fp16_follows_float32():
    """The bf16 test's MLP (tests/test_bf16.py) trained 20 epochs in fp16, without and with dynamic
    loss scaling. Measured: within 1.0e-4 relative of the float32 curve either way (bf16: 4.3e-4;
    fp16 keeps 3 more bits), loss 1.95 -> 0.82; asserted 5e-4. At the default scale 65536 no step
    overflows (gradients stay below 1/64 per sample), and the scaled run differs from the unscaled
    one only where a gradient operand below 2^-14 became a normal fp16 number."""
    f32, h16 = curve("float32"), curve("fp16")
    np.testing.assert_allclose(h16, f32, rtol=5e-4)
    assert h16[-1] < 0.7 * h16[0] and not np.array_equal(h16, f32)
    rng = np.random.default_rng(0)
    x, y = randn(rng, 256, 40), rng.integers(0, 7, 256)
    trainer = tl.Trainer(mlp(3).set_precision("fp16"), tl.loss.CrossEntropy(), tl.optim.Adam(lr=3e-3),
                         loss_scale="dynamic")
    scaled = np.array([trainer.fit(x, y, epochs=1, batch_size=64, shuffle=False)["loss"][-1] for _ in range(20)])
    np.testing.assert_allclose(scaled, f32, rtol=5e-4)
    assert not np.array_equal(scaled, h16)
    assert trainer.skipped_steps == 0 and trainer.loss_scale == 65536.0 and trainer.steps == 80


def test_c_api_accepts_fp16():
    """treadle_model_set_precision(model, "fp16") through the library this Python module loaded."""
    import ctypes

    libs = [line.split()[-1] for line in open("/proc/self/maps") if "libtreadle.so" in line]
    if not libs:
        pytest.skip("the core is linked statically into the Python module")
    lib = ctypes.CDLL(libs[0])
    lib.treadle_last_error.restype = ctypes.c_char_p
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    desc = b'{"type":"Sequential","layers":[{"type":"Linear","config":{"in_features":3,"out_features":2}}]}'
    model, model64 = ptr(), ptr()
    assert lib.treadle_model_from_json(desc, 0, ctypes.c_uint64(0), ctypes.byref(model)) == 0, lib.treadle_last_error()
    x = (np.arange(12, dtype=F32).reshape(4, 3) - 5.5) / 3.7
    shape = (ctypes.c_int64 * 2)(4, 3)
    y32, y16 = np.zeros((4, 2), F32), np.zeros((4, 2), F32)
    assert lib.treadle_model_predict(model, x.ctypes.data_as(ptr), 2, shape, y32.ctypes.data_as(ptr), i64(8)) == 0
    assert lib.treadle_model_set_precision(model, b"fp16") == 0, lib.treadle_last_error()
    assert lib.treadle_model_predict(model, x.ctypes.data_as(ptr), 2, shape, y16.ctypes.data_as(ptr), i64(8)) == 0
    assert 0 < rel_err(y16, y32) < 3e-3
    assert lib.treadle_model_set_precision(model, b"fp8") == 1  # TREADLE_ERROR_VALUE
    assert b"expected 'float32', 'bf16' or 'fp16'" in lib.treadle_last_error()
    assert lib.treadle_model_from_json(desc, 1, ctypes.c_uint64(0), ctypes.byref(model64)) == 0
    assert lib.treadle_model_set_precision(model64, b"fp16") == 2  # TREADLE_ERROR_TYPE
    assert b"precision 'fp16' needs a float32 model" in lib.treadle_last_error()
    lib.treadle_model_free(model)
    lib.treadle_model_free(model64)
