"""torch's constructor conventions on every treadle module: dtype as a torch dtype, device="cpu",
inplace flags; and Softmax / LogSoftmax without dim following torch's implicit dim (with its warning)."""
import warnings

import numpy as np
import pytest
import torch

import treadle as tl

FACTORIES = {
    "Linear": lambda **kw: tl.nn.Linear(3, 4, **kw),
    "Conv2d": lambda **kw: tl.nn.Conv2d(1, 2, 3, **kw),
    "LayerNorm": lambda **kw: tl.nn.LayerNorm(4, **kw),
    "BatchNorm1d": lambda **kw: tl.nn.BatchNorm1d(4, **kw),
    "Embedding": lambda **kw: tl.nn.Embedding(5, 3, **kw),
    "LSTM": lambda **kw: tl.nn.LSTM(3, 4, **kw),
    "GRUCell": lambda **kw: tl.nn.GRUCell(3, 4, **kw),
    "MultiheadAttention": lambda **kw: tl.nn.MultiheadAttention(4, 2, **kw),
    "TransformerEncoderLayer": lambda **kw: tl.nn.TransformerEncoderLayer(4, 2, 8, **kw),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_torch_dtype_and_cpu_device_are_accepted(name):
    make = FACTORIES[name]
    module = make(dtype=torch.float64, device="cpu")
    assert {p.dtype for _, p in module.named_parameter_objects() for p in [p.data]} == {np.dtype(np.float64)}
    module = make(dtype=torch.float32, device=torch.device("cpu"))
    assert {p.dtype for _, p in module.named_parameter_objects() for p in [p.data]} == {np.dtype(np.float32)}
    with pytest.raises(ValueError, match="set_backend"):
        make(device="cuda")
    with pytest.raises(TypeError, match="float32 or float64"):
        make(dtype=torch.int64)


def test_inplace_flags_are_accepted():
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    for plain, flagged in [(tl.nn.ReLU(), tl.nn.ReLU(True)), (tl.nn.LeakyReLU(0.2), tl.nn.LeakyReLU(0.2, inplace=True)),
                           (tl.nn.ELU(), tl.nn.ELU(inplace=True)), (tl.nn.Dropout(0.3), tl.nn.Dropout(0.3, True))]:
        np.testing.assert_array_equal(tl.nn.Sequential(flagged).predict(x), tl.nn.Sequential(plain).predict(x))
    with pytest.raises(TypeError, match="unexpected"):
        tl.nn.ReLU(True, True)


@pytest.mark.parametrize("cls", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape", [(5,), (2, 5), (2, 3, 4), (2, 3, 4, 5)])
def test_softmax_without_dim_is_torchs(cls, shape):
    x = np.random.default_rng(0).standard_normal(shape)
    net = tl.nn.Sequential(getattr(tl.nn, cls)()).double()
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        ours = net.predict(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = getattr(torch.nn, cls)()(torch.tensor(x)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-15)
    with pytest.raises(TypeError, match="dim must be an int"):
        getattr(tl.nn, cls)(1.5)
