"""Selection ops: comparisons (0/1 masks), where (a selection: the branch not taken never leaks
inf or NaN), gather and its scatter-add gradient. Against torch, float64 finite differences, and
twice differentiated; bad indices are refused with their value."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import gradcheck, param_grads, run

CMP = {"gt": torch.gt, "lt": torch.lt, "ge": torch.ge, "le": torch.le, "eq": torch.eq, "ne": torch.ne}


class Fn(tl.nn.Module):
    def __init__(self, fn, params=None):
        super().__init__()
        self.params = params if params is not None else tl.nn.Linear(1, 1)
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def evaluate(fn, *arrays):
    model = Fn(fn)
    if arrays[0].dtype == np.float64:
        model = model.double()
    return model.predict(arrays if len(arrays) > 1 else arrays[0])


@pytest.mark.parametrize("op", sorted(CMP))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64], ids=["f32", "f64", "i64"])
def test_comparisons_match_torch(op, dtype, rng):
    a = np.round(2 * rng.standard_normal((4, 5))).astype(dtype)
    b = np.round(2 * rng.standard_normal((5,))).astype(dtype)  # broadcast, with ties
    (got,), _ = run(op, [a, b], {}, None, "eigen")
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, CMP[op](torch.tensor(a), torch.tensor(b)).numpy().astype(dtype))


def test_where_selects_without_leaking_the_other_branch(rng):
    x = np.array([[0.0, 1.0, 4.0], [-1.0, 2.0, 0.0]])
    got = evaluate(lambda v: F.where(v > 0, F.log(F.clamp(v, min=0.0)), 7.0), x)
    ref = torch.where(torch.tensor(x) > 0, torch.log(torch.tensor(x).clamp(min=0)), 7.0).numpy()
    np.testing.assert_array_equal(got, ref)  # log(0) = -inf never reaches the result
    assert np.isfinite(got).all()


def test_where_gradients_match_torch_and_differentiate_twice(rng):
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 3).double()
    lin = tl.nn.Linear(3, 3)

    def residual(x, lib, where, grad, ones_like):
        u = lin(x) if lib == "tl" else ref(x)
        v = where(u > 0, u ** 2, -u ** 3)  # a piecewise polynomial: smooth enough away from 0
        (dv,) = grad(v, x, ones_like(v))
        return (dv ** 2).sum() + (v ** 2).sum()

    model = Fn(lambda x: x, lin).double()
    model.load_state_dict({"params." + k: v for k, v in ref.state_dict().items()})
    x = rng.standard_normal((5, 3))
    trainer = tl.Trainer(model, lambda out, y, x: residual(x, "tl", F.where, F.grad, F.ones_like), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    value = trainer.compute_gradients(x, np.zeros((5, 3)))
    xt = torch.tensor(x, requires_grad=True)
    tvalue = residual(xt, "torch", torch.where, lambda o, i, g: torch.autograd.grad(o, i, g, create_graph=True),
                      torch.ones_like)
    tvalue.backward()
    np.testing.assert_allclose(value, tvalue.item(), rtol=1e-12)
    np.testing.assert_allclose(param_grads(model)["params.weight"], ref.weight.grad.numpy(), rtol=1e-10)


def test_where_and_gather_match_finite_differences(rng):
    gradcheck("where", [rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), np.round(rng.random((3, 4)))],
              wrt=[0, 1])
    gradcheck("gather", [rng.standard_normal((4, 5)), rng.integers(0, 5, (4, 3))], {"dim": 1}, wrt=[0])
    gradcheck("gather", [rng.standard_normal((2, 3, 4)), rng.integers(0, 2, (5, 3, 2))], {"dim": 0}, wrt=[0])
    gradcheck("gather_backward", [rng.standard_normal((4, 3)), rng.integers(0, 5, (4, 3))],
              {"dim": 1, "shape": [4, 5]}, wrt=[0])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_matches_torch(dim, rng):
    x = rng.standard_normal((4, 5))
    size = x.shape[dim]
    index = rng.integers(0, size, (3, 5) if dim == 0 else (4, 2))
    g = rng.standard_normal(index.shape)
    (got,), (dx, _) = run("gather", [x, index], {"dim": dim}, [g], "eigen")
    xt = torch.tensor(x, requires_grad=True)
    out = torch.gather(xt, dim, torch.tensor(index))
    out.backward(torch.tensor(g))
    np.testing.assert_array_equal(got, out.detach().numpy())
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-15)  # repeated indices accumulate


def test_gather_refuses_bad_indices_by_value(rng):
    with pytest.raises(ValueError, match="index 5 is out of range for a dimension of size 5"):
        run("gather", [rng.standard_normal((2, 5)), np.array([[0], [5]])], {"dim": 1}, None, "eigen")
    with pytest.raises(ValueError, match="index -1 is out of range"):
        run("gather", [rng.standard_normal((2, 5)), np.array([[0], [-1]])], {"dim": 1}, None, "eigen")
    with pytest.raises(TypeError, match="index must be int64"):
        run("gather", [rng.standard_normal((2, 5)), np.zeros((2, 1))], {"dim": 1}, None, "eigen")
    with pytest.raises(ValueError, match="larger than input"):
        run("gather", [rng.standard_normal((2, 5)), np.zeros((3, 1), np.int64)], {"dim": 1}, None, "eigen")


def test_symbol_operators_and_masked_fill(rng):
    x = rng.standard_normal((3, 4))
    got = evaluate(lambda v: (v > 0) + (v <= -0.5) + v.masked_fill(v < 0, 0.0), x)
    t = torch.tensor(x)
    ref = ((t > 0).double() + (t <= -0.5).double() + t.masked_fill(t < 0, 0.0)).numpy()
    np.testing.assert_array_equal(got, ref)
