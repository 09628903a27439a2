"""Property-based fuzzing of the public Python API (hypothesis): random shapes, dtypes, strides,
special values and argument combinations for layers, activations, softmax, losses, optimizers and
the trainer. Every call either succeeds with a result of the documented shape (finite where the
inputs are finite and moderate) or raises ValueError/TypeError; nothing crashes or hangs, and a
raised error leaves the model's flat parameter buffer, its step count and gradients' owner intact.
"""
import math

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import treadle as tl  # noqa: E402

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
DOCUMENTED = (ValueError, TypeError)
SPECIALS = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e38, -1e38, 1e-45, 1e-310, 5e-324]
DTYPES = ["float32", "float64", "float16", "int32", "int64", "bool", "complex64"]


@st.composite
def arrays(draw, shape=None, dtype=None, special=True):
    """An array of random shape/dtype/values, sometimes non-contiguous (strided or transposed)."""
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    dtype = dtype or draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(["c", "strided", "transposed", "fortran"]))
    big = tuple(2 * d if layout == "strided" else d for d in shape)
    seed = draw(st.integers(0, 2**32 - 1))
    r = np.random.default_rng(seed)
    a = r.standard_normal(big) * draw(st.sampled_from([1.0, 1e-3, 1e3]))
    if special and a.size and draw(st.booleans()):
        flat = a.reshape(-1)
        for v in draw(st.lists(st.sampled_from(SPECIALS), min_size=1, max_size=3)):
            flat[r.integers(0, flat.size)] = v
    with np.errstate(all="ignore"):
        a = a.astype(dtype)
    if layout == "strided":
        a = a[tuple(slice(None, None, 2) for _ in shape)]
    elif layout == "transposed" and a.ndim >= 2:
        a = np.ascontiguousarray(a.T).T if draw(st.booleans()) else a.swapaxes(0, 1).copy().swapaxes(0, 1)
    elif layout == "fortran":
        a = np.asfortranarray(a)
    return a


def _finite_moderate(a):
    return np.issubdtype(a.dtype, np.floating) and np.isfinite(a).all() and np.abs(a).max(initial=0) < 1e4


def _snapshot(net):
    return net.flat_parameters().copy()


def _expect_unchanged(net, before):
    np.testing.assert_array_equal(net.flat_parameters(), before)


ACTIVATIONS = [
    lambda: tl.nn.ReLU(), lambda: tl.nn.Tanh(), lambda: tl.nn.Sigmoid(), lambda: tl.nn.SiLU(),
    lambda: tl.nn.GELU(), lambda: tl.nn.GELU("tanh"), lambda: tl.nn.ELU(0.7), lambda: tl.nn.LeakyReLU(0.2),
    lambda: tl.nn.Softplus(2.0, 10.0), lambda: tl.nn.Softmax(-1), lambda: tl.nn.LogSoftmax(1),
]


@FUZZ
@given(fin=st.integers(1, 6), fout=st.integers(1, 6), bias=st.booleans(),
       mdtype=st.sampled_from(["float32", "float64"]), act=st.integers(0, len(ACTIVATIONS) - 1), data=st.data())
def test_fuzz_linear_and_activation_predict(fin, fout, bias, mdtype, act, data):
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(fin, fout, bias=bias, dtype=mdtype), ACTIVATIONS[act]())
    before = _snapshot(net)
    if data.draw(st.booleans()):  # the right signature, still with random dtype/strides/values
        x = data.draw(arrays(shape=(data.draw(st.integers(1, 4)), fin)))
    else:
        x = data.draw(arrays())
    try:
        out = net.predict(x)
    except DOCUMENTED:
        _expect_unchanged(net, before)
        return
    assert out.shape == (x.shape[0], fout) and out.dtype == np.dtype(mdtype)
    if _finite_moderate(x):
        assert np.isfinite(out).all()
    _expect_unchanged(net, before)  # inference never writes parameters


@FUZZ
@given(act=st.integers(0, len(ACTIVATIONS) - 1), data=st.data())
def test_fuzz_activation_shapes_and_values(act, data):
    net = tl.nn.Sequential(ACTIVATIONS[act]())
    x = data.draw(arrays(dtype=data.draw(st.sampled_from(["float32", "float64", "int64", "float16"]))))
    try:
        out = net.predict(x)
    except DOCUMENTED:
        return
    assert out.shape == x.shape and out.dtype == x.dtype
    if _finite_moderate(x):
        assert np.isfinite(out).all()


def _loss(kind, delta, reduction):
    if kind == "huber":
        return tl.loss.Huber(delta=delta, reduction=reduction)
    return {"mse": tl.loss.MSE, "l1": tl.loss.L1, "ce": tl.loss.CrossEntropy,
            "bce": tl.loss.BCEWithLogits}[kind](reduction=reduction)


