"""Bad input from Python raises ValueError/TypeError naming the problem, never kills the process, and
leaves the model untouched: weights (flat buffer), optimizer step count and state, and - for calls
that do not start a step - gradients. Afterwards the trainer still computes exactly what a twin that
never saw the bad call computes."""
import numpy as np
import pytest

import treadle as tl

N_IN, N_OUT, BATCH = 4, 3, 5


def _net():
    tl.manual_seed(21)
    return tl.nn.Sequential(tl.nn.Linear(N_IN, 8), tl.nn.Tanh(), tl.nn.Linear(8, N_OUT))


class Setup:
    """A model with an MSE trainer and a cross-entropy trainer, each with one valid step behind it."""

    def __init__(self, check_finite=True):
        self.net = _net()
        self.mse = tl.Trainer(self.net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), check_finite=check_finite)
        self.ce = tl.Trainer(self.net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-2), check_finite=check_finite)
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((BATCH, N_IN)).astype(np.float32)
        self.y = rng.standard_normal((BATCH, N_OUT)).astype(np.float32)
        self.labels = np.array([0, 2, 1, 1, 0], np.int64)
        self.mse.step(self.x, self.y)
        self.ce.step(self.x, self.labels)
        self.mse.zero_grad()
        self.mse.compute_gradients(self.x, self.y)  # non-zero gradients that must survive

    def snapshot(self):
        return dict(params=self.net.flat_parameters().copy(), grads=self.net.flat_gradients().copy(),
                    steps=(self.mse.steps, self.ce.steps),
                    state=[{k: v.copy() for k, v in t.optimizer.state().items()} for t in (self.mse, self.ce)])

    def valid_round(self):
        """A valid step on each trainer and a predict: what follows any bad call."""
        return self.mse.step(self.x, self.y), self.ce.step(self.x, self.labels), self.net.predict(self.x)


def _f32(*shape, fill=0.0):
    return np.full(shape, fill, np.float32)


def _readonly(a):
    a.setflags(write=False)
    return a


