"""Optimizer code written for torch.optim runs on treadle: parameter lists and groups, the optimizers
Adadelta, Adamax, NAdam, RAdam and LBFGS, clip_grad_value_, each against torch on the same
parameters and gradients; and bad input refused with a message naming the problem."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.optim as optim

STEPS = 30
TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}
SIZES = (5, 8, 8, 3)  # Linear layers "0", "2", "4"
W = ["0.weight", "2.weight", "4.weight"]
B = ["0.bias", "2.bias", "4.bias"]


@pytest.fixture
def torch_dtype():
    """Sets torch's default dtype for a test (NAdam keeps a scalar of that dtype) and restores it."""
    saved = torch.get_default_dtype()
    yield lambda dt: torch.set_default_dtype(torch.float64 if dt == np.float64 else torch.float32)
    torch.set_default_dtype(saved)


# ---- new optimizers on flat buffers ------------------------------------------------------------

LAYOUT = [("weight", (6, 4)), ("bias", (6,)), ("kernel", (2, 3, 4))]
FLAT_CASES = [
    ("Adadelta", {}),
    ("Adadelta", dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1)),
    ("Adamax", {}),
    ("Adamax", dict(lr=1e-2, betas=(0.5, 0.9), eps=1e-6, weight_decay=0.05)),
    ("NAdam", {}),
    ("NAdam", dict(lr=1e-2, momentum_decay=1e-2, weight_decay=0.1)),
    ("NAdam", dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, decoupled_weight_decay=True)),
    ("RAdam", {}),
    ("RAdam", dict(lr=1e-2, betas=(0.9, 0.9), weight_decay=0.1)),
    ("RAdam", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,opts", FLAT_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(FLAT_CASES)])
def test_new_optimizer_matches_torch(name, opts, dtype, torch_dtype):
    torch_dtype(dtype)
    rng = np.random.default_rng(1)
    total = sum(int(np.prod(s)) for _, s in LAYOUT)
    params = rng.standard_normal(total).astype(dtype)
    ref, off = [], 0
    for _, shape in LAYOUT:
        n = int(np.prod(shape))
        ref.append(torch.tensor(params[off:off + n].reshape(shape), requires_grad=True))
        off += n
    opt = getattr(optim, name)(**opts).bind(LAYOUT, np.dtype(dtype).name)
    topt = getattr(torch.optim, name)(ref, **opts)
    for _ in range(STEPS):
        grads = rng.standard_normal(total).astype(dtype)
        off = 0
        for p in ref:
            p.grad = torch.from_numpy(grads[off:off + p.numel()].reshape(p.shape).copy())
            off += p.numel()
        opt.step(params, grads)
        topt.step()
    expect = np.concatenate([p.detach().numpy().ravel() for p in ref])
    np.testing.assert_allclose(params, expect, **TOL[dtype])


def test_torch_positional_arguments_and_implementation_flags(mlp_pair):
    net, _ = mlp_pair(SIZES)
    opt = optim.SGD(net.parameters(), 0.1, 0.9, foreach=False, fused=None, maximize=False)
    assert opt.defaults["lr"] == 0.1 and opt.defaults["momentum"] == 0.9
    assert optim.RMSprop(net.parameters(), 0.01, 0.9).defaults["alpha"] == 0.9


def test_new_optimizers_have_torchs_defaults():
    for name in ("Adadelta", "Adamax", "NAdam", "RAdam"):
        ours, theirs = getattr(optim, name)().defaults, getattr(torch.optim, name)([torch.zeros(1)]).defaults
        for key, value in ours.items():
            assert theirs[key] == (tuple(value) if isinstance(value, tuple) else value), (name, key)


# ---- parameter groups on a model ---------------------------------------------------------------

def _pick(named, names):
    return [named[n] for n in names]


def _groups(spec, named):
    return [{**g, "params": _pick(named, g["params"])} for g in spec]


def _run_pair(net, ref, opt, topt, steps=STEPS, between=None, seed=0):
    """The same random gradient per parameter each step; opt.step() updates the model's buffer."""
    rng = np.random.default_rng(seed)
    grads = net.named_gradients()
    tref = dict(ref.named_parameters())
    for t in range(steps):
        for name, g in grads.items():
            g[...] = rng.standard_normal(g.shape)
            tref[name].grad = torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        if between is not None:
            between(t)
    for name, p in net.named_parameters():
        np.testing.assert_allclose(p, tref[name].detach().numpy(), **TOL[p.dtype.type], err_msg=name)


GROUP_CASES = [
    ("SGD", dict(lr=0.05, momentum=0.9), [dict(params=W, weight_decay=0.01), dict(params=B, lr=0.1, weight_decay=0.0)]),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True), [dict(params=W), dict(params=B, momentum=0.5)]),
    ("SGD", dict(lr=0.05), [dict(params=["0.weight", "0.bias"], momentum=0.9, dampening=0.1),
                            dict(params=["4.weight"])]),  # "2.*" and "4.bias" are in no group
    ("Adam", dict(lr=1e-2), [dict(params=W, weight_decay=0.1, amsgrad=True), dict(params=B, betas=(0.8, 0.99),
                                                                                  eps=1e-6)]),
    ("AdamW", dict(lr=1e-2), [dict(params=W), dict(params=B, weight_decay=0.0)]),
    ("RMSprop", dict(lr=1e-2), [dict(params=W, momentum=0.9, centered=True), dict(params=B, alpha=0.9)]),
    ("Adagrad", dict(lr=0.1), [dict(params=W, initial_accumulator_value=0.1, lr_decay=0.01),
                               dict(params=B, lr=0.05)]),
    ("Adadelta", {}, [dict(params=W, rho=0.8, weight_decay=0.01), dict(params=B, lr=0.5)]),
    ("Adamax", dict(lr=1e-2), [dict(params=W, weight_decay=0.1), dict(params=B, betas=(0.5, 0.9))]),
    ("NAdam", dict(lr=1e-2), [dict(params=W, momentum_decay=8e-3, weight_decay=0.1),
                              dict(params=B, decoupled_weight_decay=True, weight_decay=0.05)]),
    ("RAdam", dict(lr=1e-2), [dict(params=W, weight_decay=0.1),
                              dict(params=B, decoupled_weight_decay=True, weight_decay=0.05, betas=(0.9, 0.95))]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,defaults,spec", GROUP_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(GROUP_CASES)])
def test_parameter_groups_match_torch(mlp_pair, name, defaults, spec, dtype, torch_dtype):
    torch_dtype(dtype)
    net, ref = mlp_pair(SIZES, dtype=np.dtype(dtype).name)
    opt = getattr(optim, name)(_groups(spec, dict(net.named_parameters())), **defaults).attach(net)
    topt = getattr(torch.optim, name)(_groups(spec, dict(ref.named_parameters())), **defaults)
    _run_pair(net, ref, opt, topt)


def test_parameter_list_and_lr_changes_between_steps(mlp_pair):
    """optim.Adam(model.parameters()), then a user changing param_groups[i]["lr"] as torch code does."""
    net, ref = mlp_pair(SIZES, dtype="float64")
    opt = optim.Adam(net.parameters(), lr=1e-2).attach(net)
    topt = torch.optim.Adam(ref.parameters(), lr=1e-2)

    def between(t):
        for o in (opt, topt):
            for g in o.param_groups:
                g["lr"] = 1e-2 / (1 + t)
    _run_pair(net, ref, opt, topt, between=between)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 / STEPS, rel=1e-15)


