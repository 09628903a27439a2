"""Builds the C++ test executable (cpp/tests/test_core.cpp) with CMake in a temporary build directory
and runs each of its test groups: the public C++ API as a host uses it (training, a chunking host
executor, typed errors). Twice: Eigen only, and with the oneDNN backend as the default install has it
(the no-allocation groups count oneDNN's own per-execution allocations apart and hold treadle to zero).

The build reuses ccache: the temporary directory sits under <repo>/build, at the depth of the usual
build/dev, and CCACHE_BASEDIR is the repository root, so objects compiled for a dev build are hits.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUPS = ["training", "update_rules", "chunked_predict", "chunked_training", "bad_input", "no_alloc", "no_alloc_broadcast",
          "no_alloc_runs", "hardening", "tasks", "device_tensors", "pinn", "work_team"]


def _eigen_available():
    """Eigen comes from the cmeel-eigen wheel or any Eigen3 CMake package; CMake has the last word."""
    try:
        import cmeel  # noqa: F401
        return True
    except ImportError:
        return any(os.path.isdir(p) for p in ("/usr/include/eigen3", "/usr/local/include/eigen3"))


def _run(cmd, env, timeout):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _onednn_available():
    """oneDNN 3.2's CMake package from the onednn-devel-cpu-gomp wheel (the test extras install it)."""
    return any(os.path.isdir(os.path.join(p, "lib", "cmake", "dnnl")) for p in {sys.prefix, sys.base_prefix})


@pytest.fixture(scope="module", params=["eigen", "onednn"])
def test_core_exe(request):
    if request.param == "onednn" and not _onednn_available():
        pytest.skip("oneDNN 3.2 is not installed (pip install '.[onednn]'): the oneDNN variant needs it")
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed: the C++ tests need it")
    if not _eigen_available():
        pytest.skip("Eigen 3.4 not found (pip install cmeel-eigen): the C++ tests need it")
    parent = os.path.join(REPO, "build")
    try:
        os.makedirs(parent, exist_ok=True)
        build = tempfile.mkdtemp(prefix="cpptest-", dir=parent)
    except OSError:
        build = tempfile.mkdtemp(prefix="treadle-cpptest-")
    env = dict(os.environ, CCACHE_BASEDIR=REPO)
    configure = ["cmake", "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DTREADLE_BUILD_TESTS=ON",
                 "-DTREADLE_BUILD_PYTHON=OFF", f"-DPython_EXECUTABLE={sys.executable}",
                 f"-DTREADLE_WITH_ONEDNN={'ON' if request.param == 'onednn' else 'OFF'}"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    try:
        proc = _run(configure, env, 300)
        if proc.returncode != 0:
            if "Eigen" in proc.stdout + proc.stderr:
                pytest.skip("CMake did not find Eigen 3.4: " + (proc.stderr.strip().splitlines() or [""])[-1])
            pytest.fail("cmake configure failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
        targets = ["test_core", "test_verify", "test_replay", "test_backend_plugin", "treadle-verify"]
        proc = _run(["cmake", "--build", build, "--target", *targets, "-j",
                     str(min(2, os.cpu_count() or 1))], env, 900)
        assert proc.returncode == 0, "building the C++ tests failed:\n" + proc.stdout[-5000:] + proc.stderr[-5000:]
        exe = os.path.join(build, "cpp", "tests", "test_core")
        assert os.access(exe, os.X_OK), f"no executable at {exe}"
        yield exe
    finally:
        shutil.rmtree(build, ignore_errors=True)


def test_groups_are_the_ones_listed_here(test_core_exe):
    proc = _run([test_core_exe, "--list"], None, 30)
    assert proc.returncode == 0
    assert proc.stdout.split() == GROUPS


@pytest.mark.parametrize("group", GROUPS)
def test_cpp_group(test_core_exe, group):
    proc = _run([test_core_exe, group], None, 120)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"C++ test group {group} failed:\n{report}"
    assert "PASSED: 0 failure(s)" in report
    assert "ok  :" in report  # it checked something


def test_unknown_group_is_an_error(test_core_exe):
    proc = _run([test_core_exe, "no_such_group"], None, 30)
    assert proc.returncode == 2 and "unknown test group 'no_such_group'" in proc.stderr


def _sibling(test_core_exe, *path):
    """Another program of the same C++ build (test_verify, treadle-verify)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(test_core_exe))), *path)


def test_cpp_verify(test_core_exe):
    """treadle::verify from C++: passes here, covers every forward op, names a kernel made wrong."""
    proc = _run([_sibling(test_core_exe, "cpp", "tests", "test_verify")], None, 300)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "PASSED: 0 failure(s)" in report, report[-4000:]
    assert "a wrong eigen float32 linear gradient fails verify, named" in report


def test_treadle_verify_program(test_core_exe, tmp_path):
    exe = _sibling(test_core_exe, "cpp", "treadle-verify")
    out = tmp_path / "verify.json"
    proc = _run([exe, "--quick", "--json", str(out)], None, 300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "checks passed" in proc.stdout and "finite differences" in proc.stdout
    report = json.loads(out.read_text())
    assert report["failures"] == [] and report["quick"] and len(report["rows"]) > 100
    bad = _run([exe, "--ops", "nope"], None, 60)
    assert bad.returncode == 2 and "no case for ['nope']" in bad.stderr, bad.stderr


def test_cpp_replay(test_core_exe):
    """ReplayBuffer from C++: push and sample allocate nothing and start no thread, for every policy."""
    proc = _run([_sibling(test_core_exe, "cpp", "tests", "test_replay")], None, 120)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "PASSED: 0 failure(s)" in report, report[-4000:]
    assert report.count("allocated nothing") == 3


def test_cpp_backend_plugin(test_core_exe):
    """A stub backend defined outside the core registers at run time and runs its one kernel (float32 relu)
    when a plan is pinned to it, the reference taking what it does not (relu's backward, tanh), with the
    reference's results bitwise; taken and invalid names are refused."""
    proc = _run([_sibling(test_core_exe, "cpp", "tests", "test_backend_plugin")], None, 120)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "PASSED: 0 failure(s)" in report, report[-4000:]
    assert "0 relu [stub]" in report and "1 relu_backward [eigen]" in report, report
