"""Second derivatives: every gradient op that claims to be differentiable is checked as an op of its
own through run_op (float64 finite differences, and torch's double backward in float32 and float64);
tl.functional.grad inside a forward and inside a loss trains like torch.autograd.grad with
create_graph=True; an op that cannot be differentiated twice is refused by name when the plan is
compiled, and the parameters are left as they were."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import treadle as tl
import treadle.functional as F
from opcheck import BACKENDS, assert_close_f32, gradcheck, param_grads, run, tol

# (id, activation, attrs, torch function, kinks, backward op reads the output)
ACTIVATIONS = [
    ("relu", "relu", {}, TF.relu, [0.0], True),
    ("leaky_relu", "leaky_relu", {"negative_slope": 0.2}, lambda x: TF.leaky_relu(x, 0.2), [0.0], False),
    ("elu", "elu", {"alpha": 0.7}, lambda x: TF.elu(x, 0.7), [0.0], False),
    ("gelu", "gelu", {}, TF.gelu, [], False),
    ("gelu_tanh", "gelu", {"approximate": "tanh"}, lambda x: TF.gelu(x, approximate="tanh"), [], False),
    ("silu", "silu", {}, TF.silu, [], False),
    ("tanh", "tanh", {}, torch.tanh, [], True),
    ("sigmoid", "sigmoid", {}, torch.sigmoid, [], True),
    ("softplus", "softplus", {}, TF.softplus, [], False),
    ("softplus_b2_t3", "softplus", {"beta": 2.0, "threshold": 3.0}, lambda x: TF.softplus(x, 2.0, 3.0), [1.5], False),
]
IDS = [c[0] for c in ACTIVATIONS]
PIECEWISE_LINEAR = {"relu", "leaky_relu"}


def away_from(x, points, gap=0.05):
    for p in points:
        near = np.abs(x - p) < gap
        x[near] = p + np.where(x[near] >= p, 2 * gap, -2 * gap)
    return x


def activation_inputs(case, shape, dtype, seed=0):
    """(x, the backward op's saved operand, dy, upstream gradient G) for one activation case."""
    _, _, _, fn, kinks, saves_output = case
    r = np.random.default_rng(seed)
    x = away_from(2.5 * r.standard_normal(shape), kinks).astype(dtype)
    saved = fn(torch.from_numpy(x)).numpy() if saves_output else x
    return x, saved, r.standard_normal(shape).astype(dtype), r.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("shape", [(5,), (3, 4)], ids=str)
@pytest.mark.parametrize("case", ACTIVATIONS, ids=IDS)
def test_activation_backward_ops_match_finite_differences(case, shape):
    _, act, attrs, _, _, _ = case
    _, saved, dy, _ = activation_inputs(case, shape, np.float64)
    wrt = [1] if act in PIECEWISE_LINEAR else [0, 1]
    gradcheck(act + "_backward", [saved, dy], attrs, wrt=wrt)


def torch_double_backward(fn, x, dy, g):
    """d/dx and d/d(dy) of <G, d(fn)/dx (x) * dy>, by torch with create_graph=True."""
    xt = torch.tensor(x, requires_grad=True)
    dyt = torch.tensor(dy, requires_grad=True)
    (gx,) = torch.autograd.grad(fn(xt), xt, dyt, create_graph=True)
    gx.backward(torch.tensor(g))
    dx = xt.grad.numpy(force=True) if xt.grad is not None else np.zeros_like(x)
    return dx, dyt.grad.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", ACTIVATIONS, ids=IDS)
def test_activation_double_backward_matches_torch(case, dtype, backend):
    _, act, attrs, fn, _, saves_output = case
    x, saved, dy, g = activation_inputs(case, (4, 6), dtype, seed=1)
    _, (d_saved, d_dy) = run(act + "_backward", [saved, dy], attrs, [g], backend)
    ref_dx, ref_ddy = torch_double_backward(fn, x, dy, g)
    if d_saved is None:  # piecewise linear: the derivative is piecewise constant
        assert act in PIECEWISE_LINEAR
        d_saved = np.zeros_like(x)
    if saves_output:  # ours is with respect to y = f(x): chain through f'(x)
        xt = torch.tensor(x, requires_grad=True)
        (fprime,) = torch.autograd.grad(fn(xt).sum(), xt)
        d_saved = d_saved * fprime.numpy()
    np.testing.assert_allclose(d_dy, ref_ddy, **tol(dtype), err_msg="gradient of dy")
    np.testing.assert_allclose(d_saved, ref_dx, **tol(dtype), err_msg="gradient of x")


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_backward_ops_match_finite_differences(op, axis, rng):
    x = rng.standard_normal((3, 5))
    y = getattr(torch, op)(torch.from_numpy(x), axis).numpy()
    gradcheck(op + "_backward", [y, rng.standard_normal((3, 5))], {"axis": axis})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_double_backward_matches_torch(op, dtype, backend, rng):
    x, dy, g = (rng.standard_normal((4, 6)).astype(dtype) for _ in range(3))
    fn = lambda t: getattr(torch, op)(t, 1)  # noqa: E731
    y = fn(torch.from_numpy(x)).numpy()
    _, (d_y, d_dy) = run(op + "_backward", [y, dy], {"axis": 1}, [g], backend)
    ref_dx, ref_ddy = torch_double_backward(fn, x, dy, g)
    # Chain ours (with respect to y) through the forward's own backward to compare with x.
    p = np.exp(y) if op == "log_softmax" else y
    s = d_y.sum(1, keepdims=True) if op == "log_softmax" else (d_y * y).sum(1, keepdims=True)
    d_x = d_y - p * s if op == "log_softmax" else y * (d_y - s)
    np.testing.assert_allclose(d_dy, ref_ddy, **tol(dtype))
    np.testing.assert_allclose(d_x, ref_dx, **tol(dtype))


@pytest.mark.parametrize("op,attrs,kinks", [("abs", {}, [0.0]), ("clamp", {"min": -0.5, "max": 1.0}, [-0.5, 1.0])])
def test_piecewise_math_backward_ops_are_linear_in_dy(op, attrs, kinks, rng):
    x = away_from(2 * rng.standard_normal((3, 4)), kinks)
    dy, g = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    gradcheck(op + "_backward", [x, dy], attrs, wrt=[1])
    fn = torch.abs if op == "abs" else (lambda t: t.clamp(-0.5, 1.0))
    _, (d_x, d_dy) = run(op + "_backward", [x, dy], attrs, [g])
    ref_dx, ref_ddy = torch_double_backward(fn, x, dy, g)
    assert d_x is None and not ref_dx.any()
    np.testing.assert_allclose(d_dy, ref_ddy, rtol=1e-14)


# --- tl.functional.grad in models and losses, against torch.autograd.grad(create_graph=True) ---

def mlp_pair(act, width=8, depth=2, seed=0, n_in=2, wrap=lambda run: run):
    """A treadle model Fn(mlp, wrap(mlp's forward)) and a torch MLP with the same float64 weights
    and activation `act` (a case), the torch one in a ModuleDict so its names match."""
    _, name, attrs, torch_fn, _, _ = act
    torch.manual_seed(seed)
    sizes = [n_in] + [width] * depth + [1]
    layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])).double()
    net = tl.nn.ModuleList([tl.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])])
    tl_act = lambda h: getattr(F, name)(h, **attrs)  # noqa: E731

    def run_ours(x):
        for i, layer in enumerate(net):
            x = layer(x)
            if i < len(net) - 1:
                x = tl_act(x)
        return x

    def run_theirs(x):
        for i, layer in enumerate(layers):
            x = layer(x)
            if i < len(layers) - 1:
                x = torch_fn(x)
        return x

    model, ref = paired(net, wrap(run_ours), layers)  # the outermost module owns the parameters
    return model, ref, run_theirs


