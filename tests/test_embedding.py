"""Embedding: the op (gather, scatter-add gradient, padding row) against PyTorch and finite differences,
and the layer in models taking int64 index input (predict, training steps), initialisation, bad input.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import treadle as tl
from opcheck import BACKENDS, gradcheck, numeric_grads, run, tol, torch_grads

DTYPES = [np.float32, np.float64]
DT_IDS = ["f32", "f64"]
IDX_SHAPES = [(5,), (3, 4), (2, 3, 2)]


def indices(shape, num, seed=0, dtype=np.int64):
    """Random indices with repeats (so the gradient accumulates) and every row 0..2 present."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num, size=shape)
    idx.reshape(-1)[:3] = [0, 1, 2]
    return idx.astype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("padding_idx", [None, 1], ids=["nopad", "pad1"])
@pytest.mark.parametrize("shape", IDX_SHAPES, ids=str)
def test_embedding_vs_torch(shape, padding_idx, index_dtype, dtype, backend):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 4)).astype(dtype)
    idx = indices(shape, 6, dtype=index_dtype)
    attrs = {} if padding_idx is None else {"padding_idx": padding_idx}
    gy = rng.standard_normal(shape + (4,)).astype(dtype)
    (y,), grads = run("embedding", [w, idx], attrs, [gy], backend)
    (ref,), ref_grads = torch_grads(lambda w_, i_: F.embedding(i_.long(), w_, padding_idx=padding_idx),
                                    [w, idx], [gy], [0])
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_allclose(grads[0], ref_grads[0], **tol(dtype))
    assert grads[1] is None  # indices have no gradient
    if padding_idx is not None:
        assert not grads[0][padding_idx].any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("padding_idx", [None, 2], ids=["nopad", "pad2"])
