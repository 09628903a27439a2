"""Loss scaling in the Trainer (TrainerOptions::loss_scaling; Python `loss_scale=`), checked against
torch.amp.GradScaler("cpu") driving a torch model that computes our fp16 definition (every product's
operands rounded to fp16, float32 math; see tests/test_fp16_precision.py): the sequence of scales,
the skipped steps and the parameters over 30 steps whose first ones overflow; the underflow that
scaling exists for; a fixed scale; growth; split phases, gradient accumulation and tasked steps; the
checkpoint round trip of the scaler's state; errors. Data parallel: tests/mpi_scripts/loss_scaling.py.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import treadle as tl
from test_fp16_precision import mm16, rel_err

F32 = np.float32
D_IN, D_HID, D_OUT = 8, 16, 4


def make_net(seed=0, precision="fp16"):
    tl.manual_seed(seed)
    net = tl.nn.Sequential(tl.nn.Linear(D_IN, D_HID), tl.nn.Tanh(), tl.nn.Linear(D_HID, D_OUT))
    return net.set_precision(precision)


def batches(n_steps, batch=32, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, D_IN)).astype(F32), rng.standard_normal((batch, D_OUT)).astype(F32))
            for _ in range(n_steps)]


class TorchNet:
    """The same MLP in torch, every product through mm16."""

    def __init__(self, state):
        self.p = {k: torch.tensor(v, requires_grad=True) for k, v in state.items()}

    def __call__(self, x):
        h = torch.tanh(mm16(x, self.p["0.weight"].T) + self.p["0.bias"])
        return mm16(h, self.p["2.weight"].T) + self.p["2.bias"]

    def params(self):
        return list(self.p.values())

    def state(self):
        return {k: v.detach().numpy().copy() for k, v in self.p.items()}


def torch_run(state, data, scaler_args, lr=1e-2, clip=None, accumulate=1):
    """GradScaler's recipe: scale(loss).backward() (per micro-batch), unscale_, clip, step, update.
    Returns per step (loss, scale used, skipped), the parameters after each step and the final scale."""
    net = TorchNet(state)
    opt = torch.optim.Adam(net.params(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", **scaler_args)
    log, params = [], []
    for x, t in data:
        opt.zero_grad()
        scale = scaler.get_scale()
        losses = []
        for xs, ts in zip(np.array_split(x, accumulate), np.array_split(t, accumulate)):
            loss = torch.nn.functional.mse_loss(net(torch.tensor(xs)), torch.tensor(ts))
            scaler.scale(loss).backward()
            losses.append(loss.item())
        scaler.unscale_(opt)
        if clip:
            torch.nn.utils.clip_grad_norm_(net.params(), clip)
        steps_before = float(opt.state[net.params()[0]].get("step", 0))  # a tensor updated in place
        scaler.step(opt)
        scaler.update()
        skipped = float(opt.state[net.params()[0]].get("step", 0)) == float(steps_before)
        log.append((losses[-1], scale, skipped))
        params.append(net.state())
    return log, params, scaler.get_scale()


def treadle_run(net, data, loss_scale, lr=1e-2, clip=None, accumulate=1, phases="step", **options):
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=lr), clip_grad_norm=clip, loss_scale=loss_scale,
                         **options)
    log, params = [], []
    for x, t in data:
        scale, skipped = trainer.loss_scale, trainer.skipped_steps
        if phases == "step":
            loss = trainer.step(x, t)
        elif phases == "tasks":
            for task in range(len(trainer.begin_step(x, t))):
                trainer.run_task(task)
            loss = trainer.finish_step()
        else:  # compute_gradients (per micro-batch) + update
            trainer.zero_grad()
            for xs, ts in zip(np.array_split(x, accumulate), np.array_split(t, accumulate)):
                loss = trainer.compute_gradients(xs, ts)
            trainer.update()
        log.append((loss, scale, trainer.skipped_steps > skipped))
        params.append({k: v.copy() for k, v in net.state_dict().items()})
    return trainer, log, params


SCALER = {"init_scale": 2.0 ** 28, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 5}


def assert_runs_match(log, params, ref_log, ref_params):
    assert [s for _, s, _ in log] == [s for _, s, _ in ref_log], "scales"
    assert [k for _, _, k in log] == [k for _, _, k in ref_log], "skipped steps"
    for step, ((loss, _, _), (ref_loss, _, _)) in enumerate(zip(log, ref_log)):
        assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), f"loss of step {step}"
    for step, (p, ref) in enumerate(zip(params, ref_params)):
        for name in ref:
            # Chained fp16 roundings: a float32 difference in an intermediate may flip one fp16 ulp.
            assert rel_err(p[name], ref[name]) < 3e-5, f"{name} after step {step}"


@pytest.mark.parametrize("clip", [None, 0.5])
def test_dynamic_scaling_matches_grad_scaler(clip):
    """init_scale 2^28 overflows the fp16 gradient operands: the first steps are skipped (Adam's
    state and step count untouched) while the scale halves, then it grows every 5 good steps and
    backs off again whenever the grown scale overflows."""
    data = batches(30)
    net = make_net()
    ref_log, ref_params, final_scale = torch_run(net.state_dict(), data, SCALER, clip=clip)
    trainer, log, params = treadle_run(net, data, dict(SCALER), clip=clip)
    skipped = [k for _, _, k in ref_log]
    assert skipped[:3] == [True] * 3 and 3 <= sum(skipped) < 15 and not all(skipped[-5:])
    assert len({s for _, s, _ in ref_log}) >= 4  # backed off and grown
    assert_runs_match(log, params, ref_log, ref_params)
    assert trainer.skipped_steps == sum(skipped) and trainer.steps == 30 - sum(skipped)
    assert trainer.loss_scale == final_scale


@pytest.mark.parametrize("phases", ["split", "tasks"])
def test_split_phases_and_tasked_steps_equal_step(phases):
    data = batches(20)
    _, log, params = treadle_run(make_net(), data, dict(SCALER))
    _, log2, params2 = treadle_run(make_net(), data, dict(SCALER), phases=phases)
    assert log2 == log
    for p, q in zip(params, params2):
        for name in p:
            np.testing.assert_array_equal(p[name], q[name])


def test_gradient_accumulation_matches_grad_scaler():
    data = batches(25)
    net = make_net()
    ref_log, ref_params, _ = torch_run(net.state_dict(), data, SCALER, accumulate=2)
    _, log, params = treadle_run(net, data, dict(SCALER), accumulate=2, phases="split")
    assert_runs_match(log, params, ref_log, ref_params)


def test_growth_after_growth_interval():
    net = make_net()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=1e-3),
                         loss_scale={"init_scale": 1.0, "growth_interval": 3, "growth_factor": 4.0})
    scales = []
    for x, t in batches(10):
        trainer.step(x, t)
        scales.append(trainer.loss_scale)
    assert scales == [1, 1, 4, 4, 4, 16, 16, 16, 64, 64] and trainer.skipped_steps == 0
    assert trainer._native.loss_scale_growth_tracker == 1


def test_fixed_scale():
    """A fixed scale never changes; a step that overflows is skipped all the same."""
    data = batches(6)
    net = make_net()
    state = net.state_dict()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), loss_scale=1024.0)
    net_t = TorchNet(state)
    opt = torch.optim.Adam(net_t.params(), lr=1e-2)
    for step, (x, t) in enumerate(data):
        if step == 3:
            x = x.copy()
            x[0, 0] = 1e5  # an fp16 Inf operand: non-finite gradients, the step is skipped
        before = {k: v.copy() for k, v in net.state_dict().items()}
        loss = trainer.step(x, t)
        assert trainer.loss_scale == 1024.0
        if step == 3:
            assert trainer.skipped_steps == 1 and trainer.steps == 3
            for k, v in net.state_dict().items():
                np.testing.assert_array_equal(v, before[k])
            continue
        # torch by hand: the loss times 1024, gradients times 1/1024, Adam
        opt.zero_grad()
        ref = torch.nn.functional.mse_loss(net_t(torch.tensor(x)), torch.tensor(t))
        (ref * 1024.0).backward()
        for p in net_t.params():
            p.grad *= 1.0 / 1024.0
        opt.step()
        assert abs(loss - ref.item()) <= 1e-5 * ref.item()
        for name, ref_p in net_t.state().items():
            assert rel_err(net.state_dict()[name], ref_p) < 1e-4, name


def test_scaling_rescues_gradients_that_underflow_in_fp16():
    """A loss whose output gradient (~4e-9) is below fp16's smallest subnormal (2^-24 = 6e-8): without
    scaling the rounded gradient operand is 0 and the weight gradients are exactly zero; with a scale
    of 2^20 they match the exact gradient of the definition (dW = dY^T h(X), dY unrounded) to fp16's
    precision, after unscaling."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, D_IN)).astype(F32)
    results = {}
    for scale in (None, 2.0 ** 20):
        tl.manual_seed(3)
        net = tl.nn.Sequential(tl.nn.Linear(D_IN, D_OUT)).set_precision("fp16")
        y = net.predict(x)
        t = (y + 1e-6 * rng.standard_normal(y.shape)).astype(F32) if scale is None else t
        trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0), loss_scale=scale)
        trainer.zero_grad()
        trainer.compute_gradients(x, t)
        trainer.update()  # unscales
        results[scale] = net.named_gradients()["0.weight"]
        assert trainer.skipped_steps == 0
    dy = 2.0 * (y.astype(np.float64) - t) / y.size
    assert np.abs(dy).max() < 2.0 ** -25
    exact = dy.T @ torch.tensor(x).half().double().numpy()
    assert not results[None].any()  # flushed to zero
    assert rel_err(results[2.0 ** 20], exact) < 2e-3