class Fn(tl.nn.Module):
    """A module around a function of its input and a module holding the parameters."""

    def __init__(self, params, fn):
        super().__init__()
        self.params = params
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def burgers_residual(u, xt, grad, ones_like):
    """u_t + u u_x - 0.3 u_xx for u(x, t): the same code on torch tensors and treadle symbols."""
    (du,) = grad(u, xt, ones_like(u))
    u_x, u_t = du[:, 0:1], du[:, 1:2]
    (d2u,) = grad(u_x, xt, ones_like(u_x))
    return u_t + u * u_x - 0.3 * d2u[:, 0:1]


def torch_grad(u, x, g):
    return torch.autograd.grad(u, x, g, create_graph=True)



def assert_grads_match(net, ref, **tolerance):
    ours = param_grads(net)
    for name, p in ref.named_parameters():
        theirs = p.grad.numpy() if p.grad is not None else np.zeros(p.shape)  # unused by the loss: zero
        np.testing.assert_allclose(ours[name], theirs, err_msg=name, **tolerance)


def paired(params, forward, torch_params):
    """Fn(params, forward) in float64 with torch_params' weights; returns it and the named torch reference."""
    model = Fn(params, forward).double()
    named_ref = torch.nn.ModuleDict({"params": torch_params})
    model.load_state_dict(named_ref.state_dict())
    return model, named_ref


