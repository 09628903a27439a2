"""Normalisation: layer_norm, rms_norm, group_norm, batch_norm ops and the LayerNorm, RMSNorm, GroupNorm,
BatchNorm1d/2d/3d layers.

Ops: forward, saved statistics and every gradient against PyTorch (float32 ~1e-5, float64 ~1e-12) and
float64 finite differences (all outputs seeded, so gradients through the statistics are checked too).
Layers: parameters, initialisation and state_dict keys as torch; training steps (batch statistics,
running statistics with momentum) and eval (running statistics) against torch; bad input.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import treadle as tl
from opcheck import BACKENDS, gradcheck, run, tol, torch_grads

DTYPES = [np.float32, np.float64]
DT_IDS = ["f32", "f64"]


def sample(shape, dtype, seed=0, scale=1.0, shift=0.0):
    rng = np.random.default_rng(seed)
    return (shift + scale * rng.standard_normal(shape)).astype(dtype)


def affine_params(shape, dtype, kind, seed=1):
    """Weight near 1 and bias near 0 (random, so that every element matters); kind: none, weight, both."""
    out = []
    if kind in ("weight", "both"):
        out.append(sample(shape, dtype, seed, 0.5, 1.0))
    if kind == "both":
        out.append(sample(shape, dtype, seed + 1, 0.5))
    return out


def fd_check(op, inputs, attrs, backend, wrt=None):
    """Finite differences with all outputs seeded; atol scaled to the rounding noise of the sums."""
    outs, _ = run(op, inputs, attrs, None, backend)
    noise = 1e-9 * max(1.0, sum(float(np.abs(o).sum()) for o in outs))
    gradcheck(op, inputs, attrs, wrt=wrt, atol=noise, backend=backend)


def compare_to_torch(op, inputs, attrs, torch_fn, backend, num_outputs, seed=5):
    """Forward and the gradient of every input for a seed on output 0 against torch; returns our outputs."""
    dtype = inputs[0].dtype
    outs, _ = run(op, inputs, attrs, None, backend)
    gy = sample(outs[0].shape, dtype, seed)
    outs, grads = run(op, inputs, attrs, [gy] + [None] * (num_outputs - 1), backend)
    wrt = list(range(len(inputs)))
    (ref,), ref_grads = torch_grads(torch_fn, inputs, [gy], wrt)
    np.testing.assert_allclose(outs[0], ref, **tol(dtype), err_msg=f"{op}: forward")
    for i in wrt:
        np.testing.assert_allclose(grads[i], ref_grads[i], **tol(dtype), err_msg=f"{op}: gradient of input {i}")
    return outs


# ---------------------------------------------------------------------------------------------- layer_norm
# (id, input shape, normalized dims, affine kind, eps)
LN_CASES = [
    ("2d_k1_affine", (4, 7), 1, "both", 1e-5),
    ("2d_k1_plain", (4, 7), 1, "none", 1e-5),
    ("2d_k1_weight_only", (4, 7), 1, "weight", 1e-5),
    ("4d_k2_affine", (2, 3, 4, 5), 2, "both", 1e-5),
    ("3d_k3_weight_eps", (2, 3, 4), 3, "weight", 1e-3),
    ("1d_k1_affine", (6,), 1, "both", 1e-5),
]


def ln_setup(case, dtype):
    _, shape, k, kind, eps = case
    x = sample(shape, dtype, 0, 2.0, 0.5)
    norm = shape[len(shape) - k:]
    return [x] + affine_params(norm, dtype, kind), {"normalized_ndim": k, "eps": eps}, tuple(norm), eps


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", LN_CASES, ids=[c[0] for c in LN_CASES])
def test_layer_norm_vs_torch(case, dtype, backend):
    inputs, attrs, norm, eps = ln_setup(case, dtype)
    outs = compare_to_torch("layer_norm", inputs, attrs, lambda x, *p: F.layer_norm(x, norm, *p, eps=eps), backend, 3)
    t = [torch.tensor(a) for a in inputs]
    _, mean, rstd = torch.native_layer_norm(t[0], norm, *(t[1:] + [None] * (3 - len(t))), eps)
    lead = inputs[0].shape[:inputs[0].ndim - len(norm)]
    np.testing.assert_allclose(outs[1], mean.reshape(lead).numpy(), **tol(dtype), err_msg="mean")
    np.testing.assert_allclose(outs[2], rstd.reshape(lead).numpy(), **tol(dtype), err_msg="rstd")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", LN_CASES, ids=[c[0] for c in LN_CASES])
def test_layer_norm_gradcheck(case, backend):
    inputs, attrs, _, _ = ln_setup(case, np.float64)
    fd_check("layer_norm", inputs, attrs, backend)


# ------------------------------------------------------------------------------------------------ rms_norm
RMS_CASES = [
    ("2d_k1_weight_default_eps", (4, 7), 1, "weight", None),
    ("2d_k1_plain_eps", (4, 7), 1, "none", 1e-6),
    ("4d_k2_weight", (2, 3, 4, 5), 2, "weight", 1e-5),
    ("3d_k3_plain_default_eps", (2, 3, 4), 3, "none", None),
]


def rms_setup(case, dtype):
    _, shape, k, kind, eps = case
    x = sample(shape, dtype, 0, 2.0, 0.5)
    norm = shape[len(shape) - k:]
    attrs = {"normalized_ndim": k} if eps is None else {"normalized_ndim": k, "eps": eps}
    return [x] + affine_params(norm, dtype, kind), attrs, tuple(norm), eps


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", RMS_CASES, ids=[c[0] for c in RMS_CASES])
def test_rms_norm_vs_torch(case, dtype, backend):
    inputs, attrs, norm, eps = rms_setup(case, dtype)
    outs = compare_to_torch("rms_norm", inputs, attrs, lambda x, *p: F.rms_norm(x, norm, *p, eps=eps), backend, 2)
    x = inputs[0].astype(np.float64)
    axes = tuple(range(x.ndim - len(norm), x.ndim))
    e = np.finfo(dtype).eps if eps is None else eps  # torch's default: the dtype's machine epsilon
    np.testing.assert_allclose(outs[1], 1 / np.sqrt((x * x).mean(axis=axes) + e), **tol(dtype), err_msg="rstd")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_default_eps_is_dtype_epsilon(backend):
    """With tiny inputs eps dominates: float32 must use finfo(float32).eps, float64 finfo(float64).eps."""
    for dtype in DTYPES:
        x = np.full((2, 3), 1e-5, dtype)
        (y, _), _ = run("rms_norm", [x], {"normalized_ndim": 1}, None, backend)
        ref = F.rms_norm(torch.tensor(x), (3,)).numpy()
        np.testing.assert_allclose(y, ref, **tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", RMS_CASES, ids=[c[0] for c in RMS_CASES])
def test_rms_norm_gradcheck(case, backend):
    inputs, attrs, _, _ = rms_setup(case, np.float64)
    fd_check("rms_norm", inputs, attrs, backend)


# ---------------------------------------------------------------------------------------------- group_norm
# (id, input shape, groups, affine, eps)
GN_CASES = [
    ("3d_g2", (2, 6, 5), 2, True, 1e-5),
    ("4d_g3", (2, 6, 3, 4), 3, True, 1e-5),
    ("2d_g1_plain", (3, 4), 1, False, 1e-5),
    ("3d_g_equals_c", (2, 6, 4), 6, True, 1e-3),
    ("4d_g2_plain", (2, 4, 2, 3), 2, False, 1e-5),
]


def gn_setup(case, dtype):
    _, shape, groups, affine, eps = case
    x = sample(shape, dtype, 0, 2.0, 0.5)
    return [x] + affine_params((shape[1],), dtype, "both" if affine else "none"), {"num_groups": groups, "eps": eps}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", GN_CASES, ids=[c[0] for c in GN_CASES])
def test_group_norm_vs_torch(case, dtype, backend):
    _, shape, groups, _, eps = case
    inputs, attrs = gn_setup(case, dtype)
    outs = compare_to_torch("group_norm", inputs, attrs, lambda x, *p: F.group_norm(x, groups, *p, eps=eps),
                            backend, 3)
    x = inputs[0].astype(np.float64).reshape(shape[0], groups, -1)
    np.testing.assert_allclose(outs[1], x.mean(axis=2), **tol(dtype), err_msg="mean")
    np.testing.assert_allclose(outs[2], 1 / np.sqrt(x.var(axis=2) + eps), **tol(dtype), err_msg="rstd")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", GN_CASES, ids=[c[0] for c in GN_CASES])
def test_group_norm_gradcheck(case, backend):
    inputs, attrs = gn_setup(case, np.float64)
    fd_check("group_norm", inputs, attrs, backend)


# ---------------------------------------------------------------------------------------------- batch_norm
BN_SHAPES = [(8, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 2, 2)]


def bn_setup(shape, dtype, affine):
    x = sample(shape, dtype, 0, 2.0, 0.5)
    return [x] + affine_params((shape[1],), dtype, "both" if affine else "none")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_training_vs_torch(shape, affine, dtype, backend):
    inputs = bn_setup(shape, dtype, affine)
    attrs = {"eps": 1e-5}
    fn = lambda x, *p: F.batch_norm(x, None, None, *p, training=True, eps=1e-5)  # noqa: E731
    outs = compare_to_torch("batch_norm", inputs, attrs, fn, backend, 3)
    axes = (0,) + tuple(range(2, len(shape)))
    x = inputs[0].astype(np.float64)
    np.testing.assert_allclose(outs[1], x.mean(axis=axes), **tol(dtype), err_msg="mean")
    np.testing.assert_allclose(outs[2], 1 / np.sqrt(x.var(axis=axes) + 1e-5), **tol(dtype), err_msg="rstd")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_eval_vs_torch(shape, affine, dtype, backend):
    x, *params = bn_setup(shape, dtype, affine)
    rm, rv = sample((shape[1],), dtype, 7, 0.3), sample((shape[1],), dtype, 8, 0.2, 1.5)
    inputs = [x, rm, rv] + params
    outs, _ = run("batch_norm_eval", inputs, {"eps": 1e-4}, None, backend)
    gy = sample(outs[0].shape, dtype, 5)
    (y,), grads = run("batch_norm_eval", inputs, {"eps": 1e-4}, [gy], backend)
    wrt = [0] + ([3, 4] if affine else [])
    fn = lambda x, m, v, *p: F.batch_norm(x, m, v, *p, training=False, eps=1e-4)  # noqa: E731
    (ref,), ref_grads = torch_grads(fn, inputs, [gy], wrt)
    np.testing.assert_allclose(y, ref, **tol(dtype))
    for i in wrt:
        np.testing.assert_allclose(grads[i], ref_grads[i], **tol(dtype), err_msg=f"gradient of input {i}")
    assert grads[1] is None and grads[2] is None  # running statistics are state, not differentiable


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_gradcheck(shape, affine, backend):
    fd_check("batch_norm", bn_setup(shape, np.float64, affine), {"eps": 1e-5}, backend)
    x, *params = bn_setup(shape, np.float64, affine)
    stats = [sample((shape[1],), np.float64, 7, 0.3), sample((shape[1],), np.float64, 8, 0.2, 1.5)]
    fd_check("batch_norm_eval", [x] + stats + params, {"eps": 1e-4}, backend, wrt=[0] + ([3, 4] if affine else []))


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_stats_only_in_training_plans(backend):
    """The in-place running-statistics update is refused in an inference plan (inference never writes)."""
    c = np.ones(3)
    inputs = [c * 0.5, c, np.zeros(3), np.ones(3), np.zeros(())]
    attrs = {"eps": 1e-5, "count": 4, "momentum": 0.1}
    run("batch_norm_update_stats", inputs, attrs, None, backend, training=True)
    with pytest.raises(RuntimeError, match="only training plans"):
        run("batch_norm_update_stats", inputs, attrs, None, backend, training=False)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        run("batch_norm_update_stats", inputs, dict(attrs, count=1), None, backend)


# Sizes large enough that kernels split their work into many chunks (rows, columns, channels).
LARGE = [
    ("layer_norm", (6, 5000), lambda: {"normalized_ndim": 1, "eps": 1e-5}, "both",
     lambda x, w, b: F.layer_norm(x, (5000,), w, b)),
    ("rms_norm", (6, 5000), lambda: {"normalized_ndim": 1, "eps": 1e-6}, "weight",
     lambda x, w: F.rms_norm(x, (5000,), w, eps=1e-6)),
    ("group_norm", (3, 6, 40, 50), lambda: {"num_groups": 2, "eps": 1e-5}, "both",
     lambda x, w, b: F.group_norm(x, 2, w, b)),
    ("batch_norm", (3, 5, 80, 90), lambda: {"eps": 1e-5}, "both",
     lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", LARGE, ids=[c[0] for c in LARGE])
def test_many_chunks_vs_torch(case, backend):
    op, shape, attrs, kind, fn = case
    x = sample(shape, np.float64, 0, 2.0, 0.5)
    pshape = (shape[-1],) if op in ("layer_norm", "rms_norm") else (shape[1],)
    compare_to_torch(op, [x] + affine_params(pshape, np.float64, kind), attrs(), fn, backend,
                     2 if op == "rms_norm" else 3)


# ------------------------------------------------------------------------------------------ op-level errors
@pytest.mark.parametrize("backend", BACKENDS)
def test_op_errors_name_op_and_shapes(backend):
    x = np.zeros((4, 7))
    with pytest.raises(ValueError, match=r"layer_norm: weight must have shape \(7,\), got \(6,\)"):
        run("layer_norm", [x, np.ones(6)], {"normalized_ndim": 1, "eps": 1e-5}, None, backend)
    with pytest.raises(ValueError, match=r"layer_norm: normalized_ndim must be in \[1, 2\]"):
        run("layer_norm", [x], {"normalized_ndim": 3, "eps": 1e-5}, None, backend)
    with pytest.raises(ValueError, match=r"group_norm: num_channels 7 is not divisible by num_groups 2 .*\(4, 7\)"):
        run("group_norm", [x], {"num_groups": 2, "eps": 1e-5}, None, backend)
    with pytest.raises(ValueError, match=r"batch_norm: bias must have shape \(7,\), got \(3,\)"):
        run("batch_norm", [x, np.ones(7), np.ones(3)], {"eps": 1e-5}, None, backend)
    with pytest.raises(ValueError, match=r"rms_norm: weight must have shape \(4, 7\)"):
        run("rms_norm", [x, np.ones(7)], {"normalized_ndim": 2}, None, backend)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        run("layer_norm", [x], {"normalized_ndim": 1, "eps": -1.0}, None, backend)
    with pytest.raises(TypeError, match="layer_norm: inputs must share one dtype"):
        run("layer_norm", [x, np.ones(7, np.float32)], {"normalized_ndim": 1, "eps": 1e-5}, None, backend)


# ------------------------------------------------------------------------------------------------- layers
def to_np(t):
    return t.detach().numpy()


def randomize(tmod, seed=0):
    """Non-trivial affine parameters (torch initialises weight=1, bias=0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in tmod.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return tmod


def layer_grads(mod, x, gy):
    """Training-mode forward and backward of a treadle layer: output, input gradient, parameter gradients."""
    trainer = tl.Trainer(mod, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    trainer.zero_grad()
    y = trainer.forward(x, input_grad=True)
    dx = trainer.backward(gy, input_grad=True)
    return y, dx, {k: np.array(v) for k, v in mod.named_gradients().items()}


def load_torch_state(mod, tmod):
    """Loads a torch module's state_dict. 0-d entries (num_batches_tracked) are left out: the binding's
    np.ascontiguousarray turns them into shape (1,) (reported; see test_load_torch_batchnorm_state_dict)."""
    state = tmod.state_dict()
    mod.load_state_dict({k: v for k, v in state.items() if v.dim() > 0}, strict=False)
    mod._compiled()  # parameters now live in the model's flat buffer
    params = dict(mod.named_parameter_objects())
    for k, v in state.items():
        if v.dim() == 0:
            params[k].data[...] = v.item()


def check_layer_vs_torch(mod, tmod, x, dtype):
    """Same parameters; predict (eval), training forward and all gradients against torch."""
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    tmod = randomize(tmod.to(tdt))
    mod.to(np.dtype(dtype).name)  # a layer without parameters builds a float32 model unless converted
    load_torch_state(mod, tmod)
    assert set(mod.state_dict()) == set(tmod.state_dict())
    np.testing.assert_allclose(mod.predict(x), to_np(tmod.eval()(torch.tensor(x))), **tol(dtype))
    tmod.train()
    xt = torch.tensor(x, requires_grad=True)
    yt = tmod(xt)
    gy = sample(yt.shape, dtype, 3)
    yt.backward(torch.tensor(gy))
    y, dx, grads = layer_grads(mod, x, gy)
    np.testing.assert_allclose(y, to_np(yt), **tol(dtype), err_msg="training forward")
    np.testing.assert_allclose(dx, to_np(xt.grad), **tol(dtype), err_msg="input gradient")
    for name, p in tmod.named_parameters():
        np.testing.assert_allclose(grads[name], to_np(p.grad), **tol(dtype), err_msg=f"gradient of {name}")


LAYERS = [
    ("LayerNorm", lambda d: tl.nn.LayerNorm(5, dtype=d), lambda: torch.nn.LayerNorm(5), (4, 5)),
    ("LayerNorm_2d_nobias", lambda d: tl.nn.LayerNorm((3, 5), eps=1e-3, bias=False, dtype=d),
     lambda: torch.nn.LayerNorm((3, 5), eps=1e-3, bias=False), (2, 4, 3, 5)),
    ("LayerNorm_plain", lambda d: tl.nn.LayerNorm([5], elementwise_affine=False, dtype=d),
     lambda: torch.nn.LayerNorm([5], elementwise_affine=False), (4, 5)),
    ("RMSNorm", lambda d: tl.nn.RMSNorm(5, dtype=d), lambda: torch.nn.RMSNorm(5), (4, 5)),
    ("RMSNorm_2d_eps", lambda d: tl.nn.RMSNorm((3, 5), eps=1e-4, dtype=d), lambda: torch.nn.RMSNorm((3, 5), eps=1e-4),
     (2, 3, 5)),
    ("RMSNorm_plain", lambda d: tl.nn.RMSNorm(5, elementwise_affine=False, dtype=d),
     lambda: torch.nn.RMSNorm(5, elementwise_affine=False), (4, 5)),
    ("GroupNorm", lambda d: tl.nn.GroupNorm(2, 4, dtype=d), lambda: torch.nn.GroupNorm(2, 4), (3, 4, 5)),
    ("GroupNorm_4d_plain", lambda d: tl.nn.GroupNorm(1, 4, eps=1e-3, affine=False, dtype=d),
     lambda: torch.nn.GroupNorm(1, 4, eps=1e-3, affine=False), (2, 4, 3, 3)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("layer", LAYERS, ids=[c[0] for c in LAYERS])
def test_layer_vs_torch(layer, dtype):
    _, make, make_torch, shape = layer
    check_layer_vs_torch(make(np.dtype(dtype).name), make_torch(), sample(shape, dtype, 0, 2.0, 0.3), dtype)


def test_layer_parameters_and_init_follow_torch():
    for mod, tmod in [(tl.nn.LayerNorm((3, 4)), torch.nn.LayerNorm((3, 4))),
                      (tl.nn.LayerNorm(4, bias=False), torch.nn.LayerNorm(4, bias=False)),
                      (tl.nn.RMSNorm(4), torch.nn.RMSNorm(4)),
                      (tl.nn.GroupNorm(2, 6), torch.nn.GroupNorm(2, 6)),
                      (tl.nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)),
                      (tl.nn.BatchNorm1d(3, affine=False), torch.nn.BatchNorm1d(3, affine=False)),
                      (tl.nn.BatchNorm1d(3, track_running_stats=False),
                       torch.nn.BatchNorm1d(3, track_running_stats=False))]:
        ours, theirs = mod.state_dict(), tmod.state_dict()
        assert set(ours) == set(theirs), type(mod).__name__
        for k, v in theirs.items():
            np.testing.assert_array_equal(ours[k], v.numpy(), err_msg=f"{type(mod).__name__}.{k}")
    assert tl.nn.LayerNorm(4, elementwise_affine=False).state_dict() == {}
    bn = tl.nn.BatchNorm1d(3)
    assert bn.num_batches_tracked == 0 and bn.running_var.tolist() == [1, 1, 1] and bn.weight.tolist() == [1, 1, 1]


def test_functional_norms_in_a_forward():
    """tl.functional.layer_norm / rms_norm / group_norm inside a Python module's forward."""
    class Net(tl.nn.Module):
        def forward(self, x):
            f = tl.functional
            return f.layer_norm(x, (6,), eps=1e-4), f.rms_norm(x, [6]), f.group_norm(x, 3, eps=1e-3)

    x = sample((4, 6), np.float32, 0, 2.0, 1.0)
    a, b, c = Net().predict(x)
    t = torch.tensor(x)
    np.testing.assert_allclose(a, F.layer_norm(t, (6,), eps=1e-4).numpy(), **tol(np.float32))
    np.testing.assert_allclose(b, F.rms_norm(t, (6,)).numpy(), **tol(np.float32))
    np.testing.assert_allclose(c, F.group_norm(t, 3, eps=1e-3).numpy(), **tol(np.float32))

    class Bad(tl.nn.Module):
        def forward(self, x):
            return tl.functional.layer_norm(x, (5,))

    with pytest.raises(ValueError, match=r"layer_norm: normalized_shape \(5,\) does not match input of shape \(4, 6\)"):
        Bad().predict(x)


# -------------------------------------------------------------------------------------- BatchNorm training
# (id, treadle model, torch model, input shape); BatchNorm kwargs are applied to both.
def bn_models(kind, dtype, **kw):
    d = np.dtype(dtype).name
    if kind == "1d":
        return (tl.nn.Sequential(tl.nn.Linear(4, 6, dtype=d), tl.nn.BatchNorm1d(6, dtype=d, **kw), tl.nn.Tanh(),
                                 tl.nn.Linear(6, 2, dtype=d)),
                torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6, **kw), torch.nn.Tanh(),
                                    torch.nn.Linear(6, 2)), (8, 4))
    if kind == "1d_seq":
        return (tl.nn.Sequential(tl.nn.BatchNorm1d(3, dtype=d, **kw), tl.nn.Flatten(), tl.nn.Linear(15, 2, dtype=d)),
                torch.nn.Sequential(torch.nn.BatchNorm1d(3, **kw), torch.nn.Flatten(), torch.nn.Linear(15, 2)),
                (6, 3, 5))
    return (tl.nn.Sequential(tl.nn.BatchNorm2d(3, dtype=d, **kw), tl.nn.Flatten(), tl.nn.Linear(48, 2, dtype=d)),
            torch.nn.Sequential(torch.nn.BatchNorm2d(3, **kw), torch.nn.Flatten(), torch.nn.Linear(48, 2)),
            (4, 3, 4, 4))


BN_TRAIN = [
    ("1d", {}), ("1d_seq", {}), ("2d", {}), ("2d_momentum_0.3", {"momentum": 0.3}),
    ("1d_cumulative", {"momentum": None}), ("2d_plain", {"affine": False}),
    ("1d_untracked", {"track_running_stats": False}), ("2d_eps", {"eps": 1e-2}),
]


def check_state(model, tmodel, dtype):
    ours = model.state_dict()
    for k, v in tmodel.state_dict().items():
        np.testing.assert_allclose(ours[k], v.numpy(), **tol(dtype), err_msg=k)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", BN_TRAIN, ids=[c[0] for c in BN_TRAIN])
def test_batchnorm_training_steps_match_torch(case, dtype):
    """Several SGD steps (batch statistics, running statistics updated), then eval with the running statistics."""
    name, kw = case
    model, tmodel, xshape = bn_models(name.split("_")[0] if name != "1d_seq" else name, dtype, **kw)
    tmodel = tmodel.to(torch.float64 if dtype == np.float64 else torch.float32)
    load_torch_state(model, tmodel)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.1, momentum=0.9))
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(1)
    for step in range(6):
        x = (1.5 * rng.standard_normal(xshape) + 0.5).astype(dtype)
        y = rng.standard_normal((xshape[0], 2)).astype(dtype)
        loss = trainer.step(x, y)
        tmodel.train()
        topt.zero_grad()
        tloss = F.mse_loss(tmodel(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss, tloss.item(), **tol(dtype), err_msg=f"loss at step {step}")
    check_state(model, tmodel, dtype)
    before = model.state_dict()
    tmodel.eval()
    with torch.no_grad():
        np.testing.assert_allclose(model.predict(x), to_np(tmodel(torch.tensor(x))), **tol(dtype), err_msg="predict")
        tval = F.mse_loss(tmodel(torch.tensor(x)), torch.tensor(y)).item()
    np.testing.assert_allclose(trainer.evaluate(x, y), tval, **tol(dtype), err_msg="evaluate")
    after = model.state_dict()
    for k in before:  # inference and evaluation never write the running statistics
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)


