"""Learning-rate schedules against torch.optim.lr_scheduler, and gradient clipping against
torch.nn.utils.clip_grad_norm_.

A schedule's lr_at(t, base_lr) is the lr of optimizer update t + 1: torch's lr after t calls of
scheduler.step(), one call after each optimizer.step().
"""
import math

import numpy as np
import pytest
import torch

import treadle.optim as optim

STEPS = 50
BASE_LR = 0.1


def torch_lrs(make_scheduler, steps=STEPS, base_lr=BASE_LR):
    """The lr each of `steps` optimizer updates uses under torch's scheduler."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base_lr)
    sched = make_scheduler(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return np.array(lrs)


LR = torch.optim.lr_scheduler
SCHEDULES = [
    ("constant", lambda: optim.ConstantLR(factor=1.0, total_iters=0), lambda o: LR.ConstantLR(o, 1.0, 0)),
    ("constant-torch-defaults", lambda: optim.ConstantLR(), lambda o: LR.ConstantLR(o)),
    ("constant-half-10", lambda: optim.ConstantLR(0.5, 10), lambda o: LR.ConstantLR(o, factor=0.5, total_iters=10)),
    ("step-7", lambda: optim.StepLR(7), lambda o: LR.StepLR(o, step_size=7)),
    ("step-1-0.9", lambda: optim.StepLR(1, gamma=0.9), lambda o: LR.StepLR(o, step_size=1, gamma=0.9)),
    ("step-10-0.5", lambda: optim.StepLR(10, 0.5), lambda o: LR.StepLR(o, 10, gamma=0.5)),
    ("exponential-0.95", lambda: optim.ExponentialLR(0.95), lambda o: LR.ExponentialLR(o, gamma=0.95)),
    ("exponential-1.02", lambda: optim.ExponentialLR(1.02), lambda o: LR.ExponentialLR(o, gamma=1.02)),
    ("cosine-50", lambda: optim.CosineAnnealingLR(50), lambda o: LR.CosineAnnealingLR(o, T_max=50)),
    # Past T_max torch's cosine rises again; so does ours.
    ("cosine-20-min", lambda: optim.CosineAnnealingLR(20, eta_min=1e-3),
     lambda o: LR.CosineAnnealingLR(o, T_max=20, eta_min=1e-3)),
    ("cosine-1", lambda: optim.CosineAnnealingLR(1), lambda o: LR.CosineAnnealingLR(o, T_max=1)),
]


def sequential_warmup_cosine(warmup, total, eta_min, start_factor):
    def make(o):
        warm = LR.LinearLR(o, start_factor=start_factor, end_factor=1.0, total_iters=warmup)
        cos = LR.CosineAnnealingLR(o, T_max=total - warmup, eta_min=eta_min)
        return LR.SequentialLR(o, [warm, cos], milestones=[warmup])
    return make


for w, tot, emin, sf in [(5, 50, 0.0, 0.1), (10, 40, 1e-3, 0.01), (1, 30, 0.0, 0.5), (20, 60, 0.02, 1.0)]:
    SCHEDULES.append((f"warmup_cosine-{w}-{tot}-{emin}-{sf}",
                      lambda w=w, tot=tot, emin=emin, sf=sf: optim.WarmupCosineLR(w, tot, emin, sf),
                      sequential_warmup_cosine(w, tot, emin, sf)))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name,ours,theirs", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_schedule_matches_torch(name, ours, theirs):
    expect = torch_lrs(theirs)
    sched = ours()
    got = np.array([sched.lr_at(t, BASE_LR) for t in range(STEPS)])
    # torch's recursive forms drift by rounding; near an lr of 0 only an absolute bound makes sense.
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-15)


def test_schedule_scales_with_base_lr_and_lr_at_zero():
    for sched in (optim.StepLR(3), optim.ExponentialLR(0.9), optim.CosineAnnealingLR(10),
                  optim.WarmupCosineLR(4, 20, start_factor=0.25)):
        assert math.isclose(sched.lr_at(7, 2.0), 2 * sched.lr_at(7, 1.0), rel_tol=1e-15)
    assert optim.CosineAnnealingLR(10).lr_at(0, 0.3) == 0.3
    assert optim.WarmupCosineLR(4, 20).lr_at(0, 0.3) == 0.0  # default start_factor 0
    assert optim.WarmupCosineLR(4, 20).lr_at(4, 0.3) == 0.3
    assert optim.WarmupCosineLR(0, 20, eta_min=0.01).lr_at(20, 0.3) == pytest.approx(0.01, rel=1e-14)


def test_schedule_names_and_scheduler_namespace():
    from treadle.optim.lr_scheduler import StepLR

    assert StepLR is optim.StepLR and optim.schedule.CosineAnnealingLR is optim.CosineAnnealingLR
    assert repr(optim.StepLR(5, 0.5)) == "StepLR(step_size=5, gamma=0.5)"
    assert "WarmupCosineLR(warmup=2, total=9" in repr(optim.WarmupCosineLR(2, 9))


BAD_SCHEDULES = [
    (lambda: optim.StepLR(0), "step_size"),
    (lambda: optim.StepLR(5, gamma=0.0), "gamma"),
    (lambda: optim.StepLR(5, gamma=float("nan")), "gamma"),
    (lambda: optim.ExponentialLR(-0.5), "gamma"),
    (lambda: optim.CosineAnnealingLR(0), "T_max"),
    (lambda: optim.CosineAnnealingLR(10, eta_min=-1.0), "eta_min"),
    (lambda: optim.ConstantLR(factor=1.5), "factor"),
    (lambda: optim.ConstantLR(total_iters=-1), "total_iters"),
    (lambda: optim.WarmupCosineLR(-1, 10), "warmup"),
    (lambda: optim.WarmupCosineLR(10, 10), "total"),
    (lambda: optim.WarmupCosineLR(2, 10, eta_min=-0.1), "eta_min"),
    (lambda: optim.WarmupCosineLR(2, 10, start_factor=2.0), "start_factor"),
]


@pytest.mark.parametrize("make,word", BAD_SCHEDULES, ids=[w + str(i) for i, (_, w) in enumerate(BAD_SCHEDULES)])
def test_bad_schedule_arguments_raise_value_error(make, word):
    with pytest.raises(ValueError, match=word):
        make()


def test_negative_step_raises():
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        optim.StepLR(3).lr_at(-1, 0.1)


# ---- clip_grad_norm ------------------------------------------------------------------------------

SHAPES = [(6, 4), (6,), (2, 3, 4)]


def torch_clip(flat, max_norm):
    """torch.nn.utils.clip_grad_norm_ over parameters shaped like SHAPES whose grads are `flat`."""
    params, off = [], 0
    for shape in SHAPES:
        n = int(np.prod(shape))
        p = torch.nn.Parameter(torch.zeros(shape, dtype=torch.from_numpy(flat).dtype))
        p.grad = torch.from_numpy(flat[off:off + n].reshape(shape).copy())
        params.append(p)
        off += n
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm), np.concatenate([p.grad.numpy().reshape(-1) for p in params])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("scale,max_norm", [(1.0, 1.0), (1.0, 100.0), (10.0, 0.5), (1e-3, 1e-3), (1.0, 0.0)])
def test_clip_grad_norm_matches_torch(scale, max_norm, dtype):
    rng = np.random.default_rng(0)
    flat = (scale * rng.standard_normal(sum(int(np.prod(s)) for s in SHAPES))).astype(dtype)
    expect_norm, expect = torch_clip(flat, max_norm)
    norm = optim.clip_grad_norm_(flat, max_norm)
    tol = dict(rtol=1e-5, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-12, atol=0)
    assert norm == pytest.approx(expect_norm, rel=tol["rtol"])
    np.testing.assert_allclose(flat, expect, **tol)
    assert np.linalg.norm(flat.astype(np.float64)) <= max_norm * (1 + 1e-6) or max_norm >= expect_norm


def test_clip_grad_norm_below_the_limit_leaves_grads_untouched():
    g = np.array([3.0, 4.0])
    assert optim.clip_grad_norm_(g, 5.0 + 1e-5) == 5.0
    np.testing.assert_array_equal(g, [3.0, 4.0])
    z = np.zeros(5, np.float32)
    assert optim.clip_grad_norm_(z, 1.0) == 0.0
    assert optim.clip_grad_norm_(np.zeros(0), 1.0) == 0.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_clip_grad_norm_non_finite_like_torch(bad):
    flat = np.array([1.0, bad, 2.0, 0.5, -1.0, 3.0] * 11)[: sum(int(np.prod(s)) for s in SHAPES)].copy()
    expect_norm, expect = torch_clip(flat.copy(), 1.0)
    norm = optim.clip_grad_norm_(flat, 1.0)
    assert (math.isnan(norm) and math.isnan(expect_norm)) or norm == expect_norm
    np.testing.assert_array_equal(np.isnan(flat), np.isnan(expect))
    np.testing.assert_array_equal(flat[~np.isnan(flat)], expect[~np.isnan(expect)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_clip_grad_norm_does_not_depend_on_chunking(dtype):
    g0 = np.random.default_rng(1).standard_normal(1_000_003).astype(dtype)
    results = []
    for workers in (1, 2, 7):
        g = g0.copy()
        results.append((optim._native.clip_grad_norm(g, 1.0, workers), g))
    for norm, g in results[1:]:
        assert norm == results[0][0]
        np.testing.assert_array_equal(g, results[0][1])
    assert results[0][0] == pytest.approx(np.linalg.norm(g0.astype(np.float64)), rel=1e-12)


def test_clip_grad_norm_bad_arguments():
    with pytest.raises(ValueError, match="max_norm must be >= 0"):
        optim.clip_grad_norm_(np.ones(3), -1.0)
    with pytest.raises(TypeError, match="grads must be a native float32 or float64"):
        optim.clip_grad_norm_(np.ones(3, np.int64), 1.0)
    with pytest.raises(ValueError, match="grads must be contiguous"):
        optim.clip_grad_norm_(np.ones(6)[::2], 1.0)
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="grads must be writable"):
        optim.clip_grad_norm_(ro, 1.0)


# ---- A schedule driving an optimizer, as the trainer does -------------------------------------

@pytest.mark.filterwarnings("ignore::UserWarning")
def test_warmup_cosine_driving_sgd_matches_torch():
    rng = np.random.default_rng(2)
    shapes = [(5, 3), (5,)]
    params = rng.standard_normal(20)
    grads = [rng.standard_normal(20) for _ in range(40)]
    tparams = [torch.tensor(params[:15].reshape(5, 3).copy(), requires_grad=True),
               torch.tensor(params[15:].copy(), requires_grad=True)]
    topt = torch.optim.SGD(tparams, lr=0.2, momentum=0.9, foreach=False)
    tsched = sequential_warmup_cosine(8, 40, 1e-3, 0.05)(topt)
    opt = optim.SGD(lr=0.2, momentum=0.9).bind([("w", shapes[0]), ("b", shapes[1])], "float64")
    sched = optim.WarmupCosineLR(8, 40, eta_min=1e-3, start_factor=0.05)
    for t, g in enumerate(grads):
        tparams[0].grad = torch.tensor(g[:15].reshape(5, 3).copy())
        tparams[1].grad = torch.tensor(g[15:].copy())
        topt.step()
        tsched.step()
        opt.step(params, g, lr=sched.lr_at(opt.step_count, opt.lr))
    expect = np.concatenate([p.detach().numpy().reshape(-1) for p in tparams])
    np.testing.assert_allclose(params, expect, rtol=1e-12, atol=1e-14)