# (id, call(setup), exception, words the message must contain, whether the call may zero gradients)
CASES = [
    ("features_predict", lambda s: s.net.predict(_f32(BATCH, N_IN + 1)), ValueError,
     ["linear", f"(N, {N_IN})", f"({BATCH}, {N_IN + 1})"], False),
    ("features_step", lambda s: s.mse.step(_f32(BATCH, N_IN - 1), s.y), ValueError,
     [f"(N, {N_IN})", f"({BATCH}, {N_IN - 1})"], True),
    ("features_forward", lambda s: s.mse.forward(_f32(BATCH, 7)), ValueError, [f"({BATCH}, 7)"], False),
    ("features_1d", lambda s: s.net.predict(_f32(N_IN + 2)), ValueError, [f"({N_IN + 2},)"], False),
    ("scalar_input", lambda s: s.net.predict(np.array(1.0, np.float32)), ValueError, ["scalar"], False),
    ("float64_into_float32", lambda s: s.net.predict(np.zeros((BATCH, N_IN))), TypeError,
     ["float32", "float64"], False),
    ("float64_step", lambda s: s.mse.step(np.zeros((BATCH, N_IN)), s.y), TypeError, ["float32", "float64"], True),
    ("int_input", lambda s: s.net.predict(np.zeros((BATCH, N_IN), np.int64)), TypeError, ["float32", "int64"], False),
    ("float16_input", lambda s: s.net.predict(np.zeros((BATCH, N_IN), np.float16)), TypeError, ["float16"], False),
    ("bool_input", lambda s: s.mse.evaluate(np.zeros((BATCH, N_IN), bool), s.y), TypeError, ["bool"], False),
    ("nan_input", lambda s: s.mse.step(np.where(np.eye(BATCH, N_IN) > 0, np.nan, s.x).astype(np.float32), s.y),
     ValueError, ["input", "NaN"], True),
    ("inf_input_compute_gradients", lambda s: s.mse.compute_gradients(s.x * np.float32(np.inf), s.y),
     ValueError, ["input", "Inf"], False),
    ("nan_target", lambda s: s.mse.step(s.x, _f32(BATCH, N_OUT, fill=np.nan)), ValueError, ["target", "NaN"], True),
    ("non_finite_loss", lambda s: s.mse.step(s.x, _f32(BATCH, N_OUT, fill=3e38)), ValueError,
     ["loss", "inf", "unchanged"], True),
    ("label_too_big", lambda s: s.ce.step(s.x, np.array([0, 1, 3, 0, 0])), ValueError,
     ["cross_entropy", "3", "[0, 3)"], True),
    ("label_negative", lambda s: s.ce.compute_gradients(s.x, np.array([0, 1, 2, 0, -1])), ValueError,
     ["-1", "[0, 3)"], False),
    ("label_int32", lambda s: s.ce.step(s.x, s.labels.astype(np.int32)), TypeError, ["int64", "int32"], True),
    ("label_float", lambda s: s.ce.evaluate(s.x, s.labels.astype(np.float32)), TypeError, ["int64", "float32"],
     False),
    ("label_shape", lambda s: s.ce.step(s.x, s.labels[:, None]), ValueError, ["(5, 1)", f"({BATCH},)"], True),
    # Non-contiguous inputs and targets are copied, not refused (tests/test_lenient_inputs.py); an out=
    # array is written in place, so it must be C-contiguous.
    ("non_contiguous_out", lambda s: s.net.predict(s.x, out=_f32(BATCH, 2 * N_OUT)[:, ::2]), ValueError,
     ["not C-contiguous", "written in place"], False),
    ("readonly_out", lambda s: s.net.predict(s.x, out=_readonly(_f32(BATCH, N_OUT))), ValueError, ["read-only"],
     False),
    ("out_shape", lambda s: s.net.predict(s.x, out=_f32(BATCH, N_OUT + 1)), ValueError,
     [f"({BATCH}, {N_OUT})", f"({BATCH}, {N_OUT + 1})"], False),
    ("out_dtype", lambda s: s.net.predict(s.x, out=np.zeros((BATCH, N_OUT))), (ValueError, TypeError),
     ["float32", "float64"], False),
    # Rectangular nested lists are data (tests/test_lenient_inputs.py); ragged ones are refused.
    ("ragged_list_predict", lambda s: s.net.predict([[1.0], [1.0, 2.0]]), ValueError, ["rectangular", "list"], False),
    ("ragged_list_target", lambda s: s.mse.step(s.x, [[1.0], [2.0, 3.0]]), ValueError, ["rectangular", "list"], False),
    ("none_input", lambda s: s.net.predict(None), TypeError, ["NoneType"], False),
    ("empty_batch", lambda s: s.net.predict(_f32(0, N_IN)), ValueError, ["empty", f"(0, {N_IN})"], False),
    ("empty_batch_step", lambda s: s.mse.step(_f32(0, N_IN), _f32(0, N_OUT)), ValueError, ["empty"], True),
    ("mse_target_shape", lambda s: s.mse.step(s.x, _f32(BATCH, 1)), ValueError,
     ["mse", f"({BATCH}, 1)", f"({BATCH}, {N_OUT})"], True),
    ("mse_target_batch", lambda s: s.mse.evaluate(s.x, _f32(BATCH - 1, N_OUT)), ValueError,
     [f"({BATCH - 1}, {N_OUT})", f"({BATCH}, {N_OUT})"], False),
    ("mse_target_dtype", lambda s: s.mse.step(s.x, s.y.astype(np.float64)), TypeError, ["float32", "float64"], True),
]


def _backward_case(grad):
    def call(s):
        s.mse.forward(s.x)
        s.mse.backward(grad(s))
    return call