def test_group_hyper_parameter_changes_between_steps(mlp_pair):
    net, ref = mlp_pair(SIZES, dtype="float64")
    spec = [dict(params=W, momentum=0.9), dict(params=B, momentum=0.5, weight_decay=0.1)]
    opt = optim.SGD(_groups(spec, dict(net.named_parameters())), lr=0.05).attach(net)
    topt = torch.optim.SGD(_groups(spec, dict(ref.named_parameters())), lr=0.05)

    def between(t):
        for o in (opt, topt):
            o.param_groups[0]["momentum"] = 0.9 - 0.01 * t
            o.param_groups[1]["weight_decay"] = 0.1 + 0.01 * t
    _run_pair(net, ref, opt, topt, between=between)


def test_trainer_step_with_groups_matches_torch(mlp_pair):
    """Trainer.step (forward, backward, fused grouped update) against torch for 30 steps."""
    net, ref = mlp_pair(SIZES, dtype="float64")
    named, tnamed = dict(net.named_parameters()), dict(ref.named_parameters())
    trainer = tl.Trainer(net, tl.loss.MSE(), optim.SGD([{"params": _pick(named, W)},
                                                        {"params": _pick(named, B), "lr": 0.02}],
                                                       lr=0.1, momentum=0.9))
    topt = torch.optim.SGD([{"params": _pick(tnamed, W)}, {"params": _pick(tnamed, B), "lr": 0.02}],
                           lr=0.1, momentum=0.9)
    rng = np.random.default_rng(3)
    for _ in range(STEPS):
        x, y = rng.standard_normal((6, SIZES[0])), rng.standard_normal((6, SIZES[-1]))
        loss = trainer.step(x, y)
        topt.zero_grad()
        tloss = torch.nn.functional.mse_loss(ref(torch.from_numpy(x)), torch.from_numpy(y))
        tloss.backward()
        topt.step()
        assert loss == pytest.approx(tloss.item(), rel=1e-10)
    for name, p in net.named_parameters():
        np.testing.assert_allclose(p, tnamed[name].detach().numpy(), rtol=1e-10, atol=1e-12)


