"""MaxPool return_indices and MaxUnpool1d/2d/3d (modules and F.max_pool*/F.max_unpool*) against torch:
values, indices, input gradients through pool -> unpool, overlapping windows, output_size, unbatched
inputs, float64 finite differences of the unpooling op, saving, and bad indices or sizes."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import gradcheck

CASES = [  # (nd, input shape, pooling arguments)
    (1, (2, 3, 9), dict(kernel_size=3, stride=2, padding=1)),
    (2, (2, 3, 6, 8), dict(kernel_size=2)),
    (2, (2, 3, 7, 7), dict(kernel_size=3, stride=2)),  # overlapping windows: an element can win twice
    (2, (1, 2, 5, 6), dict(kernel_size=(2, 3), stride=(2, 2), padding=(1, 1))),
    (3, (1, 2, 4, 4, 6), dict(kernel_size=2)),
]
IDS = [f"{nd}d-{'x'.join(map(str, shape))}-{i}" for i, (nd, shape, _) in enumerate(CASES)]


def unpool_args(kw):
    return {k: v for k, v in kw.items() if k in ("kernel_size", "stride", "padding")}


class PoolUnpool(tl.nn.Module):
    def __init__(self, nd, kw):
        super().__init__()
        self.pool = getattr(tl.nn, f"MaxPool{nd}d")(**kw, return_indices=True)
        self.unpool = getattr(tl.nn, f"MaxUnpool{nd}d")(**unpool_args(kw))

    def forward(self, x):
        y, indices = self.pool(x)
        return self.unpool(2.0 * y, indices, output_size=x.shape)


def torch_pool_unpool(nd, kw, tx):
    y, indices = getattr(torch.nn, f"MaxPool{nd}d")(**kw, return_indices=True)(tx)
    return getattr(torch.nn, f"MaxUnpool{nd}d")(**unpool_args(kw))(2.0 * y, indices, output_size=tx.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("nd,shape,kw", CASES, ids=IDS)
def test_pool_then_unpool_is_torchs(nd, shape, kw, dtype):
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    tx = torch.tensor(x, requires_grad=True)
    ref = torch_pool_unpool(nd, kw, tx)
    g = np.random.default_rng(1).standard_normal(ref.shape).astype(dtype)
    ref.backward(torch.tensor(g))
    net = PoolUnpool(nd, kw).to(np.dtype(dtype).name)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    out = trainer.forward(x, input_grad=True)
    dx = trainer.backward(g, input_grad=True)
    np.testing.assert_array_equal(out, ref.detach().numpy())  # copies and one doubling: exact
    np.testing.assert_array_equal(dx, tx.grad.numpy())
    np.testing.assert_array_equal(net.eval()(x), ref.detach().numpy())


@pytest.mark.parametrize("nd,shape,kw", CASES, ids=IDS)
def test_indices_are_a_model_output_as_torchs(nd, shape, kw):
    x = np.random.default_rng(2).standard_normal(shape)
    pool = getattr(tl.nn, f"MaxPool{nd}d")(**kw, return_indices=True)
    net = tl.nn.Sequential(pool).double().eval()
    y, indices = net(x)
    ref_y, ref_indices = getattr(torch.nn, f"MaxPool{nd}d")(**kw, return_indices=True)(torch.tensor(x))
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(indices, ref_indices.numpy())
    np.testing.assert_array_equal(y, ref_y.numpy())
    y1, indices1 = net(x[0])  # unbatched (C, *spatial), as torch
    np.testing.assert_array_equal(indices1, ref_indices.numpy()[0])
    np.testing.assert_array_equal(y1, ref_y.numpy()[0])


def test_functional_forms_and_default_output_size():
    x = np.random.default_rng(3).standard_normal((2, 2, 6, 6))

    class Net(tl.nn.Module):
        def forward(self, x):
            y, indices = F.max_pool2d(x, 2, return_indices=True)
            return F.max_unpool2d(y, indices, 2)  # default size: (3 - 1) * 2 + 2 = 6

    ty, ti = torch.nn.functional.max_pool2d(torch.tensor(x), 2, return_indices=True)
    ref = torch.nn.functional.max_unpool2d(ty, ti, 2)
    np.testing.assert_array_equal(Net().double().eval()(x), ref.numpy())


def test_unpool_unbatched_and_odd_output_size():
    x = np.random.default_rng(4).standard_normal((3, 7))  # (C, L): 7 -> pooled 3 -> unpooled 7, not 6
    pool, unpool = tl.nn.MaxPool1d(2, return_indices=True), tl.nn.MaxUnpool1d(2)

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.pool, self.unpool = pool, unpool

        def forward(self, x):
            y, indices = self.pool(x)
            return self.unpool(y, indices, output_size=[7])

    ty, ti = torch.nn.MaxPool1d(2, return_indices=True)(torch.tensor(x))
    ref = torch.nn.MaxUnpool1d(2)(ty, ti, output_size=[7])
    np.testing.assert_array_equal(Net().double().eval()(x), ref.numpy())


@pytest.mark.parametrize("length", [10, 7])
def test_unpool_op_gradcheck(length):
    rng = np.random.default_rng(5)
    indices = np.stack([rng.permutation(length)[:5] for _ in range(6)]).reshape(2, 3, 5).astype(np.int64)
    gradcheck("max_unpool", [rng.standard_normal((2, 3, 5)), indices], {"length": length}, wrt=[0])


def test_bad_indices_and_sizes_are_named():
    class Net(tl.nn.Module):
        def forward(self, x, indices):
            return F.max_unpool1d(x, indices, 2)

    net = Net().double().eval()
    x = np.ones((1, 1, 3))
    with pytest.raises(ValueError, match="max_unpool: index 6 is out of range for a dimension of size 6"):
        net(x, np.array([[[0, 2, 6]]], np.int64))

    class Sized(tl.nn.Module):
        def forward(self, x, indices):
            return F.max_unpool1d(x, indices, 2, output_size=[9])

    with pytest.raises(ValueError, match=r"max_unpool1d: output_size \(9,\) is invalid .* between 5 and 7"):
        Sized().double().eval()(x, np.array([[[0, 2, 4]]], np.int64))


def test_saved_and_loaded(tmp_path):
    net = tl.nn.Sequential(tl.nn.MaxPool2d(2, return_indices=True))
    tl.save(net, tmp_path / "pool.treadle")
    back = tl.load(tmp_path / "pool.treadle")
    assert back[0].return_indices
    unpool = tl.nn.Sequential(tl.nn.MaxUnpool2d(3, stride=2, padding=1))
    tl.save(unpool, tmp_path / "unpool.treadle")
    again = tl.load(tmp_path / "unpool.treadle")[0]
    assert (again.kernel_size, again.stride, again.padding) == (3, 2, 1)
