"""Embedding with torch's options against torch: max_norm / norm_type (rows rescaled in place on a
training step, the returned rows scaled on a prediction that leaves the weight alone),
scale_grad_by_freq, sparse, _weight / _freeze / from_pretrained, F.embedding's options, and bad values."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F

IDX = np.array([[0, 2, 2, 5], [1, 2, 0, 3]], np.int64)  # row 2 three times, rows 4 never
TORCH_DT = {np.float32: torch.float32, np.float64: torch.float64}
TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-13)}


def pair(dtype, seed=0, **kw):
    """(treadle layer, torch layer) with the same weight (rows of norm around 1.6: some above max_norm=1)."""
    w = (0.8 * np.random.default_rng(seed).standard_normal((6, 4))).astype(dtype)
    ours = tl.nn.Embedding(6, 4, dtype=dtype, **kw)
    ours.weight[...] = w
    ref = torch.nn.Embedding(6, 4, dtype=TORCH_DT[dtype], **kw)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(w))
    return ours, ref


def wrap(layer):
    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = layer

        def forward(self, idx):
            return self.emb(idx)

    return Net()


def train_steps(ours, ref, dtype, steps=3, optimizer="sgd"):
    """`steps` steps of sum(y * g) on both; returns the last outputs."""
    net = wrap(ours).train()
    opt = tl.optim.SGD(lr=0.1) if optimizer == "sgd" else tl.optim.Adam(lr=0.05)
    trainer = tl.Trainer(net, tl.loss.MSE(), opt)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1) if optimizer == "sgd" else \
        torch.optim.Adam(ref.parameters(), lr=0.05)
    rng = np.random.default_rng(7)
    for _ in range(steps):
        g = rng.standard_normal(IDX.shape + (4,)).astype(dtype)
        trainer.zero_grad()  # host-driven phases add gradients up, as torch's backward does
        y = trainer.forward(IDX)
        trainer.backward(g)
        trainer.update()
        ref_opt.zero_grad()
        ref_y = ref(torch.tensor(IDX))
        ref_y.backward(torch.tensor(g))
        ref_opt.step()
    return y, ref_y.detach().numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_max_norm_training_rescales_the_weight_as_torch(dtype, norm_type):
    ours, ref = pair(dtype, max_norm=1.0, norm_type=norm_type)
    y, ref_y = train_steps(ours, ref, dtype)
    np.testing.assert_allclose(y, ref_y, **TOL[dtype])
    np.testing.assert_allclose(ours.weight, ref.weight.detach().numpy(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_max_norm_prediction_scales_rows_and_leaves_the_weight(dtype):
    ours, ref = pair(dtype, max_norm=1.0)
    before = ours.weight.copy()
    assert (np.linalg.norm(before[IDX.ravel()], axis=1) > 1.0).any(), "the case must rescale some rows"
    net = wrap(ours).eval()
    np.testing.assert_allclose(net(IDX), ref(torch.tensor(IDX)).detach().numpy(), **TOL[dtype])
    np.testing.assert_array_equal(ours.weight, before)  # torch rescaled its weight; predictions never write


def test_max_norm_leaves_rows_below_it_and_rows_not_looked_up():
    ours, ref = pair(np.float64, max_norm=1.0)
    before = ours.weight.copy()
    train_steps(ours, ref, np.float64, steps=1, optimizer="sgd")
    untouched = 4  # never looked up: neither rescaled nor updated
    np.testing.assert_array_equal(ours.weight[untouched], before[untouched])
    np.testing.assert_allclose(ours.weight, ref.weight.detach().numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_scale_grad_by_freq_matches_torch(dtype, padding_idx):
    ours, ref = pair(dtype, scale_grad_by_freq=True, padding_idx=padding_idx)
    if padding_idx is not None:  # torch zeroes the padding row at construction; the copy above put it back
        ours.weight[padding_idx] = 0
        with torch.no_grad():
            ref.weight[padding_idx] = 0
    train_steps(ours, ref, dtype, steps=2, optimizer="adam")
    np.testing.assert_allclose(ours.weight, ref.weight.detach().numpy(), **TOL[dtype])


def test_sparse_gives_torchs_values_with_dense_gradients():
    ours, ref = pair(np.float64, sparse=True)
    y, ref_y = train_steps(ours, ref, np.float64, steps=2, optimizer="sgd")
    np.testing.assert_allclose(ours.weight, ref.weight.detach().numpy(), rtol=1e-12, atol=1e-13)
    assert "sparse=True" in repr(ours)


def test_weight_and_freeze_and_from_pretrained():
    table = np.arange(12, dtype=np.float64).reshape(4, 3) / 10
    layer = tl.nn.Embedding(4, 3, _weight=table, dtype=np.float64)
    np.testing.assert_array_equal(layer.weight, table)
    frozen = tl.nn.Embedding.from_pretrained(torch.tensor(table))
    assert frozen.weight.dtype == np.float64 and frozen.num_embeddings == 4
    ref = torch.nn.Embedding.from_pretrained(torch.tensor(table))

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = frozen, tl.nn.Linear(3, 1, dtype=np.float64)

        def forward(self, idx):
            return self.head(self.emb(idx))

    trainer = tl.Trainer(Net(), tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    trainer.step(np.array([0, 3, 1], np.int64), np.ones((3, 1)))
    np.testing.assert_array_equal(frozen.weight, table)  # frozen, as torch's from_pretrained(freeze=True)
    assert not ref.weight.requires_grad
    trainable = tl.nn.Embedding.from_pretrained(table, freeze=False, max_norm=0.5)
    assert trainable.max_norm == 0.5 and trainable.weight.flags.writeable
    with pytest.raises(ValueError, match=r"_weight of shape \(4, 3\) does not match"):
        tl.nn.Embedding(5, 3, _weight=table)
    with pytest.raises(ValueError, match="embeddings must be 2-D"):
        tl.nn.Embedding.from_pretrained(np.zeros(3))


@pytest.mark.parametrize("training", [True, False])
def test_functional_embedding_options(training):
    # float32-representable: a Parameter is made in the default float32, then the model turns float64
    w = (0.8 * np.random.default_rng(3).standard_normal((6, 4))).astype(np.float32).astype(np.float64)
    tw = torch.tensor(w, requires_grad=True)

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = tl.nn.Parameter(w.copy())

        def forward(self, idx):
            return F.embedding(idx, self.table, max_norm=1.0, scale_grad_by_freq=True)

    net = Net().double()
    ref_y = torch.nn.functional.embedding(torch.tensor(IDX), tw, max_norm=1.0, scale_grad_by_freq=True)
    if not training:
        np.testing.assert_allclose(net.eval()(IDX), ref_y.detach().numpy(), rtol=1e-12, atol=1e-13)
        np.testing.assert_array_equal(net.table, w)
        return
    g = np.random.default_rng(4).standard_normal(IDX.shape + (4,))
    trainer = tl.Trainer(net.train(), tl.loss.MSE(), tl.optim.SGD(lr=1.0))
    y = trainer.forward(IDX)
    trainer.backward(g)
    trainer.update()
    ref_y.backward(torch.tensor(g))
    np.testing.assert_allclose(y, ref_y.detach().numpy(), rtol=1e-12, atol=1e-13)
    with torch.no_grad():
        expected = tw - tw.grad  # torch renormed tw in place inside the call; then one SGD step of lr 1
    np.testing.assert_allclose(net.table, expected.numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kw,message", [({"max_norm": -1.0}, "max_norm must be finite and >= 0"),
                                        ({"max_norm": float("nan")}, "max_norm must be finite"),
                                        ({"max_norm": 1.0, "norm_type": 0.0}, "norm_type must be positive")])
def test_bad_options_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        tl.nn.Embedding(4, 3, **kw)


def test_options_survive_save_and_load(tmp_path):
    net = tl.nn.Sequential(tl.nn.Embedding(5, 3, padding_idx=1, max_norm=0.7, norm_type=1.0, scale_grad_by_freq=True))
    path = tmp_path / "emb.treadle"
    tl.save(net, path)
    back = tl.load(path)
    layer = back[0]
    assert (layer.max_norm, layer.norm_type, layer.scale_grad_by_freq, layer.padding_idx) == (0.7, 1.0, True, 1)
    np.testing.assert_array_equal(back.eval()(IDX[:, :3] % 5), net.eval()(IDX[:, :3] % 5))