def assert_input_loss_trains_like_torch(model, ref, run_theirs, loss, x, y, loss_rtol=1e-12, grad_rtol=1e-10):
    """loss(u, y, x, grad, ones_like), written once for both frameworks, differentiates the output with
    respect to the input: the loss and the parameter gradients of one step must match torch."""
    trainer = tl.Trainer(model, lambda u, t, xs: loss(u, t, xs, F.grad, F.ones_like), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    value = trainer.compute_gradients(x, y)
    xt = torch.tensor(x, requires_grad=True)
    tvalue = loss(run_theirs(xt), torch.tensor(y), xt, torch_grad, torch.ones_like)
    tvalue.backward()
    np.testing.assert_allclose(value, tvalue.item(), rtol=loss_rtol)
    assert_grads_match(model, ref, rtol=grad_rtol, atol=1e-12)


def pinn_loss(u, y, xt):
    res = burgers_residual(u, xt, F.grad, F.ones_like)
    return (res ** 2).mean() + ((u - y) ** 2).mean()


def torch_pinn_loss(run_theirs, x, y):
    xt = torch.tensor(x, requires_grad=True)
    u = run_theirs(xt)
    res = burgers_residual(u, xt, torch_grad, torch.ones_like)
    return (res ** 2).mean() + ((u - torch.from_numpy(y)) ** 2).mean()


@pytest.mark.parametrize("act", ACTIVATIONS, ids=IDS)
def test_a_residual_loss_trains_like_torch(act, rng):
    model, ref, run_theirs = mlp_pair(act)
    x = rng.uniform(-2, 2, (16, 2))
    y = rng.standard_normal((16, 1))
    trainer = tl.Trainer(model, pinn_loss, tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    loss = trainer.compute_gradients(x, y)
    tloss = torch_pinn_loss(run_theirs, x, y)
    tloss.backward()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-12)
    assert_grads_match(model, ref, rtol=1e-10, atol=1e-12)


def test_derivatives_in_the_forward_predict_and_train_like_torch(rng):
    model, ref, run_theirs = mlp_pair(ACTIVATIONS[IDS.index("tanh")], width=12,
                                      wrap=lambda run: lambda xt: burgers_residual(run(xt), xt, F.grad, F.ones_like))
    x = rng.uniform(-1, 1, (10, 2))
    xt = torch.tensor(x, requires_grad=True)
    res = burgers_residual(run_theirs(xt), xt, torch_grad, torch.ones_like)
    np.testing.assert_allclose(model.predict(x), res.detach().numpy(), rtol=1e-12, atol=1e-14)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    loss = trainer.compute_gradients(x, np.zeros((10, 1)))
    tloss = (res ** 2).mean()
    tloss.backward()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-12)
    assert_grads_match(model, ref, rtol=1e-10, atol=1e-12)


