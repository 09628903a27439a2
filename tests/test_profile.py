"""Per-node profiling: tl.profile() and TREADLE_PROFILE=1 record every kernel call of every plan with
its op, backend, pass and module, leave results unchanged, and restore the previous state."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import treadle as tl


def small_trainer():
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(5, 16), tl.nn.Tanh(), tl.nn.Linear(16, 3))
    return tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-2))


def batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal((8, 5)).astype(np.float32), rng.integers(0, 3, 8)


def test_profile_counts_every_kernel_call_with_its_labels():
    trainer, (x, y) = small_trainer(), batch()
    trainer.step(x, y)  # compiled outside the profile
    with tl.profile() as prof:
        for _ in range(7):
            trainer.step(x, y)
    nodes = prof.nodes()
    assert nodes and all(n["calls"] == 7 for n in nodes)
    assert [n["seconds"] for n in nodes] == sorted((n["seconds"] for n in nodes), reverse=True)
    assert prof.total_seconds == pytest.approx(sum(n["seconds"] for n in nodes))
    seen = {(n["op"], n["pass"], n["module"]) for n in nodes}
    assert ("linear", "forward", "0") in seen and ("linear", "forward", "2") in seen
    # the tanh is fused into the first linear (its node is a free view): its backward belongs to
    # the linear's gradient rule
    assert ("tanh", "forward", "1") not in seen and ("tanh_backward", "backward", "0") in seen
    assert ("cross_entropy", "loss", "") in seen
    assert all(n["backend"] in tl.backends() for n in nodes)
    first_linear = next(n for n in nodes if n["op"] == "linear" and n["module"] == "0")
    assert first_linear["output_shape"] == (8, 16)
    report = prof.report(top=3)
    assert report.startswith("treadle profile:") and "by module:" in report
    assert len([ln for ln in report.splitlines() if "[eigen]" in ln or "[onednn]" in ln]) == 3
    modules = dict(prof.by_module())
    assert modules[("0", "forward")] > 0 and modules[("0", "backward")] > 0


def test_profile_is_off_outside_and_restores_nesting():
    trainer, (x, y) = small_trainer(), batch()
    with tl.profile() as outer:
        trainer.step(x, y)
        with tl.profile() as inner:
            trainer.model.predict(x)
        trainer.step(x, y)
    trainer.step(x, y)  # nothing installed any more
    assert {n["pass"] for n in inner.nodes()} == {"forward"}
    assert all(n["calls"] == 1 for n in inner.nodes())
    linear0 = [n for n in outer.nodes() if n["op"] == "linear" and n["module"] == "0"]
    assert sum(n["calls"] for n in linear0) == 2  # the predict went to the inner profile only
    outer.reset()
    assert outer.nodes() == [] and outer.total_seconds == 0


def test_profiling_changes_no_result():
    a, b = small_trainer(), small_trainer()
    x, y = batch()
    losses_a = [a.step(x, y) for _ in range(3)]
    with tl.profile():
        losses_b = [b.step(x, y) for _ in range(3)]
    assert losses_a == losses_b
    np.testing.assert_array_equal(a.model.flat_parameters(), b.model.flat_parameters())


def test_treadle_profile_env_prints_report_at_exit():
    code = ("import numpy as np, treadle as tl\n"
            "m = tl.nn.Sequential(tl.nn.Linear(3, 4), tl.nn.ReLU(), tl.nn.Linear(4, 2))\n"
            "for _ in range(5): m.predict(np.ones((2, 3), np.float32))\n")
    root = Path(tl.__file__).resolve().parents[1]
    env = dict(os.environ, TREADLE_PROFILE="1", TREADLE_PROFILE_TOP="5",
               PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "treadle profile: 2 nodes" in proc.stderr
    # the relu is fused into the first linear, so the two nodes are the linears
    assert "linear [" in proc.stderr and "relu [" not in proc.stderr and "forward 0 -> (2, 4)" in proc.stderr


def test_bench_profile_reports_nodes(tmp_path):
    pytest.importorskip("torch")
    import treadle.bench as tb
    workloads = {w.name: w for w in tb.load_workloads()}
    code = tb.main(["--workloads", "W2", "--threads", "1", "--min-time", "0.05", "--warmup", "0", "--no-gemm",
                    "--quiet", "--profile", "--out", str(tmp_path)], workloads=list(workloads.values()))
    assert code == 0
    prof = json.loads((tmp_path / "latest.json").read_text())["profile"]["W2"]
    assert prof["steps"] > 0 and prof["kernel_us_per_step"] > 0
    assert {n["pass"] for n in prof["nodes"]} >= {"forward", "backward"}
    assert sum(m["share"] for m in prof["modules"]) == pytest.approx(1.0, abs=0.05)
    assert "## Profile of W2" in (tmp_path / "latest.md").read_text()
