"""The host-driven step API: step == zero_grad + compute_gradients + update; forward/backward against
torch autograd (parameter and input gradients), accumulation, ordering rules and isolation."""
import numpy as np
import pytest
import torch

import treadle as tl
from conftest import CORE_TOL

SIZES = (6, 16, 12, 3)


def grads_of(net):
    """Parameter gradients by name, read from the flat gradient buffer through the model's layout."""
    flat = net.flat_gradients()
    return {name: flat[off:off + int(np.prod(shape))].reshape(shape).copy()
            for name, shape, off in net._compiled().layout}


def torch_param_grads(ref):
    return {n: p.grad.detach().numpy().copy() for n, p in ref.named_parameters()}


def assert_grads_close(ours, theirs, tol):
    assert list(ours) == list(theirs)
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], err_msg=name, **tol)


def _batch(rng, n, dtype, out=SIZES[-1]):
    return rng.standard_normal((n, SIZES[0])).astype(dtype), rng.standard_normal((n, out)).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_step_equals_zero_grad_compute_gradients_update(mlp_pair, rng, dtype):
    a, _ = mlp_pair(SIZES, dtype=dtype)
    b, _ = mlp_pair(SIZES, dtype=dtype)
    ta = tl.Trainer(a, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    tb = tl.Trainer(b, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    for _ in range(4):
        x, y = _batch(rng, 10, dtype)
        la = ta.step(x, y)
        tb.zero_grad()
        lb = tb.compute_gradients(x, y)
        tb.update()
        assert la == lb
        np.testing.assert_array_equal(a.flat_parameters(), b.flat_parameters())
        np.testing.assert_array_equal(a.flat_gradients(), b.flat_gradients())
    assert ta.steps == tb.steps == 4


def test_step_discards_gradients_left_by_earlier_calls(mlp_pair, rng):
    a, _ = mlp_pair(SIZES)
    b, _ = mlp_pair(SIZES)
    ta = tl.Trainer(a, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    tb = tl.Trainer(b, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x, y = _batch(rng, 8, "float32")
    tb.compute_gradients(*_batch(rng, 8, "float32"))  # stale gradients: step must zero them first
    tb.step(x, y)
    ta.step(x, y)
    np.testing.assert_array_equal(a.flat_parameters(), b.flat_parameters())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compute_gradients_matches_torch_mse(mlp_pair, rng, dtype):
    net, ref = mlp_pair(SIZES, dtype=dtype)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x, y = _batch(rng, 11, dtype)
    trainer.zero_grad()
    loss = trainer.compute_gradients(x, y)
    ref_loss = torch.nn.functional.mse_loss(ref(torch.from_numpy(x)), torch.from_numpy(y))
    ref_loss.backward()
    np.testing.assert_allclose(loss, ref_loss.item(), **CORE_TOL[dtype])
    assert_grads_close(grads_of(net), torch_param_grads(ref), CORE_TOL[dtype])
    assert trainer.steps == 0


def test_compute_gradients_accumulates_until_zero_grad(mlp_pair, rng):
    net, _ = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x, y = _batch(rng, 5, "float64")
    trainer.zero_grad()
    trainer.compute_gradients(x, y)
    once = net.flat_gradients().copy()
    assert np.any(once != 0)
    trainer.compute_gradients(x, y)
    np.testing.assert_array_equal(net.flat_gradients(), 2 * once)
    trainer.zero_grad()
    assert not np.any(net.flat_gradients())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_backward_match_torch_autograd(mlp_pair, rng, dtype):
    net, ref = mlp_pair(SIZES, dtype=dtype)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((7, SIZES[0])).astype(dtype)
    g = rng.standard_normal((7, SIZES[-1])).astype(dtype)
    trainer.zero_grad()
    out = trainer.forward(x, input_grad=True)
    dx = trainer.backward(g, input_grad=True)

    tx = torch.tensor(x, requires_grad=True)
    tout = ref(tx)
    tout.backward(torch.from_numpy(g))
    np.testing.assert_allclose(out, tout.detach().numpy(), **CORE_TOL[dtype])
    assert_grads_close(grads_of(net), torch_param_grads(ref), CORE_TOL[dtype])
    assert dx.shape == x.shape and dx.dtype == x.dtype
    np.testing.assert_allclose(dx, tx.grad.numpy(), **CORE_TOL[dtype])
    assert trainer.steps == 0  # backward never updates


def test_backward_without_input_grad_returns_none_and_same_param_grads(mlp_pair, rng):
    net, _ = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((4, SIZES[0]))
    g = rng.standard_normal((4, SIZES[-1]))
    trainer.zero_grad()
    trainer.forward(x)
    assert trainer.backward(g) is None
    plain = net.flat_gradients().copy()
    trainer.zero_grad()
    trainer.forward(x, input_grad=True)
    trainer.backward(g, input_grad=True)
    np.testing.assert_allclose(net.flat_gradients(), plain, rtol=1e-14, atol=0)


def test_forward_equals_predict_without_dropout(mlp_pair, rng):
    net, _ = mlp_pair(SIZES)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((9, SIZES[0])).astype(np.float32)
    np.testing.assert_array_equal(trainer.forward(x), net.predict(x))


def test_gradients_accumulate_across_backward_calls_like_torch(mlp_pair, rng):
    net, ref = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    for n in (3, 5):  # two batches of different sizes, gradients summed as torch sums .grad
        x = rng.standard_normal((n, SIZES[0]))
        g = rng.standard_normal((n, SIZES[-1]))
        trainer.forward(x)
        trainer.backward(g)
        ref(torch.from_numpy(x)).backward(torch.from_numpy(g))
    assert_grads_close(grads_of(net), torch_param_grads(ref), CORE_TOL["float64"])
    trainer.zero_grad()
    assert not np.any(net.flat_gradients())


def test_backward_without_forward_raises(mlp_pair, rng):
    net, _ = mlp_pair(SIZES)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    g = np.ones((2, SIZES[-1]), np.float32)
    with pytest.raises(ValueError, match="backward: call forward first"):
        trainer.backward(g)
    x = rng.standard_normal((2, SIZES[0])).astype(np.float32)
    trainer.forward(x)
    trainer.backward(g)
    before = net.flat_gradients().copy()
    with pytest.raises(ValueError, match="call forward first"):  # one backward per forward
        trainer.backward(g)
    np.testing.assert_array_equal(net.flat_gradients(), before)


def test_step_invalidates_a_pending_forward(mlp_pair, rng):
    net, _ = mlp_pair(SIZES)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x, y = _batch(rng, 4, "float32")
    trainer.forward(x)
    trainer.step(x, y)  # reuses the trainer's activation memory
    with pytest.raises(ValueError, match="call forward first"):
        trainer.backward(np.ones((4, SIZES[-1]), np.float32))


def test_input_grad_needs_forward_with_input_grad(mlp_pair, rng):
    net, _ = mlp_pair(SIZES)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((3, SIZES[0])).astype(np.float32)
    trainer.forward(x)
    with pytest.raises(ValueError, match="input_grad=True"):
        trainer.backward(np.ones((3, SIZES[-1]), np.float32), input_grad=True)


def test_evaluate_between_forward_and_backward_does_not_corrupt_gradients(mlp_pair, rng):
    """evaluate() must not clobber the activations a pending forward keeps for backward: either the
    backward still gives the exact gradients, or it refuses (like after step) - never silently wrong."""
    x = rng.standard_normal((5, SIZES[0])).astype(np.float32)
    g = rng.standard_normal((5, SIZES[-1])).astype(np.float32)
    xv, yv = _batch(rng, 5, "float32")
    clean, _ = mlp_pair(SIZES)
    tc = tl.Trainer(clean, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    tc.zero_grad()
    tc.forward(x)
    tc.backward(g)
    net, _ = mlp_pair(SIZES)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    trainer.forward(x)
    trainer.evaluate(xv, yv)
    try:
        trainer.backward(g)
    except ValueError as e:
        assert "call forward first" in str(e)
        assert not np.any(net.flat_gradients())
    else:
        np.testing.assert_array_equal(net.flat_gradients(), clean.flat_gradients())


def test_predict_between_forward_and_backward_is_harmless(mlp_pair, rng):
    x = rng.standard_normal((5, SIZES[0])).astype(np.float32)
    g = rng.standard_normal((5, SIZES[-1])).astype(np.float32)
    a, _ = mlp_pair(SIZES)
    b, _ = mlp_pair(SIZES)
    ta = tl.Trainer(a, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    tb = tl.Trainer(b, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    for t in (ta, tb):
        t.zero_grad()
        t.forward(x)
    b.predict(rng.standard_normal((5, SIZES[0])).astype(np.float32))
    ta.backward(g)
    tb.backward(g)
    np.testing.assert_array_equal(a.flat_gradients(), b.flat_gradients())


def test_forward_keeps_its_own_copy_of_the_input(mlp_pair, rng):
    net, ref = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((4, SIZES[0]))
    g = rng.standard_normal((4, SIZES[-1]))
    trainer.zero_grad()
    trainer.forward(x)
    ref(torch.from_numpy(x.copy())).backward(torch.from_numpy(g))
    x[...] = 100.0  # the host reuses its buffer before backward
    trainer.backward(g)
    assert_grads_close(grads_of(net), torch_param_grads(ref), CORE_TOL["float64"])


def test_update_is_one_sgd_step_on_the_accumulated_gradient(mlp_pair, rng):
    net, _ = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.25))
    trainer.zero_grad()
    trainer.forward(rng.standard_normal((3, SIZES[0])))
    trainer.backward(rng.standard_normal((3, SIZES[-1])))
    p0, g0 = net.flat_parameters().copy(), net.flat_gradients().copy()
    trainer.update()
    np.testing.assert_allclose(net.flat_parameters(), p0 - 0.25 * g0, rtol=1e-15, atol=1e-15)
    assert trainer.steps == 1
    assert trainer.lr == 0.25


def test_host_can_edit_gradients_between_backward_and_update(mlp_pair, rng):
    """What an allreduce does: the host overwrites the flat gradient buffer before update."""
    net, _ = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.5))
    trainer.zero_grad()
    trainer.compute_gradients(*_batch(rng, 4, "float64"))
    p0 = net.flat_parameters().copy()
    net.flat_gradients()[...] = 1.0
    trainer.update()
    np.testing.assert_allclose(net.flat_parameters(), p0 - 0.5, rtol=0, atol=1e-15)


def test_clip_grad_norm_matches_torch(mlp_pair, rng):
    net, ref = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), clip_grad_norm=0.05)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        x, y = _batch(rng, 8, "float64")
        loss = trainer.step(x, y)
        opt.zero_grad()
        ref_loss = torch.nn.functional.mse_loss(ref(torch.from_numpy(x)), torch.from_numpy(y))
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        opt.step()
        np.testing.assert_allclose(loss, ref_loss.item(), rtol=1e-12)
    for name, p in ref.state_dict().items():
        np.testing.assert_allclose(net.state_dict()[name], p.numpy(), rtol=1e-12, atol=1e-13)


def test_input_gradient_matches_torch_for_a_3d_batch(mlp_pair, rng):
    net, ref = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((2, 3, SIZES[0]))
    g = rng.standard_normal((2, 3, SIZES[-1]))
    trainer.zero_grad()
    trainer.forward(x, input_grad=True)
    dx = trainer.backward(g, input_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    ref(tx).backward(torch.from_numpy(g))
    np.testing.assert_allclose(dx, tx.grad.numpy(), **CORE_TOL["float64"])
    assert_grads_close(grads_of(net), torch_param_grads(ref), CORE_TOL["float64"])