def test_batchnorm_forward_phase_updates_running_stats_once():
    """Trainer.forward (host-driven phases) is a training step: batch statistics, one running-stats update."""
    bn, tbn = tl.nn.BatchNorm1d(3, dtype="float64"), torch.nn.BatchNorm1d(3).double()
    x = sample((5, 3), np.float64, 2, 2.0, 1.0)
    y, dx, _ = layer_grads(bn, x, np.ones((5, 3)))
    np.testing.assert_allclose(y, to_np(tbn(torch.tensor(x))), **tol(np.float64))
    np.testing.assert_allclose(bn.running_mean, tbn.running_mean.numpy(), **tol(np.float64))
    np.testing.assert_allclose(bn.running_var, tbn.running_var.numpy(), **tol(np.float64))
    assert bn.num_batches_tracked == 1


def test_batchnorm_running_stats_untouched_by_weight_decay():
    model, tmodel, xshape = bn_models("1d", np.float64)
    tmodel = tmodel.double()
    load_torch_state(model, tmodel)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.AdamW(lr=0.01, weight_decay=0.1))
    topt = torch.optim.AdamW(tmodel.parameters(), lr=0.01, weight_decay=0.1)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x, y = rng.standard_normal(xshape), rng.standard_normal((xshape[0], 2))
        trainer.step(x, y)
        topt.zero_grad()
        F.mse_loss(tmodel(torch.tensor(x)), torch.tensor(y)).backward()
        topt.step()
    ours = model.state_dict()
    # Adam amplifies rounding of the ~0 gradient of 0.bias (batch norm removes the mean), so the float64
    # statistics differ from torch's by the summation order of the products: 1e-10 with AVX-512 kernels,
    # up to 1.1e-8 with AVX2 + FMA ones (measured). Weight decay applied to them would move them by
    # ~lr * weight_decay = 1e-3 relative per step, four orders above the tolerance.
    for k in ("1.running_mean", "1.running_var"):
        np.testing.assert_allclose(ours[k], tmodel.state_dict()[k].numpy(), rtol=1e-7, err_msg=k)