CASES += [
    ("backward_shape", _backward_case(lambda s: _f32(BATCH, N_OUT + 2)), ValueError,
     ["grad_output", f"({BATCH}, {N_OUT})", f"({BATCH}, {N_OUT + 2})"], False),
    ("backward_transposed", _backward_case(lambda s: _f32(N_OUT, BATCH)), ValueError,
     [f"({BATCH}, {N_OUT})", f"({N_OUT}, {BATCH})"], False),
    ("backward_dtype", _backward_case(lambda s: np.zeros((BATCH, N_OUT))), TypeError, ["float32", "float64"], False),
    ("backward_nan", _backward_case(lambda s: _f32(BATCH, N_OUT, fill=np.nan)), ValueError, ["NaN"], False),
    ("backward_list", _backward_case(lambda s: [[0.0] * N_OUT] * BATCH), TypeError, ["list"], False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_and_changes_nothing(case):
    _, call, exc, words, may_zero_grads = case
    s = Setup()
    twin = Setup()
    before = s.snapshot()
    with pytest.raises(exc) as info:
        call(s)
    assert isinstance(info.value, (ValueError, TypeError))
    message = str(info.value)
    for w in words:
        assert w in message, f"message {message!r} does not mention {w!r}"
    after = s.snapshot()
    np.testing.assert_array_equal(after["params"], before["params"])
    assert after["steps"] == before["steps"]
    for st_after, st_before in zip(after["state"], before["state"]):
        assert st_after.keys() == st_before.keys()
        for k in st_after:
            np.testing.assert_array_equal(st_after[k], st_before[k])
    if not may_zero_grads:
        np.testing.assert_array_equal(after["grads"], before["grads"])
    # The trainer and model still work, exactly as if the bad call had not happened.
    got, expect = s.valid_round(), twin.valid_round()
    assert got[0] == expect[0] and got[1] == expect[1]
    np.testing.assert_array_equal(got[2], expect[2])
    np.testing.assert_array_equal(s.net.flat_parameters(), twin.net.flat_parameters())


def test_bad_input_on_a_fresh_model_compiles_nothing():
    net = _net()
    with pytest.raises(ValueError):
        net.predict(_f32(2, N_IN + 1))
    assert net._compiled().num_plans == 0
    assert net.predict(_f32(2, N_IN)).shape == (2, N_OUT)
    assert net._compiled().num_plans == 1


def test_errors_are_the_builtin_exception_types():
    net = _net()
    with pytest.raises(ValueError) as info:
        net.predict(_f32(2, 9))
    assert type(info.value).__mro__[1] is ValueError  # a subclass of the builtin, catchable as ValueError
    with pytest.raises(TypeError) as info:
        net.predict(np.zeros((2, N_IN)))
    assert issubclass(type(info.value), TypeError)


def test_one_thousand_bad_calls_leak_nothing_and_change_nothing():
    """Error paths release what they took (GIL, contexts, array references)."""
    import sys

    s = Setup()
    before = s.snapshot()
    bad = _f32(BATCH, N_IN + 1)
    refs = sys.getrefcount(bad)
    for _ in range(1000):
        with pytest.raises(ValueError):
            s.net.predict(bad)
        with pytest.raises(ValueError):
            s.mse.step(bad, s.y)
    assert sys.getrefcount(bad) == refs
    np.testing.assert_array_equal(s.net.flat_parameters(), before["params"])
    assert s.snapshot()["steps"] == before["steps"]


def test_nan_is_accepted_without_check_finite():
    s = Setup(check_finite=False)
    loss = s.mse.evaluate(np.full((BATCH, N_IN), np.nan, np.float32), s.y)
    assert np.isnan(loss)


def test_predict_rejects_a_context_of_the_wrong_type():
    net = tl.nn.Sequential(tl.nn.Linear(8, 3))
    with pytest.raises(TypeError, match="predict: context must be a treadle Context or None, got int"):
        net.predict(np.ones((1, 8), np.float32), context=3)