def test_third_derivatives_train_like_torch(rng):
    """u_xxx in the loss: training differentiates four times through every op."""
    model, ref, run_theirs = mlp_pair(ACTIVATIONS[IDS.index("silu")], n_in=1)

    def kdv(u, x, grad, ones_like):
        (u1,) = grad(u, x, ones_like(u))
        (u2,) = grad(u1, x, ones_like(u1))
        (u3,) = grad(u2, x, ones_like(u2))
        return u3 + 6 * u * u1

    assert_input_loss_trains_like_torch(
        model, ref, run_theirs, lambda u, y, x, grad, ones_like: (kdv(u, x, grad, ones_like) ** 2).mean(),
        rng.uniform(-1, 1, (12, 1)), np.zeros((12, 1)), loss_rtol=1e-11, grad_rtol=1e-9)


def test_softmax_attention_weights_differentiate_twice(rng):
    """A softmax-weighted sum of features whose input gradient enters the loss."""
    torch.manual_seed(2)
    ref = torch.nn.ModuleDict({"score": torch.nn.Linear(3, 4), "value": torch.nn.Linear(3, 4)}).double()
    params = tl.nn.ModuleDict({"score": tl.nn.Linear(3, 4), "value": tl.nn.Linear(3, 4)})

    def ours(x):
        w = F.softmax(params["score"](x), -1) + F.log_softmax(params["value"](x), -1).exp()
        return (w * F.tanh(params["value"](x))).sum(-1, keepdim=True)

    def theirs(x):
        w = torch.softmax(ref["score"](x), -1) + torch.log_softmax(ref["value"](x), -1).exp()
        return (w * torch.tanh(ref["value"](x))).sum(-1, keepdim=True)

    def loss(u, y, x, grad, ones_like):
        (du,) = grad(u, x, ones_like(u))
        return (du ** 2).sum() + (u ** 2).sum()

    model, named_ref = paired(params, ours, ref)
    assert_input_loss_trains_like_torch(model, named_ref, theirs, loss, rng.standard_normal((6, 3)), np.zeros((6, 1)))


def test_float32_residual_loss_on_the_default_backends(rng):
    """The default dispatch (oneDNN products where built) in float32, against torch in float64."""
    model, ref, run_theirs = mlp_pair(ACTIVATIONS[IDS.index("tanh")], width=32)
    model = model.float()
    x = rng.uniform(-1, 1, (64, 2))
    y = rng.standard_normal((64, 1))
    trainer = tl.Trainer(model, pinn_loss, tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    loss = trainer.compute_gradients(x.astype(np.float32), y.astype(np.float32))
    tloss = torch_pinn_loss(run_theirs, x, y)
    tloss.backward()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-5)
    ours = param_grads(model)
    for name, p in ref.named_parameters():
        assert_close_f32(ours[name], p.grad.numpy(), name)


# --- misuse ---

def trace_grad(fn, x):
    """Runs fn(x_symbol, linear) in a forward; returns the prediction and the Linear's weight."""
    w = tl.nn.Linear(x.shape[1], 1)
    model = Fn(w, lambda s: fn(s, w)).double()
    return model.predict(x), model.state_dict()["params.weight"]


def test_an_unused_input_is_an_error_unless_allowed(rng):
    x = rng.standard_normal((4, 3))
    with pytest.raises(ValueError, match="do not depend on input 1"):
        trace_grad(lambda s, w: F.grad(w(s).sum(), [s, F.exp(s)])[0], x)

    def allowed(s, w):
        g = F.grad(w(s).sum(), [s, F.exp(s)], allow_unused=True)
        assert g[1] is None
        return g[0]

    got, weight = trace_grad(allowed, x)
    np.testing.assert_array_equal(got, np.broadcast_to(np.asarray(weight), (4, 3)))
    got, _ = trace_grad(lambda s, w: F.grad(w(s).sum(), [s, F.exp(s)], materialize_grads=True)[1], x)
    np.testing.assert_array_equal(got, np.zeros((4, 3)))