def test_frozen_parameter_in_a_group_is_not_updated(mlp_pair):
    net, _ = mlp_pair(SIZES, dtype="float64")
    dict(net.named_parameter_objects())["0.weight"].requires_grad = False
    opt = optim.SGD(net.parameters(), lr=0.1)
    trainer = tl.Trainer(net, tl.loss.MSE(), opt)
    before = dict(net.state_dict())
    trainer.step(np.ones((2, SIZES[0])), np.ones((2, SIZES[-1])))
    after = net.state_dict()
    np.testing.assert_array_equal(after["0.weight"], before["0.weight"])
    assert not np.array_equal(after["2.weight"], before["2.weight"])


def test_optimizer_zero_grad_and_step_drive_the_attached_model(mlp_pair):
    net, _ = mlp_pair(SIZES, dtype="float64")
    opt = optim.SGD(net.parameters(), lr=0.5)
    trainer = tl.Trainer(net, tl.loss.MSE(), opt)
    x, y = np.ones((2, SIZES[0])), np.zeros((2, SIZES[-1]))
    trainer.compute_gradients(x, y)
    g = net.flat_gradients().copy()
    p = net.flat_parameters().copy()
    opt.step()
    n = len(g)
    np.testing.assert_allclose(net.flat_parameters()[:n], p[:n] - 0.5 * g[:n])
    alone = optim.Adam(net.parameters(), lr=0.1).attach(net)  # without a Trainer: bound on its first step
    alone.step()
    alone.step()
    assert alone.step_count == 2
    opt.zero_grad()
    assert not net.flat_gradients().any()


# ---- LBFGS ---------------------------------------------------------------------------------------

# float32 dot products round differently from torch's, and 40 iterations carry that along.
LBFGS_TOL = {np.float64: dict(rtol=1e-8, atol=1e-10), np.float32: dict(rtol=1e-3, atol=3e-4)}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_matches_torch(mlp_pair, line_search, dtype):
    net, ref = mlp_pair((4, 6, 2), dtype=np.dtype(dtype).name)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((16, 4)).astype(dtype), rng.standard_normal((16, 2)).astype(dtype)
    opt = optim.LBFGS(net.parameters(), lr=0.5, max_iter=10, history_size=5, line_search_fn=line_search)
    trainer = tl.Trainer(net, tl.loss.MSE(), opt)
    topt = torch.optim.LBFGS(ref.parameters(), lr=0.5, max_iter=10, history_size=5, line_search_fn=line_search)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def closure():
        trainer.zero_grad()
        return trainer.compute_gradients(x, y)

    def tclosure():
        topt.zero_grad()
        loss = torch.nn.functional.mse_loss(ref(tx), ty)
        loss.backward()
        return loss

    for _ in range(4):
        loss, tloss = opt.step(closure), topt.step(tclosure)
        assert loss == pytest.approx(float(tloss.detach()), rel=LBFGS_TOL[dtype]["rtol"])
    assert opt.state["func_evals"] == topt.state[next(iter(ref.parameters()))]["func_evals"]
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(dict(net.named_parameters())[name], p.detach().numpy(), **LBFGS_TOL[dtype])


def test_lbfgs_refuses_groups_and_bad_line_search(mlp_pair):
    net, _ = mlp_pair(SIZES)
    with pytest.raises(ValueError, match="parameter groups are not supported"):
        optim.LBFGS([{"params": net.parameters()[:2]}, {"params": net.parameters()[2:]}])
    with pytest.raises(ValueError, match="line_search_fn"):
        optim.LBFGS(net.parameters(), line_search_fn="armijo")


# ---- clip_grad_value_ -----------------------------------------------------------------------------

def test_clip_grad_value_matches_torch():
    rng = np.random.default_rng(0)
    g = rng.standard_normal(50).astype(np.float32) * 3
    parts = [g[:20], g[20:]]
    t = [torch.nn.Parameter(torch.zeros(20)), torch.nn.Parameter(torch.zeros(30))]
    for p, a in zip(t, parts):
        p.grad = torch.from_numpy(a.copy())
    optim.clip_grad_value_(parts, 1.5)
    torch.nn.utils.clip_grad_value_(t, 1.5)
    np.testing.assert_array_equal(g, np.concatenate([p.grad.numpy() for p in t]))
    flat = rng.standard_normal(9)
    optim.clip_grad_value_(flat, 0.1)
    assert np.abs(flat).max() <= 0.1