def test_skip_nonfinite_counts_an_overflow_once():
    data = batches(8)
    a, log_a, _ = treadle_run(make_net(), data, dict(SCALER))
    b, log_b, _ = treadle_run(make_net(), data, dict(SCALER), skip_nonfinite=True)
    assert log_a == log_b and a.skipped_steps == b.skipped_steps > 0


def test_host_driven_backward_is_scaled_too():
    """forward + backward(dL/dy) + update gives step()'s update: backward seeds with grad_output
    times the scale, and update() unscales."""
    data = batches(8)
    _, _, ref = treadle_run(make_net(), data, dict(SCALER))
    net = make_net()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), loss_scale=dict(SCALER))
    for (x, t), want in zip(data, ref):
        trainer.zero_grad()
        y = trainer.forward(x)
        trainer.backward((2.0 * (y - t) / y.size).astype(F32))
        trainer.update()
        for name, p in net.state_dict().items():
            assert rel_err(p, want[name]) < 1e-5, name


def test_loss_scale_is_one_without_scaling():
    trainer = tl.Trainer(make_net(), tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x, t = batches(1)[0]
    trainer.step(x, t)
    assert trainer.loss_scale == 1.0 and trainer._native.loss_scale_growth_tracker == 0


def test_checkpoint_round_trip_of_the_scaler_state(tmp_path):
    data = batches(20)
    full, log_full, params_full = treadle_run(make_net(), data, dict(SCALER))
    net = make_net()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), loss_scale=dict(SCALER))
    for x, t in data[:12]:
        trainer.step(x, t)
    tracker = trainer._native.loss_scale_growth_tracker
    assert tracker > 0 and trainer.loss_scale != SCALER["init_scale"]
    path = tmp_path / "ckpt.safetensors"
    tl.save_checkpoint(path, trainer)
    _, meta = tl.io.load_file(path, with_metadata=True)
    assert float(meta["treadle.loss_scale"]) == trainer.loss_scale
    assert int(meta["treadle.loss_scale_growth_tracker"]) == tracker

    net2 = make_net(seed=9)
    resumed = tl.Trainer(net2, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), loss_scale=dict(SCALER))
    tl.load_checkpoint(path, resumed)
    assert resumed.loss_scale == trainer.loss_scale and resumed._native.loss_scale_growth_tracker == tracker
    for step, (x, t) in enumerate(data[12:], start=12):
        assert resumed.loss_scale == log_full[step][1]
        resumed.step(x, t)
    for name, p in net2.state_dict().items():
        np.testing.assert_array_equal(p, params_full[-1][name])

    # A trainer without loss scaling ignores the state; one with a fixed scale keeps its own.
    plain = tl.Trainer(make_net(), tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    tl.load_checkpoint(path, plain)
    assert plain.loss_scale == 1.0
    fixed = tl.Trainer(make_net(), tl.loss.MSE(), tl.optim.Adam(lr=1e-2), loss_scale=8.0)
    tl.load_checkpoint(path, fixed)
    assert fixed.loss_scale == 8.0


def test_checkpoints_without_scaler_state_still_load(tmp_path):
    """A checkpoint of a trainer without dynamic scaling (as every older file) has no scaler keys:
    loading it leaves the scaler where it is."""
    plain = tl.Trainer(make_net(), tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    x, t = batches(1)[0]
    plain.step(x, t)
    path = tmp_path / "plain.safetensors"
    tl.save_checkpoint(path, plain)
    _, meta = tl.io.load_file(path, with_metadata=True)
    assert not any(k.startswith("treadle.loss_scale") for k in meta)
    scaled = tl.Trainer(make_net(), tl.loss.MSE(), tl.optim.Adam(lr=1e-2), loss_scale="dynamic")
    tl.load_checkpoint(path, scaled)
    assert scaled.loss_scale == 65536.0 and scaled.steps == 1


def test_malformed_scaler_state_is_refused(tmp_path):
    trainer = tl.Trainer(make_net(), tl.loss.MSE(), tl.optim.Adam(lr=1e-2), loss_scale="dynamic")
    path = tmp_path / "ckpt.safetensors"
    tl.save_checkpoint(path, trainer)
    tensors, meta = tl.io.load_file(path, with_metadata=True)
    cases = [({"treadle.loss_scale": "-2"}, "'treadle.loss_scale' = '-2' is not a positive finite float32 value"),
             ({"treadle.loss_scale": "inf"}, "is not a positive finite float32 value"),
             ({"treadle.loss_scale": "0.1"}, "is not a positive finite float32 value"),  # not a float32 value
             ({"treadle.loss_scale_growth_tracker": "-1"}, "is not an integer"),
             ({"treadle.loss_scale": None}, "has 'treadle.loss_scale_growth_tracker' without 'treadle.loss_scale'")]
    for change, message in cases:
        bad = {k: v for k, v in meta.items() if k not in ("treadle.checksum", "treadle.version")}
        for k, v in change.items():
            if v is None:
                del bad[k]
            else:
                bad[k] = v
        bad_path = tmp_path / "bad.safetensors"
        tl._core.save_safetensors(str(bad_path), tensors, bad)
        fresh = tl.Trainer(make_net(), tl.loss.MSE(), tl.optim.Adam(lr=1e-2), loss_scale="dynamic")
        with pytest.raises(ValueError, match=message):
            tl.load_checkpoint(bad_path, fresh)
        assert fresh.loss_scale == 65536.0 and fresh.steps == 0


@pytest.mark.parametrize("loss_scale, message", [
    ("static", "loss_scale must be None, a number, 'dynamic' or a dict, got 'static'"),
    (True, "loss_scale must be None, a number"),
    ([2.0], "loss_scale must be None, a number"),
    ({"init": 2.0}, r"unknown loss_scale key\(s\) \['init'\]"),
    ({"growth_interval": 2.5}, "loss_scale\\['growth_interval'\\] must be an integer"),
    ({"growth_factor": "2"}, "loss_scale\\['growth_factor'\\] must be a number"),
    (-1.0, "Trainer: loss_scaling.init_scale must be positive and finite in float32, got -1"),
    (float("inf"), "loss_scaling.init_scale must be positive and finite in float32, got inf"),
    (1e39, "loss_scaling.init_scale must be positive and finite in float32"),
    ({"init_scale": 0.0}, "loss_scaling.init_scale must be positive"),
    ({"growth_factor": 1.0}, "Trainer: loss_scaling.growth_factor must be > 1 and finite, got 1"),
    ({"backoff_factor": 1.0}, r"Trainer: loss_scaling.backoff_factor must be in \(0, 1\), got 1"),
    ({"backoff_factor": 0.0}, r"loss_scaling.backoff_factor must be in \(0, 1\), got 0"),
    ({"growth_interval": 0}, r"Trainer: loss_scaling.growth_interval must be in \[1, 2\^31 - 1\], got 0"),
])
def test_errors(loss_scale, message):
    with pytest.raises(ValueError, match=message):
        tl.Trainer(make_net(), tl.loss.MSE(), tl.optim.SGD(lr=0.1), loss_scale=loss_scale)


def test_options_from_the_core_bindings():
    o = tl._core.TrainerOptions()
    assert o.loss_scaling.mode == "off" and o.loss_scaling.init_scale == 65536.0
    s = tl._core.LossScaling()
    with pytest.raises(ValueError, match="LossScaling: unknown mode 'on'"):
        s.mode = "on"
    s.mode, s.growth_interval = "dynamic", 7
    o.loss_scaling = s
    assert o.loss_scaling.mode == "dynamic" and o.loss_scaling.growth_interval == 7


# ---- data parallel ------------------------------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))


def test_data_parallel_ranks_take_the_same_skip_decisions(tmp_path):
    """Under mpiexec -n 2, rank 1's shard overflows on some steps only: after the gradient allreduce
    every rank sees the non-finite sum, skips, and backs off alike; replicas stay bitwise identical
    and match one process training on the whole batch."""
    pytest.importorskip("mpi4py.MPI")
    from test_distributed import MPIEXEC, launch
    if MPIEXEC is None:
        pytest.skip("no mpiexec")
    launch(2, [os.path.join(HERE, "mpi_scripts", "loss_scaling.py"), str(tmp_path)])
    ranks = [np.load(tmp_path / f"loss_scaling.rank{r}.npz") for r in range(2)]
    ref = np.load(tmp_path / "loss_scaling.single.npz")
    for r in ranks:
        np.testing.assert_array_equal(r["params"], ranks[0]["params"])
        np.testing.assert_array_equal(r["scales"], ref["scales"])
        np.testing.assert_array_equal(r["skipped"], ref["skipped"])
        assert rel_err(r["params"], ref["params"]) < 1e-4
    assert ranks[0]["skipped"][-1] == 4  # the four steps with an overflow on rank 1
    assert len(set(ranks[0]["scales"])) >= 3