def test_a_dependence_through_a_flat_derivative_gives_zeros(rng):
    """relu's derivative is piecewise constant: the second derivative is zero, not 'unused' (as torch)."""
    x = rng.standard_normal((4, 3))

    def second(s, w):
        (g,) = F.grad(F.relu(w(s)).sum(), s)
        return F.grad(g.sum(), s)[0]

    got, _ = trace_grad(second, x)
    np.testing.assert_array_equal(got, np.zeros((4, 3)))


def test_a_non_scalar_output_needs_grad_outputs(rng):
    x = rng.standard_normal((4, 3))
    with pytest.raises(ValueError, match="only for a scalar output"):
        trace_grad(lambda s, w: F.grad(w(s), s)[0], x)
    with pytest.raises(ValueError, match="grad_outputs 0 is"):
        trace_grad(lambda s, w: F.grad(w(s), s, F.ones_like(s))[0], x)
    with pytest.raises(TypeError, match="inputs must be a Symbol"):
        trace_grad(lambda s, w: F.grad(w(s).sum(), 3.0)[0], x)


def test_an_op_without_a_second_derivative_is_refused_by_name(rng):
    net = tl.nn.Sequential(tl.nn.Linear(2, 8), tl.nn.LayerNorm(8), tl.nn.Tanh(), tl.nn.Linear(8, 1)).double()

    def loss(u, y, x):
        (du,) = F.grad(u, x, F.ones_like(u))
        return (du ** 2).mean()

    trainer = tl.Trainer(net, loss, tl.optim.SGD(lr=0.1))
    before = net.flat_parameters().copy()
    with pytest.raises(ValueError, match="'layer_norm_backward' is not differentiable"):
        trainer.step(rng.standard_normal((4, 2)), np.zeros((4, 1)))
    np.testing.assert_array_equal(net.flat_parameters(), before)
    # The first derivative alone is fine: the same model trains with a loss on u.
    trainer = tl.Trainer(net, lambda u, y, x: (u ** 2).mean(), tl.optim.SGD(lr=0.1))
    assert np.isfinite(trainer.step(rng.standard_normal((4, 2)), np.zeros((4, 1))))


def test_a_convolutional_network_differentiates_twice(rng):
    """conv (data and weight gradient ops differentiated again), tanh, average pooling."""
    torch.manual_seed(4)
    ref = torch.nn.ModuleDict({"conv": torch.nn.Conv2d(2, 3, 3, padding=1), "head": torch.nn.Linear(12, 1)}).double()
    params = tl.nn.ModuleDict({"conv": tl.nn.Conv2d(2, 3, 3, padding=1), "head": tl.nn.Linear(12, 1)})

    def ours(x):
        h = F.avg_pool2d(F.tanh(params["conv"](x)), 2)
        return params["head"](h.reshape(h.shape[0], 12))

    def theirs(x):
        h = TF.avg_pool2d(torch.tanh(ref["conv"](x)), 2)
        return ref["head"](h.reshape(h.shape[0], 12))

    def loss(u, y, x, grad, ones_like):
        (dx,) = grad(u, x, ones_like(u))
        return (dx ** 2).sum() + u.sum()

    model, named_ref = paired(params, ours, ref)
    assert_input_loss_trains_like_torch(model, named_ref, theirs, loss, rng.standard_normal((2, 2, 4, 4)),
                                        np.zeros((2, 1)))


def _listed(doc, section):
    """The op names (in backquotes) between the doc's begin and end markers for `section`."""
    import re
    body = doc.split(f"<!-- {section}: begin -->")[1].split(f"<!-- {section}: end -->")[0]
    return set(re.findall(r"`([a-z0-9_]+)`", body))


def test_the_docs_list_exactly_the_gradient_ops_that_differentiate_again():
    import pathlib
    doc = (pathlib.Path(__file__).parents[1] / "docs" / "second-derivatives.md").read_text()
    gradient_ops = {op for op in tl.backend_ops("eigen") if "_backward" in op}
    twice = gradient_ops & set(tl._core.differentiable_ops())
    assert _listed(doc, "differentiable gradient ops") == twice
    assert _listed(doc, "refused gradient ops") == gradient_ops - twice