# ---- bad input ------------------------------------------------------------------------------------

def test_a_parameter_of_another_model_is_named(mlp_pair):
    net, _ = mlp_pair(SIZES)
    other, _ = mlp_pair(SIZES)
    opt = optim.Adam(other.parameters() + [np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\] \(shape \(8, 5\), float32\) is not a "
                                         "parameter of this Sequential"):
        tl.Trainer(net, tl.loss.MSE(), opt)


def test_a_stray_array_is_named(mlp_pair):
    net, _ = mlp_pair(SIZES)
    opt = optim.SGD([{"params": net.parameters()}, {"params": [np.zeros((2, 2), np.float32)], "lr": 0.1}])
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] \(shape \(2, 2\)"):
        opt.attach(net)


@pytest.mark.parametrize("make,exc,match", [
    (lambda ps: optim.SGD([{"params": ps[:3]}, {"params": ps[2:]}]), ValueError,
     r"appears in param_groups\[0\] and param_groups\[1\]"),
    (lambda ps: optim.SGD(ps, lr=float("nan")), ValueError, "invalid lr value: nan"),
    (lambda ps: optim.Adam([{"params": ps, "lr": float("inf")}]), ValueError, "invalid lr value: inf"),
    (lambda ps: optim.Adam([{"params": ps, "momentum": 0.9}]), ValueError, r"unknown key\(s\) \['momentum'\]"),
    (lambda ps: optim.Adam([{"params": ps, "betas": (0.9, 1.5)}]), ValueError, "betas"),
    (lambda ps: optim.SGD([{"lr": 0.1}]), ValueError, "has no 'params'"),
    (lambda ps: optim.SGD([]), ValueError, "empty parameter list"),
    (lambda ps: optim.SGD([ps[0], {"params": ps[1:]}]), TypeError, "must be a parameter"),
    (lambda ps: optim.SGD(ps[0]), TypeError, "got one array"),
    (lambda ps: optim.SGD(["x"]), TypeError, "must be a parameter"),
    (lambda ps: optim.RowWiseAdagrad(ps), ValueError, "parameter groups are not supported"),
    (lambda ps: optim.SGD(ps, 0.1, 0.9, foo=1), TypeError, "unexpected argument"),
    (lambda ps: optim.Adam(ps, maximize=True), ValueError, "maximize=True is not supported"),
], ids=["two-groups", "nan-lr", "inf-group-lr", "unknown-key", "bad-betas", "no-params", "empty", "mixed",
        "one-array", "not-an-array", "rowwise", "unknown-kwarg", "maximize"])
def test_bad_parameter_groups_are_refused(mlp_pair, make, exc, match):
    net, _ = mlp_pair(SIZES)
    with pytest.raises(exc, match=match):
        make(net.parameters())


def test_bad_changes_to_param_groups_are_refused(mlp_pair):
    net, _ = mlp_pair(SIZES)
    opt = optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="invalid lr value: nan"):
        opt.param_groups[0]["lr"] = float("nan")
    with pytest.raises(ValueError, match="state buffers"):  # momentum from 0 would need a momentum buffer
        opt.param_groups[0]["momentum"] = 0.9
    with pytest.raises(ValueError, match="'params' is fixed"):
        opt.param_groups[0]["params"] = []
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["momentum"] == 0.0
    opt.param_groups[0]["initial_lr"] = 0.1  # bookkeeping keys are kept, as in torch


# ---- checkpoints ----------------------------------------------------------------------------------

def test_checkpoint_keeps_every_groups_lr(mlp_pair, tmp_path):
    net, _ = mlp_pair(SIZES, dtype="float64")
    named = dict(net.named_parameters())
    opt = optim.Adam([{"params": _pick(named, W)}, {"params": _pick(named, B), "lr": 0.02}], lr=0.1)
    trainer = tl.Trainer(net, tl.loss.MSE(), opt)
    trainer.step(np.ones((2, SIZES[0])), np.zeros((2, SIZES[-1])))
    opt.param_groups[1]["lr"] = 0.005
    path = str(tmp_path / "ck.safetensors")
    tl.save_checkpoint(path, trainer)
    opt.param_groups[0]["lr"], opt.param_groups[1]["lr"] = 1.0, 1.0
    tl.load_checkpoint(path, trainer)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.005]
    single = tl.Trainer(mlp_pair(SIZES, dtype="float64")[0], tl.loss.MSE(), optim.Adam(lr=0.1))
    with pytest.raises(ValueError, match="the checkpoint has 2 parameter groups, the optimizer has 1"):
        tl.load_checkpoint(path, single)