def test_load_torch_batchnorm_state_dict():
    """torch's state_dict (int64 num_batches_tracked, 0-d) loads as is; ours loads back into torch."""
    tbn = randomize(torch.nn.BatchNorm2d(3))
    tbn.train()(torch.randn(4, 3, 2, 2))
    bn = tl.nn.BatchNorm2d(3)
    bn.load_state_dict(tbn.state_dict())
    assert bn.num_batches_tracked == 1
    check_state(bn, tbn, np.float32)
    t2 = torch.nn.BatchNorm2d(3)
    t2.load_state_dict({k: torch.tensor(v) for k, v in bn.state_dict().items()})
    assert t2.num_batches_tracked.item() == 1


def test_save_state_dict_loads_into_torch():
    bn = tl.nn.BatchNorm1d(3, dtype="float64")
    layer_grads(bn, sample((5, 3), np.float64, 2), np.ones((5, 3)))  # one training step of statistics
    tbn = torch.nn.BatchNorm1d(3).double()
    tbn.load_state_dict({k: torch.tensor(v) for k, v in bn.state_dict().items()})
    assert tbn.num_batches_tracked.item() == 1 and tbn.num_batches_tracked.dtype == torch.int64
    np.testing.assert_array_equal(tbn.running_var.numpy(), bn.running_var)


