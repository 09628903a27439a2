"""Smoke tests of the benchmark suite: one tiny run end to end, and how unbuilt layers are reported."""
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
import treadle.bench as tb  # noqa: E402 (after the torch skip)


@pytest.fixture(scope="module")
def workloads():
    return {w.name: w for w in tb.load_workloads()}


def test_workload_list_is_the_documented_one(workloads):
    assert set(workloads) == {"W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W8-b1024", "W8-w32",
                                "W1-b1", "W2-b1"}
    assert not workloads["W1-b1"].train and workloads["W1-b1"].batch == 1


def test_smoke_run_writes_json_and_table(tmp_path, workloads, capsys):
    code = tb.main(["--workloads", "W1", "--threads", "1", "--min-time", "0.02", "--warmup", "0", "--no-gemm",
                    "--quiet", "--out", str(tmp_path)], workloads=list(workloads.values()))
    assert code == 0
    table = capsys.readouterr().out
    assert "| W1 tiny MLP" in table and "CPU peak" not in table  # --no-gemm
    result = json.loads((tmp_path / "latest.json").read_text())
    assert (tmp_path / "latest.md").read_text().strip() == table.strip()
    for key in ("date", "machine", "torch", "treadle", "settings", "rows", "call_overhead_us"):
        assert key in result
    assert result["machine"]["cpu_model"] and "avx512f" in result["machine"]["flags"]
    assert result["torch"]["version"] == torch.__version__
    (row,) = result["rows"]
    assert row["workload"] == "W1" and row["status"] == "ok" and row["threads_torch"] == 1
    assert row["check"]["ok"] and row["check"]["loss_abs_diff"] <= 1e-4
    for kind in ("train", "infer"):
        assert row[f"{kind}_ratio"] > 0
        assert all(v > 0 for v in row[f"{kind}_us"].values())
        assert set(row[f"{kind}_us"]) == {"treadle", "torch"}


def test_two_thread_rows_lend_treadle_two_workers(tmp_path, workloads):
    code = tb.main(["--workloads", "W2", "--threads", "2", "--min-time", "0.02", "--warmup", "0", "--no-gemm",
                    "--quiet", "--out", str(tmp_path)], workloads=list(workloads.values()))
    assert code == 0
    (row,) = json.loads((tmp_path / "latest.json").read_text())["rows"]
    assert row["status"] == "ok" and row["threads_torch"] == row["threads_treadle"] == 2


def test_workers_table_times_one_against_two_workers_bitwise(tmp_path, capsys):
    code = tb.main(["workers", "--workloads", "W2", "--batch-multipliers", "1,2", "--min-time", "0.02",
                    "--warmup", "0", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    table = capsys.readouterr().out
    result = json.loads((tmp_path / "workers-latest.json").read_text())
    assert [r["batch"] for r in result["rows"]] == [128, 256]
    for r in result["rows"]:
        assert r["bitwise_equal"] and r["treadle_speedup"] > 0 and r["torch_speedup"] > 0
        assert set(r["us"]) == {"treadle_1", "treadle_2", "torch_1", "torch_2"}
    assert "| W2 small MLP" in table and (tmp_path / "workers-latest.md").read_text().strip() == table.strip()


def test_activations_table_has_every_activation(tmp_path, capsys):
    code = tb.main(["activations", "--rows", "8", "--cols", "256", "--min-time", "0.02", "--warmup", "0",
                    "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "activations-latest.json").read_text())
    ops = [r["op"] for r in result["rows"]]
    assert ops[0] == "relu" and {"softplus", "silu", "elu", "gelu", "gelu_tanh", "tanh", "sigmoid"} <= set(ops)
    for r in result["rows"]:
        assert r["treadle_forward_ns"] > 0 and r["torch_forward_ns"] > 0
    assert "| softplus |" in capsys.readouterr().out


def test_unbuilt_layer_is_reported_missing(workloads):
    def needs_a_layer_that_does_not_exist(tl):
        return tl.nn.NoSuchLayer(3)

    w = replace(workloads["W1"], name="Wx", build_treadle=needs_a_layer_that_does_not_exist)
    import treadle as tl
    rows, _ = tb.bench_workload(w, tl, torch, [1, 2], min_time=0.01, warmup=0, log=lambda *a: None)
    assert [r["status"] for r in rows] == ["missing", "missing"]
    assert "NoSuchLayer" in rows[0]["message"]
    assert "missing: AttributeError" in tb.to_markdown({
        "date": "d", "machine": tb.machine_info(), "torch": {"version": "t", "adam": "default"},
        "treadle": {"version": "v", "git": None, "backends": ["eigen"]},
        "settings": {"min_time": 0.01, "warmup": 0}, "rows": rows})


def test_time_alternating_gives_medians():
    r = tb.time_alternating({"a": lambda k: sum(range(100 * k)), "b": lambda k: [None for _ in range(k)]}, min_time=0.01, warmup=0)
    assert set(r) == {"a", "b"} and all(v["median_s"] > 0 and v["steps"] > 0 for v in r.values())


def test_crossover_has_its_own_options():  # the study itself: tests/test_dispatch_auto.py
    with pytest.raises(SystemExit) as e:
        tb.main(["crossover", "--help"])
    assert e.value.code == 0


def test_device_cuda_needs_a_cuda_build_and_a_gpu(tmp_path, workloads):
    """--device cuda stops before building anything, naming what is missing (the CUDA backend in
    this build, or a GPU that torch sees)."""
    import treadle as tl

    expected = "no CUDA backend" if "cuda" not in tl.backends() else "sees no CUDA device"
    if "cuda" in tl.backends() and torch.cuda.is_available():
        pytest.skip("a GPU is present: bench/gpu_check.sh runs the device benchmark")
    with pytest.raises(SystemExit, match=expected):
        tb.main(["--device", "cuda", "--workloads", "W1", "--quiet", "--out", str(tmp_path)],
                workloads=list(workloads.values()))


def test_online_offline_benchmark_runs_and_reports(tmp_path):
    """bench/online_offline.py on a few steps: the three trainings run, the JSON and table carry the conditions."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "online_offline.py")
    proc = subprocess.run([sys.executable, script, "--steps", "40", "--seeds", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "latest-online-offline.json").read_text())
    assert result["conditions"]["steps"] == 40 and result["conditions"]["threads"] == 1
    for kind in ("online", "online_reservoir", "offline", "offline_same_memory"):
        assert 0 < result["median"][kind]["error"] < 10 and result["median"][kind]["train_steps"] >= 1
    assert result["median"]["offline"]["stored_samples"] == 40 * 16
    # The equal-memory run keeps all 640 samples (below the online buffer's 4096): a reservoir keeps all it can.
    assert result["median"]["offline_same_memory"]["stored_samples"] == 40 * 16
    assert "| online |" in (tmp_path / "latest-online-offline.md").read_text()


def test_the_script_runs_a_workloads_file_of_your_own(tmp_path):
    # bench/run.py passes its folder's list unless --workloads-file names another.
    (tmp_path / "mine.py").write_text(
        "from dataclasses import replace\n"
        "from treadle.bench_workloads import all_workloads as _all\n"
        "def all_workloads():\n"
        "    return [replace(w, name='MINE') for w in _all() if w.name == 'W1-b1']\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, os.path.join(repo, "bench", "run.py"), "--workloads", "MINE",
                           "--workloads-file", str(tmp_path / "mine.py"), "--threads", "1", "--min-time", "0.02",
                           "--warmup", "0", "--no-gemm", "--quiet", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| MINE W1 inference" in proc.stdout
