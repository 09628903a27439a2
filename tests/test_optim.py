"""Optimizers against torch.optim (same formulas, step by step), the matrix-aware AdaGrad against a
numpy reference and its defining properties, determinism under chunking, and argument checking.

Everything runs through the low-level path: ``opt.bind(slots, dtype)`` then ``opt.step(params, grads)``
on flat numpy buffers, exactly the buffers a trainer hands the compiled optimizer.
"""
import numpy as np
import pytest
import torch

import treadle.optim as optim

STEPS = 20

# Several parameter sets: a 2-D weight, a bias vector, a 3-D tensor, and combinations.
LAYOUTS = {
    "mixed": [("weight", (6, 4)), ("bias", (6,)), ("kernel", (2, 3, 4))],
    "matrix": [("w", (7, 3))],
    "vector": [("b", (11,))],
}

TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-14)}

# (treadle class, torch class, options): a grid that reaches every branch of every update formula.
CASES = [
    ("SGD", "SGD", dict(lr=0.05)),
    ("SGD", "SGD", dict(lr=0.05, momentum=0.9)),
    ("SGD", "SGD", dict(lr=0.05, momentum=0.9, dampening=0.3)),
    ("SGD", "SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("SGD", "SGD", dict(lr=0.05, weight_decay=0.1)),
    ("SGD", "SGD", dict(lr=0.05, momentum=0.5, dampening=0.1, weight_decay=0.01)),
    ("SGD", "SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.05)),
    ("Adam", "Adam", dict(lr=1e-2)),
    ("Adam", "Adam", dict(lr=1e-2, weight_decay=0.1)),
    ("Adam", "Adam", dict(lr=1e-2, amsgrad=True)),
    ("Adam", "Adam", dict(lr=1e-2, betas=(0.3, 0.8), eps=1e-6, weight_decay=0.05, amsgrad=True)),
    ("AdamW", "AdamW", dict(lr=1e-2)),
    ("AdamW", "AdamW", dict(lr=1e-2, weight_decay=0.0)),
    ("AdamW", "AdamW", dict(lr=1e-2, weight_decay=0.3, amsgrad=True)),
    ("AdamW", "AdamW", dict(lr=2e-2, betas=(0.5, 0.95), eps=1e-7, weight_decay=0.1)),
    ("RMSprop", "RMSprop", dict(lr=1e-2)),
    ("RMSprop", "RMSprop", dict(lr=1e-2, alpha=0.9, weight_decay=0.1)),
    ("RMSprop", "RMSprop", dict(lr=1e-2, momentum=0.9)),
    ("RMSprop", "RMSprop", dict(lr=1e-2, centered=True)),
    ("RMSprop", "RMSprop", dict(lr=1e-2, alpha=0.4, eps=1e-6, momentum=0.5, centered=True, weight_decay=0.05)),
    ("Adagrad", "Adagrad", dict(lr=0.1)),
    ("Adagrad", "Adagrad", dict(lr=0.1, lr_decay=0.05)),
    ("Adagrad", "Adagrad", dict(lr=0.1, weight_decay=0.1, initial_accumulator_value=0.5)),
    ("Adagrad", "Adagrad", dict(lr=0.1, lr_decay=0.2, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-6)),
]


def case_id(case):
    name, _, opts = case
    return name + "-" + ",".join(f"{k}={v}" for k, v in opts.items())


def numel(shape):
    return int(np.prod(shape, dtype=np.int64))


def total(layout):
    return sum(numel(s) for _, s in layout)


def split(flat, layout):
    """Views of a flat buffer shaped like each slot."""
    out, off = [], 0
    for _, shape in layout:
        n = numel(shape)
        out.append(flat[off:off + n].reshape(shape))
        off += n
    return out


def random_problem(layout, dtype, seed=0, steps=STEPS):
    rng = np.random.default_rng(seed)
    params = rng.standard_normal(total(layout)).astype(dtype)
    grads = [rng.standard_normal(total(layout)).astype(dtype) for _ in range(steps)]
    return params, grads


def torch_flat_state(topt, tparams):
    """torch's per-parameter state concatenated like treadle's flat state buffers."""
    names = [k for k in topt.state[tparams[0]] if k != "step"]
    return {k: np.concatenate([topt.state[p][k].detach().numpy().reshape(-1) for p in tparams]) for k in names}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_torch_every_step(case, layout_name, dtype):
    name, torch_name, opts = case
    layout = LAYOUTS[layout_name]
    params, grads = random_problem(layout, dtype, seed=len(layout_name))
    tparams = [torch.tensor(v.copy(), requires_grad=True) for v in split(params, layout)]
    topt = getattr(torch.optim, torch_name)(tparams, foreach=False, **opts)
    opt = getattr(optim, name)(**opts).bind(layout, dtype)
    for t, g in enumerate(grads):
        for tp, tg in zip(tparams, split(g, layout)):
            tp.grad = torch.tensor(tg.copy())
        topt.step()
        opt.step(params, g)
        expect = np.concatenate([tp.detach().numpy().reshape(-1) for tp in tparams])
        np.testing.assert_allclose(params, expect, **TOL[dtype], err_msg=f"{name} {opts} after step {t + 1}")
    assert opt.step_count == STEPS
    state, expect_state = opt.state(), torch_flat_state(topt, tparams)
    assert sorted(state) == sorted(expect_state)
    for k in state:
        assert state[k].dtype == dtype
        np.testing.assert_allclose(state[k], expect_state[k], **TOL[dtype], err_msg=f"state {k}")


def test_scheduled_lr_changes_every_step_like_torch():
    """The lr passed to step() is the step's lr: AdamW's decoupled decay must use it too."""
    layout = LAYOUTS["mixed"]
    params, grads = random_problem(layout, np.float64, seed=3, steps=30)
    tparams = [torch.tensor(v.copy(), requires_grad=True) for v in split(params, layout)]
    topt = torch.optim.AdamW(tparams, lr=0.05, weight_decay=0.2, foreach=False)
    tsched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=12, eta_min=1e-3)
    opt = optim.AdamW(lr=0.05, weight_decay=0.2).bind(layout, "float64")
    sched = optim.CosineAnnealingLR(T_max=12, eta_min=1e-3)
    for t, g in enumerate(grads):
        for tp, tg in zip(tparams, split(g, layout)):
            tp.grad = torch.tensor(tg.copy())
        topt.step()
        tsched.step()
        opt.step(params, g, lr=sched.lr_at(t, opt.lr))
    expect = np.concatenate([tp.detach().numpy().reshape(-1) for tp in tparams])
    np.testing.assert_allclose(params, expect, **TOL[np.float64])


# ---- Row-wise / column-wise AdaGrad ---------------------------------------------------------------

def matrix_adagrad_reference(layout, params, grads, axis, lr=0.1, lr_decay=0.0, weight_decay=0.0,
                             initial_accumulator_value=0.0, eps=1e-10):
    """Plain numpy in float64: one accumulator per row (axis="rows") or column of each 2-D slot."""
    p = params.astype(np.float64)
    accs = []
    for _, shape in layout:
        if len(shape) == 2:
            accs.append(np.full(shape[0] if axis == "rows" else shape[1], initial_accumulator_value))
        else:
            accs.append(np.full(shape, initial_accumulator_value))
    for t, g_flat in enumerate(grads, start=1):
        clr = lr / (1 + (t - 1) * lr_decay)
        for (_, shape), P, G, acc in zip(layout, split(p, layout), split(g_flat.astype(np.float64), layout), accs):
            G = G + weight_decay * P
            if len(shape) == 2 and axis == "rows":
                acc += np.mean(G * G, axis=1)
                P -= clr * G / (np.sqrt(acc)[:, None] + eps)
            elif len(shape) == 2:
                acc += np.mean(G * G, axis=0)
                P -= clr * G / (np.sqrt(acc)[None, :] + eps)
            else:
                acc += G * G
                P -= clr * G / (np.sqrt(acc) + eps)
    return p, np.concatenate([a.reshape(-1) for a in accs])


MATRIX_LAYOUT = [("emb", (9, 5)), ("bias", (5,)), ("proj", (4, 9)), ("kernel", (2, 3, 4)), ("col", (6, 1))]
ADAGRAD_OPTIONS = [
    dict(lr=0.1),
    dict(lr=0.1, lr_decay=0.1, weight_decay=0.05),
    dict(lr=0.05, initial_accumulator_value=0.3, eps=1e-6, weight_decay=0.01),
]
MATRIX_CLASSES = {"rows": optim.RowWiseAdagrad, "cols": optim.ColumnWiseAdagrad}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("opts", ADAGRAD_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("axis", ["rows", "cols"])
def test_matrix_adagrad_matches_numpy_reference(axis, opts, dtype):
    params, grads = random_problem(MATRIX_LAYOUT, dtype, seed=7)
    expect, expect_acc = matrix_adagrad_reference(MATRIX_LAYOUT, params, grads, axis, **opts)
    opt = MATRIX_CLASSES[axis](**opts).bind(MATRIX_LAYOUT, dtype)
    for g in grads:
        opt.step(params, g)
    np.testing.assert_allclose(params, expect, **TOL[dtype])
    state = opt.state()
    assert list(state) == ["sum"]
    # Compact state: R (or C) entries per matrix, numel entries for the rest, in layout order.
    assert state["sum"].shape == expect_acc.shape
    np.testing.assert_allclose(state["sum"], expect_acc, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("axis", ["rows", "cols"])
def test_matrix_adagrad_falls_back_to_adagrad_exactly(axis, dtype):
    """Parameters that are not 2-D (vectors, 3-D tensors) get element-wise AdaGrad, bit for bit."""
    layout = [("bias", (7,)), ("kernel", (2, 3, 4)), ("scale", (1,))]
    opts = dict(lr=0.1, lr_decay=0.1, weight_decay=0.05, initial_accumulator_value=0.2)
    params, grads = random_problem(layout, dtype, seed=11)
    p_matrix, p_plain = params.copy(), params.copy()
    matrix = MATRIX_CLASSES[axis](**opts).bind(layout, dtype)
    plain = optim.Adagrad(**opts).bind(layout, dtype)
    for g in grads:
        matrix.step(p_matrix, g)
        plain.step(p_plain, g)
    np.testing.assert_array_equal(p_matrix, p_plain)
    np.testing.assert_array_equal(matrix.state()["sum"], plain.state()["sum"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_rowwise_equals_adagrad_for_row_constant_gradients(dtype):
    """When every gradient of a row is the same, the row's mean square is each element's square, so
    one accumulator per row is exactly AdaGrad's per-element accumulators (without weight decay,
    which would make the decayed gradients differ within a row)."""
    layout = [("w", (8, 6)), ("v", (4, 16))]
    rng = np.random.default_rng(5)
    params = rng.standard_normal(total(layout)).astype(dtype)
    p_row, p_plain = params.copy(), params.copy()
    opts = dict(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.1)
    row = optim.RowWiseAdagrad(**opts).bind(layout, dtype)
    plain = optim.Adagrad(**opts).bind(layout, dtype)
    for _ in range(STEPS):
        g = np.concatenate([np.repeat(rng.standard_normal((s[0], 1)), s[1], axis=1).reshape(-1) for _, s in layout])
        g = g.astype(dtype)
        row.step(p_row, g)
        plain.step(p_plain, g)
    # Equal up to rounding: AdaGrad's acc + g * g may be one fused multiply-add (-march=native).
    tight = dict(rtol=1e-5, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(p_row, p_plain, **tight)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_columnwise_is_rowwise_of_the_transpose(dtype):
    R, C = 7, 5
    rng = np.random.default_rng(9)
    P = rng.standard_normal((R, C)).astype(dtype)
    grads = [rng.standard_normal((R, C)).astype(dtype) for _ in range(STEPS)]
    opts = dict(lr=0.1, lr_decay=0.1, weight_decay=0.05, initial_accumulator_value=0.1)
    col = optim.ColumnWiseAdagrad(**opts).bind([("w", (R, C))], dtype)
    row = optim.RowWiseAdagrad(**opts).bind([("w", (C, R))], dtype)
    p_col, p_row = P.reshape(-1).copy(), np.ascontiguousarray(P.T).reshape(-1)
    for G in grads:
        col.step(p_col, G.reshape(-1))
        row.step(p_row, np.ascontiguousarray(G.T).reshape(-1))
    # Same sums in the same order; only contraction into fused multiply-adds may differ.
    tight = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(p_col.reshape(R, C), p_row.reshape(C, R).T, **tight)
    np.testing.assert_allclose(col.state()["sum"], row.state()["sum"], **tight)


@pytest.mark.parametrize("axis,shape", [("rows", (6, 1)), ("cols", (1, 6))])
def test_single_column_rowwise_or_single_row_columnwise_is_adagrad(axis, shape):
    """A row of one element (or a column of one) averages over one square: element-wise AdaGrad."""
    layout = [("w", shape)]
    params, grads = random_problem(layout, np.float64, seed=2)
    p_m, p_a = params.copy(), params.copy()
    opts = dict(lr=0.1, weight_decay=0.1, lr_decay=0.01)
    m = MATRIX_CLASSES[axis](**opts).bind(layout, "float64")
    a = optim.Adagrad(**opts).bind(layout, "float64")
    for g in grads:
        m.step(p_m, g)
        a.step(p_a, g)
    np.testing.assert_allclose(p_m, p_a, rtol=1e-15, atol=0)


# ---- Determinism, binding, state -----------------------------------------------------------------

ALL = [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("Adam", dict(lr=1e-2, amsgrad=True, weight_decay=0.01)),
    ("AdamW", dict(lr=1e-2)),
    ("RMSprop", dict(lr=1e-2, momentum=0.5, centered=True)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01)),
    ("RowWiseAdagrad", dict(lr=0.1, weight_decay=0.01)),
    ("ColumnWiseAdagrad", dict(lr=0.1, weight_decay=0.01)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,opts", ALL, ids=[n for n, _ in ALL])
def test_results_do_not_depend_on_chunking(name, opts, dtype):
    """Big buffers are split over the executor's workers; the result must be bitwise the same."""
    layout = [("big", (300, 200)), ("bias", (40000,)), ("tall", (5000, 3))]
    params, grads = random_problem(layout, dtype, seed=1, steps=3)
    results = []
    for workers in (1, 3, 8):
        p = params.copy()
        opt = getattr(optim, name)(**opts).bind(layout, dtype)
        for g in grads:
            opt._native.step(p, g, None, workers)
        results.append((p, opt.state()))
    for p, state in results[1:]:
        np.testing.assert_array_equal(p, results[0][0])
        for k in state:
            np.testing.assert_array_equal(state[k], results[0][1][k])


def test_state_names_follow_torch():
    layout = LAYOUTS["mixed"]
    n = total(layout)
    expect = {
        optim.SGD(lr=0.1): [],
        optim.SGD(lr=0.1, momentum=0.9): ["momentum_buffer"],
        optim.Adam(): ["exp_avg", "exp_avg_sq"],
        optim.AdamW(amsgrad=True): ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"],
        optim.RMSprop(momentum=0.9, centered=True): ["square_avg", "momentum_buffer", "grad_avg"],
        optim.Adagrad(initial_accumulator_value=0.25): ["sum"],
    }
    for opt, names in expect.items():
        state = opt.bind(layout, "float32").state()
        assert list(state) == names, opt
        for v in state.values():
            assert v.shape == (n,) and v.dtype == np.float32
    assert np.all(optim.Adagrad(initial_accumulator_value=0.25).bind(layout, "float64").state()["sum"] == 0.25)


def test_rebind_same_layout_converts_state_and_keeps_the_step():
    layout = LAYOUTS["mixed"]
    params, grads = random_problem(layout, np.float64, seed=4, steps=5)
    opt = optim.Adam(lr=1e-2).bind(layout, "float64")
    for g in grads:
        opt.step(params, g)
    before = opt.state()
    opt.bind(layout, "float32")  # the model switched dtype
    assert opt.step_count == 5
    for k, v in opt.state().items():
        assert v.dtype == np.float32
        np.testing.assert_array_equal(v, before[k].astype(np.float32))
    opt.bind([("other", (3,))], "float32")  # a different model: fresh state
    assert opt.step_count == 0
    assert all(np.all(v == 0) for v in opt.state().values())


def test_load_state_resumes_identically():
    layout = LAYOUTS["mixed"]
    params, grads = random_problem(layout, np.float32, seed=6, steps=10)
    a = optim.RMSprop(lr=1e-2, momentum=0.9, centered=True).bind(layout, np.float32)
    for g in grads[:5]:
        a.step(params, g)
    b = optim.RMSprop(lr=1e-2, momentum=0.9, centered=True).bind(layout, np.float32)
    b.load_state(a.state(), step_count=a.step_count)
    pa, pb = params.copy(), params.copy()
    for g in grads[5:]:
        a.step(pa, g)
        b.step(pb, g)
    np.testing.assert_array_equal(pa, pb)
    with pytest.raises(ValueError, match="missing state 'grad_avg'"):
        b.load_state({"square_avg": np.zeros(total(layout)), "momentum_buffer": np.zeros(total(layout))})
    with pytest.raises(ValueError, match="expected 54"):
        b.load_state({k: np.zeros(3) for k in a.state()})


def test_sgd_momentum_buffer_starts_from_the_first_gradient():
    """torch initialises the buffer to the first gradient (no dampening on step 1)."""
    opt = optim.SGD(lr=1.0, momentum=0.9, dampening=0.5).bind([("x", (3,))], "float64")
    p = np.zeros(3)
    opt.step(p, np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(opt.state()["momentum_buffer"], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(p, [-1.0, -2.0, -3.0])


def test_zero_lr_changes_nothing_but_state():
    opt = optim.Adam(lr=0.0).bind([("x", (4,))], "float64")
    p = np.arange(4.0)
    opt.step(p, np.ones(4))
    np.testing.assert_array_equal(p, np.arange(4.0))
    assert opt.step_count == 1


# ---- Argument checking -------------------------------------------------------------------------

BAD_HYPER = [
    (optim.SGD, dict(lr=-0.1), "lr"),
    (optim.SGD, dict(lr=float("nan")), "lr"),
    (optim.SGD, dict(lr=0.1, momentum=-0.5), "momentum"),
    (optim.SGD, dict(lr=0.1, weight_decay=-1.0), "weight_decay"),
    (optim.SGD, dict(lr=0.1, nesterov=True), "nesterov"),
    (optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "dampening"),
    (optim.Adam, dict(lr=-1e-3), "lr"),
    (optim.Adam, dict(betas=(1.0, 0.999)), "beta"),
    (optim.Adam, dict(betas=(0.9, -0.1)), "beta"),
    (optim.Adam, dict(betas=(0.9,)), "betas"),
    (optim.Adam, dict(eps=0.0), "eps"),
    (optim.Adam, dict(eps=-1e-8), "eps"),
    (optim.Adam, dict(weight_decay=-0.1), "weight_decay"),
    (optim.AdamW, dict(betas=(0.9, 1.5)), "beta"),
    (optim.AdamW, dict(weight_decay=-1e-2), "weight_decay"),
    (optim.RMSprop, dict(lr=-1.0), "lr"),
    (optim.RMSprop, dict(alpha=-0.1), "alpha"),
    (optim.RMSprop, dict(alpha=1.5), "alpha"),
    (optim.RMSprop, dict(eps=0.0), "eps"),
    (optim.RMSprop, dict(momentum=-0.9), "momentum"),
    (optim.RMSprop, dict(weight_decay=-0.9), "weight_decay"),
    (optim.Adagrad, dict(lr=-0.1), "lr"),
    (optim.Adagrad, dict(lr_decay=-0.1), "lr_decay"),
    (optim.Adagrad, dict(initial_accumulator_value=-1.0), "initial_accumulator_value"),
    (optim.Adagrad, dict(eps=-1.0), "eps"),
    (optim.RowWiseAdagrad, dict(weight_decay=-1.0), "weight_decay"),
    (optim.ColumnWiseAdagrad, dict(eps=0.0), "eps"),
]


@pytest.mark.parametrize("cls,kwargs,word", BAD_HYPER, ids=[f"{c.__name__}-{k}" for c, k, _ in BAD_HYPER])
def test_bad_hyper_parameters_raise_value_error(cls, kwargs, word):
    with pytest.raises(ValueError, match=word):
        cls(**kwargs)


def test_bad_parameter_argument_is_a_type_error_with_a_hint():
    with pytest.raises(TypeError, match="params must be an iterable of parameters or of dicts, got float"):
        optim.AdamW(1e-3)
    with pytest.raises(TypeError, match="momentum must be a number"):
        optim.SGD(lr=0.1, momentum="0.9")


def test_lr_setter_validates():
    opt = optim.SGD(lr=0.1)
    opt.lr = 0.5
    assert opt.lr == 0.5
    with pytest.raises(ValueError, match="lr"):
        opt.lr = -1.0


@pytest.fixture
def bound():
    return optim.Adam(lr=1e-2).bind([("w", (3, 2)), ("b", (3,))], "float32")


def test_step_before_bind_raises():
    with pytest.raises(RuntimeError, match="not bound"):
        optim.Adam().step(np.zeros(3, np.float32), np.zeros(3, np.float32))


@pytest.mark.parametrize("params,grads,exc,msg", [
    (np.zeros(9), np.zeros(9, np.float32), TypeError, "params has dtype float64 but the optimizer is bound to float32"),
    (np.zeros(9, np.float32), np.zeros(9, np.int32), TypeError, "grads must be a native float32 or float64"),
    (np.zeros(8, np.float32), np.zeros(8, np.float32), ValueError,
     "params has 8 elements but the optimizer is bound to 9"),
    (np.zeros(9, np.float32), np.zeros(10, np.float32), ValueError, "grads has 10 elements"),
    (np.zeros(18, np.float32)[::2], np.zeros(9, np.float32), ValueError, "params must be contiguous"),
    (np.zeros((3, 3), np.float32), np.zeros(9, np.float32), ValueError, "params must be a flat 1-D array"),
    ([0.0] * 9, np.zeros(9, np.float32), TypeError, "params must be a numpy array, got list"),
    (np.zeros(9, ">f4"), np.zeros(9, np.float32), TypeError, "native float32"),
], ids=["dtype", "int-grads", "size", "grad-size", "strided", "2-D", "list", "byteswapped"])
def test_bad_buffers_raise_clear_errors(bound, params, grads, exc, msg):
    with pytest.raises(exc, match=msg):
        bound.step(params, grads)
    assert bound.step_count == 0


def test_read_only_params_and_bad_lr(bound):
    p = np.zeros(9, np.float32)
    p.flags.writeable = False
    with pytest.raises(ValueError, match="params must be writable"):
        bound.step(p, np.zeros(9, np.float32))
    with pytest.raises(ValueError, match="invalid learning rate"):
        bound.step(np.zeros(9, np.float32), np.zeros(9, np.float32), lr=-1.0)
    g = np.zeros(9, np.float32)
    g.flags.writeable = False  # gradients are only read
    bound.step(np.zeros(9, np.float32), g)
    assert bound.step_count == 1


@pytest.mark.parametrize("slots,dtype,exc,msg", [
    ([("w", (3, -1))], "float32", ValueError, "negative dimension"),
    ([("w", (3, 2))], "float16", TypeError, "float32 or float64"),
    ([("w", (3, 2))], "int32", TypeError, "float32 or float64"),
    ([("w", (3, 2), 0)], "float32", ValueError, r"\(name, shape\)"),
])
def test_bad_bind_arguments(slots, dtype, exc, msg):
    with pytest.raises(exc, match=msg):
        optim.SGD(lr=0.1)._native.bind(slots, dtype)


# ---- Through the trainer -------------------------------------------------------------------------

TRAINER_CASES = [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01), "SGD"),
    ("Adam", dict(lr=1e-2, amsgrad=True), "Adam"),
    ("AdamW", dict(lr=1e-2, weight_decay=0.1), "AdamW"),
    ("RMSprop", dict(lr=1e-3, centered=True, momentum=0.5), "RMSprop"),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01), "Adagrad"),
]


@pytest.mark.parametrize("name,opts,torch_name", TRAINER_CASES, ids=[c[0] for c in TRAINER_CASES])
def test_trainer_steps_like_torch(name, opts, torch_name):
    """The trainer hands optimizer._native and schedule._native the model's flat buffers: a Sequential of
    two Linear layers trained with a schedule must follow torch's training step for step."""
    import treadle as tl

    if not hasattr(getattr(tl, "loss", None), "MSE"):
        pytest.skip("tl.loss.MSE is not available in this build")
    rng = np.random.default_rng(0)
    net = tl.nn.Sequential(tl.nn.Linear(4, 5, dtype="float64"), tl.nn.Linear(5, 2, dtype="float64"))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 2)).double()
    ref.load_state_dict({k: torch.tensor(v) for k, v in net.state_dict().items()})
    trainer = tl.Trainer(net, loss=tl.loss.MSE(), optimizer=getattr(optim, name)(**opts),
                         schedule=optim.StepLR(3, gamma=0.5))
    topt = getattr(torch.optim, torch_name)(ref.parameters(), foreach=False, **opts)
    tsched = torch.optim.lr_scheduler.StepLR(topt, 3, gamma=0.5)
    for _ in range(10):
        x, y = rng.standard_normal((8, 4)), rng.standard_normal((8, 2))
        trainer.step(x, y)
        topt.zero_grad()
        torch.nn.functional.mse_loss(ref(torch.tensor(x)), torch.tensor(y)).backward()
        topt.step()
        tsched.step()
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(net.state_dict()[k], v.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)
