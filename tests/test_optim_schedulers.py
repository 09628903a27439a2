"""torch-form learning-rate schedules (bound to an optimizer, stepped per epoch) against
torch.optim.lr_scheduler: every group's lr (and OneCycleLR's momentum) after each step."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.optim as optim

EPOCHS = 40
LS = optim.lr_scheduler
TS = torch.optim.lr_scheduler


def _pair(opt_name="SGD", **kw):
    """The same two-group optimizer in treadle (on flat buffers, no model needed) and torch."""
    ours = getattr(optim, opt_name)([{"params": [np.zeros(3)]}, {"params": [np.zeros(2)], "lr": 0.05}], lr=0.1, **kw)
    theirs = getattr(torch.optim, opt_name)([{"params": [torch.zeros(3, requires_grad=True)]},
                                             {"params": [torch.zeros(2, requires_grad=True)], "lr": 0.05}],
                                            lr=0.1, **kw)
    return ours, theirs


CASES = [
    ("StepLR", lambda L, o: L.StepLR(o, step_size=7, gamma=0.5)),
    ("StepLR-positional", lambda L, o: L.StepLR(o, 3, 0.9)),
    ("MultiStepLR", lambda L, o: L.MultiStepLR(o, milestones=[5, 12, 12, 30], gamma=0.3)),
    ("ExponentialLR", lambda L, o: L.ExponentialLR(o, gamma=0.93)),
    ("CosineAnnealingLR", lambda L, o: L.CosineAnnealingLR(o, T_max=15, eta_min=1e-3)),
    ("ConstantLR", lambda L, o: L.ConstantLR(o, factor=0.25, total_iters=6)),
    ("LinearLR", lambda L, o: L.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=12)),
    ("LinearLR-defaults", lambda L, o: L.LinearLR(o)),
    ("LambdaLR", lambda L, o: L.LambdaLR(o, lambda e: 0.95 ** e)),
    ("LambdaLR-per-group", lambda L, o: L.LambdaLR(o, [lambda e: 1 / (1 + e), lambda e: 0.9 ** (e // 3)])),
    ("OneCycleLR", lambda L, o: L.OneCycleLR(o, max_lr=0.5, total_steps=EPOCHS + 1)),
    ("OneCycleLR-linear-3phase", lambda L, o: L.OneCycleLR(o, max_lr=[0.5, 0.2], epochs=5, steps_per_epoch=9,
                                                           anneal_strategy="linear", three_phase=True)),
    ("SequentialLR", lambda L, o: L.SequentialLR(o, [L.LinearLR(o, start_factor=0.1, total_iters=5),
                                                     L.CosineAnnealingLR(o, T_max=20)], milestones=[5])),
    ("SequentialLR-3", lambda L, o: L.SequentialLR(o, [L.ConstantLR(o, factor=0.5, total_iters=3),
                                                       L.ExponentialLR(o, gamma=0.9),
                                                       L.StepLR(o, step_size=4)], milestones=[6, 20])),
]


@pytest.mark.parametrize("opt_name,kw", [("SGD", dict(momentum=0.9)), ("Adam", {})], ids=["SGD", "Adam"])
@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_schedule_matches_torch(name, make, opt_name, kw):
    ours, theirs = _pair(opt_name, **kw)
    s, ts = make(LS, ours), make(TS, theirs)
    for epoch in range(EPOCHS):
        np.testing.assert_allclose(s.get_last_lr(), ts.get_last_lr(), rtol=1e-12, err_msg=f"epoch {epoch}")
        for i, (g, tg) in enumerate(zip(ours.param_groups, theirs.param_groups)):
            assert g["lr"] == pytest.approx(tg["lr"], rel=1e-12)
            assert ours._native.group_lr(i) == pytest.approx(tg["lr"], rel=1e-12)
            key = "momentum" if opt_name == "SGD" else "betas"
            assert np.allclose(g[key], tg[key], rtol=1e-12), (epoch, key)
        theirs.step()
        s.step()
        ts.step()


def test_reduce_lr_on_plateau_matches_torch():
    metrics = [1.0, 0.9, 0.95, 0.95, 0.96, 0.97, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]
    for kw in (dict(patience=2), dict(mode="max", factor=0.5, patience=1, cooldown=2, min_lr=[0.01, 0.02]),
               dict(threshold_mode="abs", threshold=0.05, patience=0)):
        ours, theirs = _pair()
        s, ts = LS.ReduceLROnPlateau(ours, **kw), TS.ReduceLROnPlateau(theirs, **kw)
        for m in metrics:
            s.step(m)
            ts.step(m)
            np.testing.assert_allclose(s.get_last_lr(), ts.get_last_lr(), rtol=1e-15)
            np.testing.assert_allclose([g["lr"] for g in ours.param_groups],
                                       [g["lr"] for g in theirs.param_groups], rtol=1e-15)


def test_step_lr_counts_epochs_in_torch_form_and_updates_in_closed_form(mlp_pair):
    """StepLR(opt, ...) counts .step() calls (epochs); StepLR(...) given to the Trainer counts updates."""
    net, ref = mlp_pair((4, 5, 2), dtype="float64")
    opt = optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    trainer = tl.Trainer(net, tl.loss.MSE(), opt)
    sched = LS.StepLR(opt, step_size=2, gamma=0.5)
    topt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    tsched = TS.StepLR(topt, step_size=2, gamma=0.5)
    rng = np.random.default_rng(0)
    for epoch in range(6):
        for _ in range(3):  # three batches per epoch
            x, y = rng.standard_normal((4, 4)), rng.standard_normal((4, 2))
            trainer.step(x, y)
            topt.zero_grad()
            torch.nn.functional.mse_loss(ref(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            topt.step()
        sched.step()
        tsched.step()
        assert trainer.lr == pytest.approx(tsched.get_last_lr()[0], rel=1e-15)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(dict(net.named_parameters())[name], p.detach().numpy(), rtol=1e-10, atol=1e-12)
    closed = LS.StepLR(step_size=2, gamma=0.5)
    assert [closed.lr_at(t, 1.0) for t in range(5)] == [1.0, 1.0, 0.5, 0.5, 0.25]


def test_group_lrs_follow_a_closed_form_schedule_in_the_trainer(mlp_pair):
    """Trainer(schedule=closed form) applies it to every group's own lr, as torch's per-group base_lrs."""
    net, _ = mlp_pair((4, 5, 2), dtype="float64")
    ps = net.parameters()
    opt = optim.SGD([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.01}], lr=0.1)
    trainer = tl.Trainer(net, tl.loss.MSE(), opt, schedule=LS.ExponentialLR(0.5))
    x, y = np.ones((2, 4)), np.zeros((2, 2))
    trainer.step(x, y)  # update 1 at the base lrs
    trainer.zero_grad()
    trainer.compute_gradients(x, y)
    g = net.flat_gradients().copy()
    before = net.flat_parameters().copy()
    trainer.update()  # update 2 at lr * 0.5 in each group
    segs = opt._native.segments()
    for begin, end, group in segs:
        lr = (0.1, 0.01)[group] * 0.5
        np.testing.assert_allclose(net.flat_parameters()[begin:end], before[begin:end] - lr * g[begin:end],
                                   rtol=1e-14)


def test_schedule_misuse_is_refused():
    opt, _ = _pair()
    bound = LS.StepLR(opt, 3)
    with pytest.raises(TypeError, match="do not pass it to Trainer"):
        bound._native
    with pytest.raises(TypeError, match="closed form"):
        LS.StepLR(3).step()
    with pytest.raises(TypeError, match="takes the optimizer as its first argument"):
        LS.MultiStepLR([3, 5])
    with pytest.raises(ValueError, match="expected 2 lr_lambdas"):
        LS.LambdaLR(opt, [lambda e: 1.0])
    with pytest.raises(ValueError, match="start_factor"):
        LS.LinearLR(opt, start_factor=0.0)
    with pytest.raises(ValueError, match="factor must be < 1.0"):
        LS.ReduceLROnPlateau(opt, factor=1.5)
    with pytest.raises(ValueError, match="one milestone fewer"):
        LS.SequentialLR(opt, [LS.StepLR(opt, 2), LS.StepLR(opt, 3)], milestones=[])
    with pytest.raises(ValueError, match="neither momentum nor betas"):
        LS.OneCycleLR(optim.Adagrad([np.zeros(2)]), max_lr=0.1, total_steps=10)
    with pytest.raises(ValueError, match="state buffers"):  # SGD without momentum has no buffer to cycle
        LS.OneCycleLR(optim.SGD([np.zeros(2)]), max_lr=0.1, total_steps=10)
    one = LS.OneCycleLR(_pair(momentum=0.9)[0], max_lr=0.1, total_steps=2)
    one.step()
    one.step()
    with pytest.raises(ValueError, match="total_steps is 2"):
        one.step()