def test_optimizer_state_dict_round_trip(mlp_pair):
    """state_dict()/load_state_dict() as torch code uses them: a fresh optimizer continues bit for bit."""
    net, _ = mlp_pair(SIZES, dtype="float64")
    named = dict(net.named_parameters())
    make = lambda: optim.Adam([{"params": _pick(named, W)}, {"params": _pick(named, B), "lr": 0.02}],  # noqa: E731
                              lr=0.1).attach(net)
    opt = make()
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(net.flat_gradients().shape) for _ in range(4)]
    for g in grads[:2]:
        net.flat_gradients()[...] = g
        opt.step()
    opt.param_groups[1]["lr"] = 0.003
    saved, params = opt.state_dict(), net.flat_parameters().copy()
    for g in grads[2:]:
        net.flat_gradients()[...] = g
        opt.step()
    expect = net.flat_parameters().copy()
    net.flat_parameters()[...] = params
    again = make()
    again.load_state_dict(saved)
    assert again.step_count == 2 and again.param_groups[1]["lr"] == 0.003
    for g in grads[2:]:
        net.flat_gradients()[...] = g
        again.step()
    np.testing.assert_array_equal(net.flat_parameters(), expect)
    with pytest.raises(ValueError, match="saved parameter groups"):
        optim.Adam(net.parameters()).attach(net).load_state_dict(saved)


class _TwoPart(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.base = tl.nn.Linear(3, 4)
        self.head = tl.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.base(x))


def _views(module):
    """The parameter views of a submodule (what its parameters() returns), without compiling it."""
    return [p.data for _, p in module.named_parameter_objects()]


@pytest.mark.parametrize("compiled_first", [False, True])
def test_per_layer_groups_from_submodules(compiled_first):
    """Views taken before the model packed its buffer are found too (by the parameter they belong to)."""
    net = _TwoPart()
    if compiled_first:
        net.parameters()
    opt = optim.SGD([{"params": _views(net.base)}, {"params": _views(net.head), "lr": 1e-3}], lr=1e-2, momentum=0.9)
    tl.Trainer(net, tl.loss.MSE(), opt)
    assert [g for _, _, g in opt._native.segments()] == [0, 1]


def test_submodule_parameters_method_after_the_model_compiled():
    net = _TwoPart()
    net.parameters()
    opt = optim.SGD([{"params": net.base.parameters()}, {"params": net.head.parameters(), "lr": 1e-3}], lr=1e-2)
    tl.Trainer(net, tl.loss.MSE(), opt)
    assert [g for _, _, g in opt._native.segments()] == [0, 1]


def test_one_group_of_every_parameter_is_the_keyword_form_bit_for_bit(mlp_pair):
    runs = []
    for make in (lambda net: optim.Adam(lr=1e-2, weight_decay=0.1),
                 lambda net: optim.Adam(net.parameters(), lr=1e-2, weight_decay=0.1)):
        net, _ = mlp_pair(SIZES)
        opt = make(net).attach(net)
        rng = np.random.default_rng(2)
        for _ in range(10):  # gradients where a backward pass writes them (padding stays zero)
            for g in net.named_gradients().values():
                g[...] = rng.standard_normal(g.shape)
            opt.step()
        runs.append(net.flat_parameters().copy())
    np.testing.assert_array_equal(runs[0], runs[1])


def test_one_group_of_every_parameter_is_uniform_options():
    """torch's Adam(model.parameters()) is one set of options over the whole buffer (what a device
    update can run); a split into groups, or a group that leaves parameters out, is not. Option changes
    are counted, so a mirror of them (the device trainer) asks again only after a change."""
    def bound(make):
        net = tl.nn.Sequential(tl.nn.Linear(3, 4), tl.nn.Tanh(), tl.nn.Linear(4, 2))
        opt = make(net)
        tl.Trainer(net, tl.loss.MSE(), opt)
        return opt._native

    assert bound(lambda n: optim.Adam(lr=1e-3)).uniform_options
    assert bound(lambda n: optim.Adam(n.parameters(), lr=1e-3)).uniform_options
    assert not bound(lambda n: optim.Adam([{"params": n[0].parameters()}, {"params": n[2].parameters()}])).uniform_options
    assert not bound(lambda n: optim.Adam(n[0].parameters(), lr=1e-3)).uniform_options
    native = bound(lambda n: optim.SGD(n.parameters(), lr=0.1, momentum=0.9))
    before = native.options_version
    native.set_group_option(0, "momentum", 0.5)
    assert native.options_version == before + 1
