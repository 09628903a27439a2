"""Inputs a torch user passes without thinking: strided slices, transposes, Fortran order and read-only
arrays are taken (a non-contiguous input is copied once into C order) and give exactly what their
contiguous copies give; an out= array, written in place, must still be C-contiguous; a dtype mismatch
says how to fix it."""
import numpy as np
import pytest

import treadle as tl

rng = np.random.default_rng(3)
BASE = rng.standard_normal((12, 10)).astype(np.float32)
Y = rng.standard_normal((12, 2)).astype(np.float32)


def _net(seed=0):
    tl.manual_seed(seed)
    return tl.nn.Sequential(tl.nn.Linear(5, 8), tl.nn.Tanh(), tl.nn.Linear(8, 2))


def _layouts():
    x = BASE[:, ::2]  # strided columns
    fortran = np.asfortranarray(x)
    transposed = np.ascontiguousarray(x.T).T  # a transpose view
    readonly = np.ascontiguousarray(x)
    readonly.flags.writeable = False
    return {"strided": x, "fortran": fortran, "transposed": transposed, "readonly": readonly}


@pytest.mark.parametrize("layout", ["strided", "fortran", "transposed", "readonly"])
def test_predict_takes_any_layout(layout):
    x = _layouts()[layout]
    net = _net()
    np.testing.assert_array_equal(net.predict(x), net.predict(np.ascontiguousarray(x)))
    net.eval()
    np.testing.assert_array_equal(net(x), net.predict(np.ascontiguousarray(x)))


@pytest.mark.parametrize("layout", ["strided", "fortran", "transposed", "readonly"])
def test_training_calls_take_any_layout(layout):
    x = _layouts()[layout]
    y = np.asfortranarray(Y)  # a non-contiguous target too
    a, b = _net(), _net()
    ta = tl.Trainer(a, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    tb = tl.Trainer(b, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    xc, yc = np.ascontiguousarray(x), np.ascontiguousarray(y)
    assert [ta.step(x, y) for _ in range(3)] == [tb.step(xc, yc) for _ in range(3)]
    assert ta.evaluate(x, y) == tb.evaluate(xc, yc)
    assert ta.compute_gradients(x, y) == tb.compute_gradients(xc, yc)
    np.testing.assert_array_equal(ta.forward(x), tb.forward(xc))
    np.testing.assert_array_equal(a.flat_parameters(), b.flat_parameters())


def test_backward_takes_a_transposed_gradient():
    a, b = _net(), _net()
    ta = tl.Trainer(a, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    tb = tl.Trainer(b, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = np.ascontiguousarray(BASE[:, :5])
    g = np.ascontiguousarray(Y.T).T  # (12, 2) viewed through a transpose
    for t, grad in ((ta, g), (tb, np.ascontiguousarray(g))):
        t.forward(x)
        t.backward(grad)
        t.update()
    np.testing.assert_array_equal(a.flat_parameters(), b.flat_parameters())


def test_the_input_is_read_not_kept():
    # the copy is the tensor's: changing the caller's array after the call changes nothing
    x = BASE[:, ::2].copy(order="F")
    net = _net()
    first = net.predict(x)
    x[:] = 0
    again = net.predict(BASE[:, ::2])
    np.testing.assert_array_equal(first, again)


def test_a_non_contiguous_out_is_refused_with_the_fix():
    net = _net()
    out = np.empty((12, 4), np.float32)[:, ::2]
    with pytest.raises(ValueError, match=r"predict\(out=\.\.\.\): .* not C-contiguous; an output is written in place"):
        net.predict(np.ascontiguousarray(BASE[:, :5]), out=out)
    readonly = np.empty((12, 2), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        net.predict(np.ascontiguousarray(BASE[:, :5]), out=readonly)


def test_a_dtype_mismatch_says_how_to_fix_it():
    net = _net()
    with pytest.raises(TypeError, match=r"got float64; convert the data \(x\.astype\(np\.float32\)\) or the model "
                                        r"\(model\.to\(\"float64\"\)\)"):
        net.predict(BASE[:, :5].astype(np.float64))


def test_fit_casts_other_float_data_once_with_a_warning():
    x64, y64 = BASE[:, :5].astype(np.float64), Y.astype(np.float64)
    a, b = _net(), _net()
    ta = tl.Trainer(a, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    tb = tl.Trainer(b, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    with pytest.warns(UserWarning) as caught:
        hist = ta.fit(x64, y64, epochs=2, batch_size=4, shuffle=False, validation=(x64, y64))
    messages = [str(w.message) for w in caught]
    assert [m.split(" from")[0] for m in messages] == ["fit: casting x", "fit: casting y", "fit: casting validation x",
                                                      "fit: casting validation y"]  # once each, not per batch
    assert all("float64 to the model's float32" in m and w.filename == __file__ for m, w in zip(messages, caught))
    ref = tb.fit(x64.astype(np.float32), y64.astype(np.float32), epochs=2, batch_size=4, shuffle=False,
                 validation=(x64.astype(np.float32), y64.astype(np.float32)))
    assert hist == ref
    np.testing.assert_array_equal(a.flat_parameters(), b.flat_parameters())
    with pytest.raises(TypeError, match="astype"):  # step never casts
        ta.step(x64, y64)


def test_nested_lists_are_data():
    """A nested list of numbers is copied once into an array (floats in the model's dtype, integers
    int64), as torch.tensor(list) would be; a list of arrays stays several inputs."""
    net, ref = _net().eval(), _net()
    rows = BASE[:3, :5].tolist()
    expected = net.predict(np.asarray(rows, np.float32))
    np.testing.assert_array_equal(net(rows), expected)
    np.testing.assert_array_equal(net.predict(tuple(map(tuple, rows))), expected)
    ta = tl.Trainer(_net(), tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    tb = tl.Trainer(ref, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    assert ta.step(rows, Y[:3].tolist()) == tb.step(np.asarray(rows, np.float32), Y[:3])
    assert ta.evaluate(rows, Y[:3].tolist()) == tb.evaluate(np.asarray(rows, np.float32), Y[:3])
    with pytest.raises(ValueError, match="rectangular"):
        net.predict([[1.0, 2.0], [3.0]])


def test_trace_errors_name_the_module():
    class Body(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = tl.nn.Sequential(tl.nn.Linear(5, 8), tl.nn.ReLU(), tl.nn.Linear(7, 2))

        def forward(self, x):
            return self.layers(x)

    with pytest.raises(ValueError, match=r"^module 'layers\.2' \(Linear\(in_features=7, out_features=2, bias=True\)\): "
                                         r"linear: expected input of shape \(N, 7\), got \(12, 8\)$"):
        Body().predict(np.ascontiguousarray(BASE[:, :5]))
