"""predict computes an output straight into the caller's buffer where that is safe (Bindings::outputs),
and copies otherwise: every case gives the result of a fresh predict, bitwise."""
import numpy as np
import pytest

import treadle as tl
import treadle.functional as F


def _mlp(final_act):
    layers = [tl.nn.Linear(16, 64), tl.nn.Tanh(), tl.nn.Linear(64, 16)]
    if final_act:
        layers.append(tl.nn.Tanh())  # fused into the linear: the output is a view of its result
    return tl.nn.Sequential(*layers)


@pytest.mark.parametrize("final_act", [False, True])
def test_out_buffer_gets_the_fresh_result(final_act):
    m = _mlp(final_act)
    x = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
    want = m.predict(x)
    out = np.full((300, 16), np.nan, np.float32)
    got = m.predict(x, out=out)
    assert np.shares_memory(got, out)
    np.testing.assert_array_equal(out, want)
    # A second call into the same buffer, whose old contents no step may read.
    out[:] = 1e30
    m.predict(x, out=out)
    np.testing.assert_array_equal(out, want)


SQUARE_MODELS = {"linear": lambda: tl.nn.Linear(16, 16), "mlp": lambda: _mlp(final_act=False)}


@pytest.mark.parametrize("name", SQUARE_MODELS)
def test_out_that_is_the_input_reads_the_input_whole_first(name):
    m = SQUARE_MODELS[name]()  # 16 -> 16: out=x is a valid call
    x = np.random.default_rng(1).standard_normal((300, 16)).astype(np.float32)
    want = m.predict(x.copy())
    m.predict(x, out=x)
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("name", SQUARE_MODELS)
@pytest.mark.parametrize("shift", [-100, 100])
def test_out_overlapping_the_input_partly(name, shift):
    m = SQUARE_MODELS[name]()
    buf = np.random.default_rng(2).standard_normal((400, 16)).astype(np.float32)
    x = buf[100:400] if shift < 0 else buf[:300]
    out = buf[:300] if shift < 0 else buf[100:400]
    want = m.predict(x.copy())
    m.predict(x, out=out)
    np.testing.assert_array_equal(out, want)


class TwoViews(tl.nn.Module):
    """Two outputs with the same memory (a tensor and a reshape of it), and the input itself."""

    def __init__(self):
        super().__init__()
        self.fc = tl.nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y, F.reshape(y, (-1,)), x


def test_outputs_sharing_memory_and_an_input_output():
    m = TwoViews()
    x = np.random.default_rng(3).standard_normal((64, 8)).astype(np.float32)
    sd = m.state_dict()
    want = (x.astype(np.float64) @ sd["fc.weight"].T.astype(np.float64) + sd["fc.bias"]).astype(np.float32)
    for _ in range(2):  # the returned arrays are computed in place where they may be
        y, flat, same = m.predict(x)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(flat, y.reshape(-1))
        np.testing.assert_array_equal(same, x)
        assert not np.shares_memory(y, flat) and not np.shares_memory(same, x)


def test_elementwise_tail_into_out_buffer():
    """A long elementwise chain ending in the output runs block by block; its last step writes the
    caller's buffer."""

    class Chain(tl.nn.Module):
        def forward(self, x):
            y = x
            for _ in range(6):
                y = F.add(F.mul(y, x), x)
            return F.tanh(y)

    m = Chain()
    x = np.random.default_rng(4).uniform(-1, 1, (512, 64)).astype(np.float32)
    want = m.predict(x)
    ref = x.astype(np.float64)
    y = ref
    for _ in range(6):
        y = y * ref + ref
    np.testing.assert_allclose(want, np.tanh(y), rtol=1e-5, atol=1e-6)
    out = np.empty_like(x)
    m.predict(x, out=out)
    np.testing.assert_array_equal(out, want)