@pytest.mark.parametrize("shape", IDX_SHAPES, ids=str)
def test_embedding_gradcheck(shape, padding_idx, backend):
    w = np.random.default_rng(4).standard_normal((5, 3))
    idx = indices(shape, 5)
    if padding_idx is None:
        gradcheck("embedding", [w, idx], {}, wrt=[0], backend=backend)
        return
    # By definition (torch's) the padding row gets no gradient although the output reads it: finite
    # differences must match everywhere else.
    attrs = {"padding_idx": padding_idx}
    gy = np.random.default_rng(5).standard_normal(shape + (3,))
    _, (dw, _) = run("embedding", [w, idx], attrs, [gy], backend)
    numeric = numeric_grads("embedding", [w, idx], attrs, [gy], [0], backend=backend)[0]
    numeric[padding_idx] = 0
    np.testing.assert_allclose(dw, numeric, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_many_chunks_vs_torch(backend):
    """Enough indices and columns that the gather and the scatter-add split into many chunks."""
    rng = np.random.default_rng(0)
    w, idx = rng.standard_normal((50, 40)), rng.integers(0, 50, size=(30, 700))
    gy = rng.standard_normal(idx.shape + (40,))
    (y,), grads = run("embedding", [w, idx], {"padding_idx": 3}, [gy], backend)
    (ref,), ref_grads = torch_grads(lambda w_, i_: F.embedding(i_, w_, padding_idx=3), [w, idx], [gy], [0])
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_allclose(grads[0], ref_grads[0], **tol(np.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_op_errors(backend):
    w = np.zeros((10, 3))
    for bad in (10, -1, 1000):
        idx = np.array([[0, 1], [bad, 2]], np.int64)
        with pytest.raises(ValueError, match=rf"Embedding: index {bad} is out of range for 10 embeddings "
                                             r"\(position 2 of indices of shape \(2, 2\)\)"):
            run("embedding", [w, idx], {}, None, backend)
    with pytest.raises(TypeError, match="embedding: indices must be int64 or int32, got float64"):
        run("embedding", [w, np.zeros(3)], {}, None, backend)
    with pytest.raises(ValueError, match="embedding: padding_idx 10 out of range for 10 embeddings"):
        run("embedding", [w, np.zeros(3, np.int64)], {"padding_idx": 10}, None, backend)
    with pytest.raises(ValueError, match=r"embedding: weight must be 2-D"):
        run("embedding", [np.zeros(10), np.zeros(3, np.int64)], {}, None, backend)


def test_embedding_init_follows_torch():
    """weight ~ N(0, 1), padding row zero, state_dict key 'weight'; negative padding_idx counts from the end."""
    tl.manual_seed(0)
    emb = tl.nn.Embedding(2000, 50, padding_idx=-1)
    assert emb.padding_idx == torch.nn.Embedding(2000, 50, padding_idx=-1).padding_idx == 1999
    w = emb.weight
    assert w.shape == (2000, 50) and w.dtype == np.float32
    assert not w[1999].any()
    body = w[:1999].astype(np.float64).ravel()
    assert abs(body.mean()) < 0.01 and abs(body.std() - 1) < 0.01
    assert abs(np.mean(np.abs(body) < 1) - 0.6827) < 0.01  # normal, not uniform
    assert list(emb.state_dict()) == ["weight"]
    assert tl.nn.Embedding(3, 2, dtype="float64").weight.dtype == np.float64


def models(dtype, padding_idx):
    d = np.dtype(dtype).name
    ours = tl.nn.Sequential(tl.nn.Embedding(10, 4, padding_idx=padding_idx, dtype=d), tl.nn.Flatten(),
                            tl.nn.Linear(12, 2, dtype=d))
    theirs = torch.nn.Sequential(torch.nn.Embedding(10, 4, padding_idx=padding_idx), torch.nn.Flatten(),
                                 torch.nn.Linear(12, 2))
    theirs = theirs.to(torch.float64 if dtype == np.float64 else torch.float32)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("padding_idx", [None, 0], ids=["nopad", "pad0"])
def test_embedding_model_int64_input_trains_like_torch(padding_idx, dtype):
    """A model whose input is int64 indices: predict and SGD steps (momentum) equal torch's; the padding
    row never changes."""
    ours, theirs = models(dtype, padding_idx)
    trainer = tl.Trainer(ours, tl.loss.MSE(), tl.optim.SGD(lr=0.1, momentum=0.9))
    topt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(2)
    pad_row = ours.state_dict()["0.weight"][0].copy()
    for step in range(5):
        idx = rng.integers(0, 10, size=(8, 3)).astype(np.int64)
        idx[0, 0] = 0
        y = rng.standard_normal((8, 2)).astype(dtype)
        loss = trainer.step(idx, y)
        topt.zero_grad()
        tloss = F.mse_loss(theirs(torch.tensor(idx)), torch.tensor(y))
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss, tloss.item(), **tol(dtype), err_msg=f"loss at step {step}")
    state = ours.state_dict()
    for k, v in theirs.state_dict().items():
        np.testing.assert_allclose(state[k], v.numpy(), **tol(dtype), err_msg=k)
    if padding_idx is not None:
        np.testing.assert_array_equal(state["0.weight"][0], pad_row)
    with torch.no_grad():
        np.testing.assert_allclose(ours.predict(idx), theirs(torch.tensor(idx)).numpy(), **tol(dtype))


def test_embedding_model_input_errors():
    ours, _ = models(np.float32, None)
    with pytest.raises(ValueError, match=r"Embedding.*: index 10 is out of range for 10 embeddings"):
        ours.predict(np.array([[1, 2, 10]], np.int64))
    with pytest.raises(ValueError, match="index -3 is out of range"):
        tl.Trainer(ours, tl.loss.MSE(), tl.optim.SGD(lr=0.1)).step(np.array([[1, -3, 2]]), np.zeros((1, 2), np.float32))
    with pytest.raises(TypeError, match=r"Embedding: expected integer indices \(int64\), got float32"):
        ours.predict(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="linear: expected float32 or float64, got int64"):
        tl.nn.Linear(3, 2).predict(np.zeros((2, 3), np.int64))  # integer input to a float op: a clear error
    with pytest.raises(ValueError, match="Embedding: padding_idx must be within num_embeddings"):
        tl.nn.Embedding(5, 2, padding_idx=5)