@FUZZ
@given(kind=st.sampled_from(["mse", "l1", "huber", "ce", "bce"]), delta=st.sampled_from([1.0, 0.5, 0.0, -1.0, np.nan]),
       reduction=st.sampled_from(["mean", "sum", "none", "bogus"]), check_finite=st.booleans(),
       skip_nonfinite=st.booleans(), data=st.data())
def test_fuzz_loss_and_trainer_step(kind, delta, reduction, check_finite, skip_nonfinite, data):
    try:
        loss = _loss(kind, delta, reduction)
    except DOCUMENTED:
        return
    tl.manual_seed(1)
    net = tl.nn.Sequential(tl.nn.Linear(3, 4), tl.nn.Tanh(), tl.nn.Linear(4, 2))
    trainer = tl.Trainer(net, loss, tl.optim.Adam(lr=1e-2), check_finite=check_finite,
                         skip_nonfinite=skip_nonfinite)
    n = data.draw(st.integers(1, 4))
    x = data.draw(arrays(shape=(n, 3) if data.draw(st.booleans()) else None))
    if kind == "ce" and data.draw(st.booleans()):
        y = np.array(data.draw(st.lists(st.integers(-2, 3), min_size=n, max_size=n)), np.int64)
    else:
        y = data.draw(arrays(shape=(n, 2) if data.draw(st.booleans()) else None))
    before, steps = _snapshot(net), trainer.steps
    try:
        value = trainer.step(x, y)
    except DOCUMENTED:
        _expect_unchanged(net, before)
        assert trainer.steps == steps
        return
    assert isinstance(value, float)
    if _finite_moderate(x) and (y.dtype == np.int64 or _finite_moderate(y)):
        assert math.isfinite(value)
    if check_finite:  # non-finite data is rejected, never trained on
        assert not np.issubdtype(x.dtype, np.floating) or np.isfinite(x).all()
    if skip_nonfinite and not math.isfinite(value):
        _expect_unchanged(net, before)
        assert trainer.skipped_steps == 1


OPTIMIZERS = {
    "sgd": lambda a: tl.optim.SGD(lr=a[0], momentum=abs(a[1]), weight_decay=a[2], nesterov=a[3]),
    "adam": lambda a: tl.optim.Adam(lr=a[0], betas=(a[1], 0.999), eps=abs(a[2]), amsgrad=a[3]),
    "adamw": lambda a: tl.optim.AdamW(lr=a[0], betas=(0.9, a[1]), weight_decay=a[2]),
    "rmsprop": lambda a: tl.optim.RMSprop(lr=a[0], alpha=a[1], momentum=a[2], centered=a[3]),
    "adagrad": lambda a: tl.optim.Adagrad(lr=a[0], lr_decay=a[1], eps=abs(a[2])),
    "rowwise": lambda a: tl.optim.RowWiseAdagrad(lr=a[0], initial_accumulator_value=a[1]),
}
HYPER = st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0, 1.5, -0.1, np.nan, np.inf, 1e-8])


@FUZZ
@given(name=st.sampled_from(sorted(OPTIMIZERS)), a0=HYPER, a1=HYPER, a2=HYPER, a3=st.booleans(),
       clip=st.sampled_from([None, 1.0, 1e-3, 0.0, -1.0, np.nan]), data=st.data())
def test_fuzz_optimizer_arguments_and_steps(name, a0, a1, a2, a3, clip, data):
    try:
        opt = OPTIMIZERS[name]((a0, a1, a2, a3))
    except DOCUMENTED:
        return
    tl.manual_seed(2)
    net = tl.nn.Sequential(tl.nn.Linear(3, 2))
    try:
        trainer = tl.Trainer(net, tl.loss.MSE(), opt, clip_grad_norm=clip)
    except DOCUMENTED:
        return
    x = data.draw(arrays(shape=(2, 3), dtype="float32", special=False))
    y = data.draw(arrays(shape=(2, 2), dtype="float32", special=False))
    before = _snapshot(net)
    try:
        value = trainer.step(x, y)
    except DOCUMENTED:
        _expect_unchanged(net, before)
        return
    assert math.isfinite(value)
    assert trainer.steps == 1


@FUZZ
@given(data=st.data())
def test_fuzz_step_api_phases(data):
    tl.manual_seed(3)
    net = tl.nn.Sequential(tl.nn.Linear(3, 2))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    before = _snapshot(net)
    x = data.draw(arrays(shape=(2, 3) if data.draw(st.booleans()) else None))
    try:
        out = trainer.forward(x, input_grad=data.draw(st.booleans()))
    except DOCUMENTED:
        _expect_unchanged(net, before)
        return
    g = data.draw(arrays(shape=out.shape if data.draw(st.booleans()) else None))
    try:
        trainer.backward(g, input_grad=data.draw(st.booleans()))
    except DOCUMENTED:
        pass
    _expect_unchanged(net, before)  # no update without update()
