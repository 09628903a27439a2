"""Loss ops: finite-difference gradients, agreement with torch.nn.functional, stability, errors,
and the Loss descriptions (treadle.loss) the trainer takes."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import treadle as tl
import treadle.loss  # noqa: F401 (makes tl.loss available whatever the package imports)
from opcheck import BACKENDS, gradcheck, run, torch_grads, tol

REDUCTIONS = ["mean", "sum"]
REGRESSION_SHAPES = [(), (1,), (1, 3), (4, 3), (2, 3, 5)]
CLASS_SHAPES = [(4,), (1, 4), (5, 3), (3, 4, 2), (2, 3, 2, 2)]  # logits; (4,) is unbatched


def _labels_shape(logits_shape):
    return logits_shape[1:] if len(logits_shape) == 1 else logits_shape[:1] + logits_shape[2:]


def _classes(logits_shape):
    return logits_shape[0] if len(logits_shape) == 1 else logits_shape[1]


def make_inputs(loss, shape, dtype, rng):
    """(prediction, target) for `loss`; regression differences stay away from the kinks at 0 and +-delta."""
    if loss == "cross_entropy":
        logits = rng.standard_normal(shape).astype(dtype)
        labels = rng.integers(0, _classes(shape), size=_labels_shape(shape)).astype(np.int64)
        return [logits, labels]
    pred = rng.standard_normal(shape).astype(dtype)
    if loss == "bce_with_logits":
        return [pred, rng.uniform(0.0, 1.0, size=shape).astype(dtype)]
    return [pred, rng.standard_normal(shape).astype(dtype)]


# name -> (torch reference taking (pred, target, reduction, **params), differentiable inputs)
LOSSES = {
    "mse_loss": (lambda p, t, r: F.mse_loss(p, t, reduction=r), [0, 1]),
    "l1_loss": (lambda p, t, r: F.l1_loss(p, t, reduction=r), [0, 1]),
    "huber_loss": (lambda p, t, r, delta=1.0: F.huber_loss(p, t, reduction=r, delta=delta), [0, 1]),
    "cross_entropy": (lambda p, t, r: F.cross_entropy(p, t, reduction=r), [0]),
    "bce_with_logits": (lambda p, t, r: F.binary_cross_entropy_with_logits(p, t, reduction=r), [0, 1]),
}


def shapes_for(loss):
    return CLASS_SHAPES if loss == "cross_entropy" else REGRESSION_SHAPES


CASES = [(loss, shape) for loss in LOSSES for shape in shapes_for(loss)]


def compare_with_torch(op, inputs, attrs, backend, seed=0):
    """Forward and every gradient (prediction, and regression targets) against torch.nn.functional."""
    params = {k: v for k, v in attrs.items() if k != "reduction"}
    fn, wrt = LOSSES[op]
    dtype = inputs[0].dtype
    go = np.array(np.random.default_rng(seed).standard_normal(), dtype=dtype)
    outs, grads = run(op, inputs, attrs, [go], backend=backend)
    ref_outs, ref_grads = torch_grads(lambda p, t: fn(p, t, attrs["reduction"], **params), inputs, [go], wrt)
    assert outs[0].shape == () and outs[0].dtype == dtype
    np.testing.assert_allclose(outs[0], ref_outs[0], **tol(dtype), err_msg=f"{op} forward")
    for i in wrt:
        assert grads[i] is not None, f"{op}: no gradient for input {i}"
        assert grads[i].dtype == dtype and grads[i].shape == inputs[i].shape
        np.testing.assert_allclose(grads[i], ref_grads[i], **tol(dtype), err_msg=f"{op} gradient of input {i}")
    if op == "cross_entropy":
        assert grads[1] is None, "class indices get no gradient"
    return outs[0]


# ---- gradients against finite differences ----------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("op,shape", CASES)
def test_gradcheck(backend, op, shape, reduction):
    inputs = make_inputs(op, shape, np.float64, np.random.default_rng(1))
    gradcheck(op, inputs, {"reduction": reduction}, wrt=[0], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("op", ["mse_loss", "l1_loss", "huber_loss", "bce_with_logits"])
def test_gradcheck_target(backend, op, reduction):
    inputs = make_inputs(op, (3, 4), np.float64, np.random.default_rng(2))
    gradcheck(op, inputs, {"reduction": reduction}, wrt=[1], backend=backend)


# ---- agreement with PyTorch -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("op,shape", CASES)
def test_matches_torch(backend, op, shape, reduction, dtype):
    inputs = make_inputs(op, shape, dtype, np.random.default_rng(3))
    compare_with_torch(op, inputs, {"reduction": reduction}, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op,shape", [("mse_loss", (300, 400)), ("bce_with_logits", (70001,)),
                                      ("cross_entropy", (5000, 7)), ("cross_entropy", (64, 10, 50))])
def test_matches_torch_large(backend, op, shape, dtype):
    """Sizes that split the reduction into many chunks."""
    inputs = make_inputs(op, shape, dtype, np.random.default_rng(4))
    first = compare_with_torch(op, inputs, {"reduction": "mean"}, backend)
    again, _ = run(op, inputs, {"reduction": "mean"}, backend=backend)
    assert again[0] == first, "the reduction must be deterministic"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("delta", [0.1, 0.5, 1.0, 2.5])
def test_huber_deltas(backend, delta, reduction, dtype):
    """Differences on both sides of +-delta (never exactly on it), against torch and finite differences."""
    rng = np.random.default_rng(5)
    diff = np.array([-3.1, -1.7, -1.2, -0.8, -0.3, 0.05, 0.4, 0.9, 1.1, 2.0, 4.2]) * delta
    target = rng.standard_normal((2, diff.size))
    pred = target + diff
    attrs = {"reduction": reduction, "delta": delta}
    compare_with_torch("huber_loss", [pred.astype(dtype), target.astype(dtype)], attrs, backend)
    if dtype == np.float64:
        gradcheck("huber_loss", [pred, target], attrs, wrt=[0], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_huber_integer_delta_attr(backend):
    rng = np.random.default_rng(6)
    pred, target = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    outs, _ = run("huber_loss", [pred, target], {"reduction": "sum", "delta": 2}, backend=backend)
    ref = F.huber_loss(torch.tensor(pred), torch.tensor(target), reduction="sum", delta=2.0)
    np.testing.assert_allclose(outs[0], ref.numpy(), **tol(np.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_reduction_is_mean(backend):
    rng = np.random.default_rng(7)
    pred, target = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    outs, _ = run("mse_loss", [pred, target], {}, backend=backend)
    np.testing.assert_allclose(outs[0], np.mean((pred - target) ** 2), **tol(np.float64))


# ---- numerical stability ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce_large_logits(backend, reduction, dtype):
    logits = np.array([-1e4, -800.0, -100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 100.0, 800.0, 1e4])
    logits = np.stack([logits, logits, logits]).astype(dtype)
    target = np.stack([np.zeros(11), np.ones(11), np.full(11, 0.3)]).astype(dtype)
    go = np.array(1.0, dtype=dtype)
    outs, grads = run("bce_with_logits", [logits, target], {"reduction": reduction}, [go], backend=backend)
    assert np.isfinite(outs[0]) and np.all(np.isfinite(grads[0]))
    compare_with_torch("bce_with_logits", [logits, target], {"reduction": reduction}, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_large_logits(backend, reduction, dtype):
    rng = np.random.default_rng(8)
    logits = (rng.standard_normal((6, 5, 3)) * 1e3).astype(dtype)
    logits[0, :, 0] = [1e4, -1e4, 0.0, 1e4, 5e3]  # ties at the maximum, huge spread
    labels = rng.integers(0, 5, size=(6, 3)).astype(np.int64)
    go = np.array(1.0, dtype=dtype)
    outs, grads = run("cross_entropy", [logits, labels], {"reduction": reduction}, [go], backend=backend)
    assert np.isfinite(outs[0]) and np.all(np.isfinite(grads[0]))
    compare_with_torch("cross_entropy", [logits, labels], {"reduction": reduction}, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(300, 10), (7, 2048), (3, 2049), (2000, 1)])
def test_cross_entropy_rows_of_classes(backend, reduction, shape):
    # float32 (N, C) logits take the vectorised exponentials in blocks of whole rows (up to 2048
    # classes; wider rows the per-element path): spreads where exp(x - max) is subnormal or 0, a
    # -inf logit, ties at the maximum, against torch.
    rng = np.random.default_rng(9)
    logits = (rng.standard_normal(shape) * 30).astype(np.float32)
    logits[0, :] = 0.0
    logits[1, 0] = -np.inf
    if shape[1] > 1:
        logits[2, : shape[1] // 2] = -95.0  # exp(-95 - max) underflows below FLT_MIN
        logits[2, -1] = 3.0
    labels = rng.integers(0, shape[1], size=shape[0]).astype(np.int64)
    labels[1] = shape[1] - 1  # not the -inf class: torch's loss would be inf there
    compare_with_torch("cross_entropy", [logits, labels], {"reduction": reduction}, backend)


# ---- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_grad", [False, True])
def test_cross_entropy_label_out_of_range(backend, with_grad):
    logits = np.zeros((5, 5))
    go = [np.array(1.0)] if with_grad else None
    labels = np.array([0, 1, 2, 7, 4], dtype=np.int64)
    with pytest.raises(ValueError, match=r"cross_entropy: label 7 out of range \[0, 5\) at index 3"):
        run("cross_entropy", [logits, labels], {"reduction": "mean"}, go, backend=backend)
    labels = np.array([-1, 1, 2, 3, 4], dtype=np.int64)
    with pytest.raises(ValueError, match=r"label -1 out of range \[0, 5\) at index 0"):
        run("cross_entropy", [logits, labels], {"reduction": "sum"}, go, backend=backend)
    labels = np.array([[0, 1], [2, 3], [4, 5]], dtype=np.int64)  # (N, d) with C = 5
    with pytest.raises(ValueError, match=r"label 5 out of range \[0, 5\) at index \(2, 1\)"):
        run("cross_entropy", [np.zeros((3, 5, 2)), labels], {"reduction": "mean"}, go, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("label_dtype", [np.int32, np.float64])
def test_cross_entropy_label_dtype(backend, label_dtype):
    labels = np.array([0, 1, 2, 3], dtype=label_dtype)
    with pytest.raises(TypeError, match="cross_entropy: labels must be int64"):
        run("cross_entropy", [np.zeros((4, 5)), labels], {"reduction": "mean"}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("logits_shape,labels_shape", [((4, 5), (5,)), ((4, 5), (4, 1)), ((4, 5, 2), (4,)),
                                                       ((4, 5, 2), (4, 5))])
def test_cross_entropy_label_shape(backend, logits_shape, labels_shape):
    labels = np.zeros(labels_shape, dtype=np.int64)
    with pytest.raises(ValueError, match="cross_entropy") as err:
        run("cross_entropy", [np.zeros(logits_shape), labels], {"reduction": "mean"}, backend=backend)
    assert str(logits_shape) in str(err.value) and str(labels_shape) in str(err.value)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["mse_loss", "l1_loss", "huber_loss", "bce_with_logits"])
def test_target_shape_mismatch(backend, op):
    with pytest.raises(ValueError, match=op) as err:
        run(op, [np.zeros((4, 3)), np.zeros((4, 2))], {"reduction": "mean"}, backend=backend)
    assert "(4, 3)" in str(err.value) and "(4, 2)" in str(err.value)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["mse_loss", "l1_loss", "huber_loss", "bce_with_logits"])
def test_target_dtype_mismatch(backend, op):
    with pytest.raises(TypeError, match=op):
        run(op, [np.zeros((4, 3)), np.zeros((4, 3), dtype=np.float32)], {"reduction": "mean"}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(LOSSES))
@pytest.mark.parametrize("reduction", ["none", "Mean", ""])
def test_bad_reduction(backend, op, reduction):
    inputs = make_inputs(op, (4, 3), np.float64, np.random.default_rng(9))
    with pytest.raises(ValueError, match=rf"{op}: reduction must be one of 'mean', 'sum'"):
        run(op, inputs, {"reduction": reduction}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("delta", [0.0, -1.0, float("nan"), float("inf")])
def test_huber_bad_delta(backend, delta):
    with pytest.raises(ValueError, match="huber_loss: delta must be positive"):
        run("huber_loss", [np.zeros(3), np.zeros(3)], {"reduction": "mean", "delta": delta}, backend=backend)


# ---- treadle.loss: the descriptions the trainer takes ---------------------------------------------------

LOSS_CLASSES = [(tl.loss.MSE, "mse", "mse_loss"), (tl.loss.L1, "l1", "l1_loss"), (tl.loss.Huber, "huber", "huber_loss"),
                (tl.loss.CrossEntropy, "cross_entropy", "cross_entropy"),
                (tl.loss.BCEWithLogits, "bce_with_logits", "bce_with_logits")]


@pytest.mark.parametrize("cls,kind,op", LOSS_CLASSES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_loss_classes(cls, kind, op, reduction):
    loss = cls(reduction=reduction)
    assert loss.kind == kind and loss.reduction == reduction and loss.op == op
    assert loss._native.kind == kind
    assert repr(loss).startswith(cls.__name__ + "(") and repr(reduction) in repr(loss)
    assert loss.key() != cls(reduction="sum" if reduction == "mean" else "mean").key()
    assert loss == cls(reduction=reduction)
    with pytest.raises(ValueError, match="reduction must be one of 'mean', 'sum'; got 'none'"):
        cls(reduction="none")


def test_huber_class():
    h = tl.loss.Huber(delta=0.25, reduction="sum")
    assert h.delta == 0.25 and repr(h) == "Huber(delta=0.25, reduction='sum')"
    assert h.key() != tl.loss.Huber(delta=0.5, reduction="sum").key()
    assert tl.loss.Huber().delta == 1.0
    for bad in (0.0, -2.0):
        with pytest.raises(ValueError, match="delta must be positive"):
            tl.loss.Huber(delta=bad)


@pytest.mark.parametrize("cls,kind,op", LOSS_CLASSES)
def test_loss_call_matches_torch(cls, kind, op):
    inputs = make_inputs(op, (5, 3), np.float64, np.random.default_rng(10))
    value = cls(reduction="sum")(*inputs)
    ref = LOSSES[op][0](torch.tensor(inputs[0]), torch.tensor(inputs[1]), "sum")
    np.testing.assert_allclose(value, ref.numpy(), **tol(np.float64))


def test_target_dtype():
    assert tl.loss.MSE().target_dtype("float32") == "float32"
    assert tl.loss.BCEWithLogits().target_dtype("float64") == "float64"
    assert tl.loss.CrossEntropy().target_dtype("float32") == "int64"


def test_check_target_accepts_good_targets():
    tl.loss.MSE().check_target((4, 3), "float64", np.zeros((4, 3)))
    tl.loss.Huber().check_target((4, 3), "float32", np.zeros((4, 3), dtype=np.float32))
    tl.loss.CrossEntropy().check_target((4, 5), "float32", np.array([0, 4, 2, 1], dtype=np.int64))
    tl.loss.CrossEntropy().check_target((2, 5, 3), "float64", np.full((2, 3), 4, dtype=np.int64))
    tl.loss.CrossEntropy().check_target((5,), "float64", np.array(3, dtype=np.int64))


def test_check_target_rejects_bad_labels():
    ce = tl.loss.CrossEntropy()
    with pytest.raises(ValueError, match=r"cross_entropy: label 7 out of range \[0, 5\) at index 3"):
        ce.check_target((5, 5), "float32", np.array([0, 1, 2, 7, 4], dtype=np.int64))
    with pytest.raises(ValueError, match=r"label -3 out of range \[0, 5\) at index 1"):
        ce.check_target((5, 5), "float32", np.array([0, -3, 2, 1, 4], dtype=np.int64))
    with pytest.raises(TypeError, match="labels must be int64"):
        ce.check_target((4, 5), "float32", np.array([0, 1, 2, 3], dtype=np.int32))
    with pytest.raises(ValueError, match=r"labels of shape \(3,\) do not match logits of shape \(4, 5\)"):
        ce.check_target((4, 5), "float32", np.array([0, 1, 2], dtype=np.int64))


@pytest.mark.parametrize("cls", [tl.loss.MSE, tl.loss.L1, tl.loss.Huber, tl.loss.BCEWithLogits])
def test_check_target_rejects_bad_regression_targets(cls):
    with pytest.raises(ValueError, match=r"target shape \(4, 2\) does not match prediction shape \(4, 3\)"):
        cls().check_target((4, 3), "float64", np.zeros((4, 2)))
    with pytest.raises(TypeError, match="target dtype float32 does not match prediction dtype float64"):
        cls().check_target((4, 3), "float64", np.zeros((4, 3), dtype=np.float32))


# ---- in a training plan -----------------------------------------------------------------------------------

TRAIN_CASES = [
    (lambda: tl.loss.CrossEntropy(), lambda rng: rng.integers(0, 5, 8).astype(np.int64),
     lambda o, y: F.cross_entropy(o, y)),
    (lambda: tl.loss.MSE("sum"), lambda rng: rng.standard_normal((8, 5)).astype(np.float32),
     lambda o, y: F.mse_loss(o, y, reduction="sum")),
    (lambda: tl.loss.L1(), lambda rng: rng.standard_normal((8, 5)).astype(np.float32), lambda o, y: F.l1_loss(o, y)),
    (lambda: tl.loss.Huber(0.5), lambda rng: rng.standard_normal((8, 5)).astype(np.float32),
     lambda o, y: F.huber_loss(o, y, delta=0.5)),
    (lambda: tl.loss.BCEWithLogits(), lambda rng: rng.uniform(size=(8, 5)).astype(np.float32),
     lambda o, y: F.binary_cross_entropy_with_logits(o, y)),
]


def _trainer(loss):
    if not hasattr(tl.optim, "SGD"):
        pytest.skip("needs tl.optim.SGD")
    return tl.Trainer(tl.nn.Sequential(tl.nn.Linear(3, 5)), loss, tl.optim.SGD(lr=0.1))


@pytest.mark.parametrize("make_loss,make_target,reference", TRAIN_CASES)
def test_trainer_step_loss_matches_torch(make_loss, make_target, reference):
    rng = np.random.default_rng(11)
    trainer = _trainer(make_loss())
    x, y = rng.standard_normal((8, 3)).astype(np.float32), make_target(rng)
    state = {k: torch.tensor(np.array(v)) for k, v in trainer.model.state_dict().items()}
    expected = reference(torch.tensor(x) @ state["0.weight"].T + state["0.bias"], torch.tensor(y)).item()
    assert trainer.step(x, y) == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_trainer_rejects_bad_labels_before_any_update():
    rng = np.random.default_rng(12)
    trainer = _trainer(tl.loss.CrossEntropy())
    before = {k: np.array(v, copy=True) for k, v in trainer.model.state_dict().items()}
    x = rng.standard_normal((4, 3)).astype(np.float32)
    with pytest.raises(ValueError, match=r"cross_entropy: label 9 out of range \[0, 5\) at index 2"):
        trainer.step(x, np.array([0, 1, 9, 2], dtype=np.int64))
    with pytest.raises(TypeError, match="int64"):
        trainer.step(x, np.array([0, 1, 2, 2], dtype=np.int32))
    after = trainer.model.state_dict()
    assert all(np.array_equal(before[k], np.array(after[k])) for k in before)
    trainer.step(x, np.array([0, 1, 4, 2], dtype=np.int64))  # a good batch still trains


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_unbatched_cross_entropy_takes_a_0d_label_as_torch_does(dtype):
    """logits of shape (C,) with a 0-d class index: the functional call used to turn the label into
    shape (1,) on its way to the op, and refuse it."""
    logits = np.array([0.3, -1.2, 2.0, 0.1], dtype)
    for label in range(4):
        got = tl.loss.CrossEntropy()(logits, np.array(label))
        expected = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(label)).item()
        np.testing.assert_allclose(got, expected, rtol=1e-6 if dtype == "float32" else 1e-13)
