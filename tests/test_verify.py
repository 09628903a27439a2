"""`python -m treadle verify`: the installation check passes here, covers every forward op, checks
each backend's own kernels (not an Eigen fallback), and fails, naming op, backend and dtype, when a
kernel is wrong (injected below by wrapping the op runner verify calls)."""
import json
import subprocess
import sys

import numpy as np
import pytest

import treadle as tl
from treadle import verify
from treadle.verify_cases import CASES, FORWARD_OPS_WITHOUT_CASES


def test_verify_passes_and_reports_its_matrix(tmp_path):
    out = tmp_path / "verify.json"
    proc = subprocess.run([sys.executable, "-m", "treadle", "verify", "--json", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "checks passed" in proc.stdout and "finite differences" in proc.stdout
    report = json.loads(out.read_text())
    assert report["failures"] == []
    assert report["threads"]["before"] == report["threads"]["after"]
    assert len(report["rows"]) == len(CASES)
    expected = {"finite differences", "eigen float32"} | {f"{b} float32" for b in verify.usable_backends()}
    assert expected <= set(report["columns"])
    assert report["build"]["version"] == tl.__version__


def test_every_forward_op_has_a_case():
    forward = {op for op in tl.backend_ops("eigen") if not op.endswith("_backward")}
    covered = {c.op for c in CASES}
    assert forward - covered == set(FORWARD_OPS_WITHOUT_CASES), forward - covered
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.skipif("onednn" not in tl.backends(), reason="treadle was built without oneDNN")
def test_the_onednn_column_checks_onednn_kernels_not_a_fallback():
    """The cases are tiny, below oneDNN's profitability thresholds: verify asks for its kernels anyway."""
    report = verify.run(backends=["onednn"])
    listed = tl.backend_ops("onednn")
    checked = declined = 0
    for row in report["rows"]:
        cell = row["cells"].get("onednn float32")
        if "float32" not in listed.get(row["op"], ()):
            assert cell is None, row
        elif isinstance(cell, dict):
            declined += 1
            assert "on this CPU" in cell["declined"] or "took none of these nodes" in cell["declined"], row
        else:
            checked += 1
            assert cell <= 1.0, row
    assert checked >= 30, (checked, declined)


def _faulty_run_op(op, backend, dtype, factor=1.001, output=False):
    """The op runner with one kernel made wrong: `op` on `backend` in `dtype` returns its first input
    gradient (or its first output) scaled by `factor`."""
    real = tl._core.run_op

    def run_op(name, inputs, attrs, grad_outputs=None, run_backend="", training=True, seed=0, *rest):
        result = list(real(name, inputs, attrs, grad_outputs, run_backend, training, seed, *rest))
        floating = [x for x in inputs if np.asarray(x).dtype.kind == "f"]
        if name == op and run_backend == backend and floating and floating[0].dtype == np.dtype(dtype):
            if output:
                result[0] = [result[0][0] * factor] + list(result[0][1:])
            elif grad_outputs is not None and result[1][0] is not None:
                result[1] = [result[1][0] * factor] + list(result[1][1:])
        return tuple(result)

    return run_op


@pytest.mark.parametrize("op,backend,dtype,column,output", [
    ("linear", "eigen", "float64", "finite differences", False),  # a wrong gradient in the reference
    ("softmax", "eigen", "float32", "eigen float32", False),
    ("conv", "eigen", "float32", "eigen float32", True),
    ("layer_norm", "onednn", "float32", "onednn float32", False),
    ("matmul", "onednn", "float32", "onednn float32", True),
])
def test_a_wrong_kernel_fails_verify_naming_op_backend_and_dtype(monkeypatch, op, backend, dtype, column, output):
    if backend not in verify.usable_backends():
        pytest.skip(f"{backend} is not built")
    monkeypatch.setattr(tl._core, "run_op", _faulty_run_op(op, backend, dtype, output=output))
    report = verify.run(ops=[op], backends=[backend])
    failed = {(f["op"], f["check"], f["backend"], f["dtype"]) for f in report["failures"]}
    assert (op, column, backend, dtype) in failed, report["failures"]
    assert all(f["op"] == op for f in report["failures"])


def test_a_wrong_kernel_makes_the_command_exit_nonzero(monkeypatch, capsys):
    monkeypatch.setattr(tl._core, "run_op", _faulty_run_op("tanh", "eigen", "float32", factor=1.01))
    parser = __import__("argparse").ArgumentParser()
    verify.add_arguments(parser)
    assert verify.main(parser.parse_args(["--ops", "tanh"])) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "tanh" in out and "[eigen float32]" in out


@pytest.mark.parametrize("args,message", [(["--ops", "nope"], "no case for ['nope']"),
                                          (["--backend", "tpu"], "unknown backend")])
def test_bad_filters_are_named(args, message):
    proc = subprocess.run([sys.executable, "-m", "treadle", "verify", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


def test_quick_runs_fewer_finite_differences_and_still_passes():
    quick = verify.run(quick=True, ops=["linear", "conv", "lstm_layer"])
    assert quick["failures"] == [] and quick["quick"]