# --------------------------------------------------------------------------------------------- bad input
def test_layer_errors_name_layer_and_shapes():
    x = np.zeros((4, 7), np.float32)
    with pytest.raises(ValueError, match=r"LayerNorm: expected input of shape \(\*, 8\), got \(4, 7\)"):
        tl.nn.LayerNorm(8).predict(x)
    with pytest.raises(ValueError, match=r"LayerNorm: expected input of shape \(\*, 2, 7\), got \(4, 7\)"):
        tl.nn.LayerNorm((2, 7)).predict(x)
    with pytest.raises(ValueError, match=r"RMSNorm: expected input of shape \(\*, 6\), got \(4, 7\)"):
        tl.nn.RMSNorm(6).predict(x)
    with pytest.raises(ValueError, match="GroupNorm: num_channels 6 must be divisible by num_groups 4"):
        tl.nn.GroupNorm(4, 6)
    with pytest.raises(ValueError, match=r"GroupNorm: expected input of shape \(N, 6, \*\), got \(4, 7\)"):
        tl.nn.GroupNorm(2, 6).predict(x)
    with pytest.raises(ValueError, match=r"BatchNorm2d: expected input of shape \(N, 3, H, W\), got \(2, 4, 5, 5\)"):
        tl.nn.BatchNorm2d(3).predict(np.zeros((2, 4, 5, 5), np.float32))
    with pytest.raises(ValueError, match=r"BatchNorm1d: expected input of shape \(N, 3\) or \(N, 3, L\), got"):
        tl.nn.BatchNorm1d(3).predict(np.zeros((2, 3, 4, 5), np.float32))
    bn = tl.nn.BatchNorm1d(3)
    bn.predict(np.zeros((1, 3), np.float32))  # eval with one sample is fine
    trainer = tl.Trainer(bn, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    with pytest.raises(ValueError, match=r"BatchNorm1d: expected more than 1 value per channel when training, got "
                                         r"input of shape \(1, 3\)"):
        trainer.step(np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="momentum"):
        tl.nn.BatchNorm1d(3, momentum=1.5)
    with pytest.raises(ValueError, match="normalized_shape must be positive"):
        tl.nn.LayerNorm((0, 3))
    with pytest.raises(TypeError, match="load_state_dict: 'weight' has dtype int64"):  # integers: counters only
        tl.nn.BatchNorm1d(3).load_state_dict({"weight": np.ones(3, np.int64)}, strict=False)
