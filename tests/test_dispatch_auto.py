"""Backend "auto": the measured dispatch table (parsing, lookup, plans that follow it, results equal to
the pinned backends') and the crossover study that writes it, in its quick mode."""
import json
import re

import numpy as np
import pytest

import treadle as tl

HAS_ONEDNN = "onednn" in tl.backends()
# Host plans: a device backend (cuda) is never in their priority order (docs/cuda.md).
HOST_BACKENDS = [b for b in tl.backends() if b != "cuda"]
from opcheck import BACKENDS  # noqa: E402 (every backend that can run here)


def rule(op="linear", start=0, backend="eigen", dtype="float32", measure="macs"):
    return {"op": op, "dtype": dtype, "measure": measure, "from": start, "backend": backend}


def table(*rules, **extra):
    return {"format": "treadle-dispatch-table", "version": 1, "conditions": {"note": "hand-written"},
            "rules": list(rules), **extra}


def write(tmp_path, content, name="table.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.fixture(autouse=True)
def clean_table(monkeypatch):
    """Every test starts and ends with no loaded table and no TREADLE_DISPATCH_TABLE."""
    monkeypatch.delenv("TREADLE_DISPATCH_TABLE", raising=False)
    tl.load_dispatch_table(None)
    yield
    tl.load_dispatch_table(None)


def plan_backends(model):
    """[(op, backend)] of every step of every compiled plan, from describe_plans."""
    return re.findall(r"^\d+ (\S+) \[(\w+)\]", model._compiled().describe_plans(), flags=re.M)


def linear_backend(model, x):
    model.set_backend("auto")  # drops earlier plans: describe_plans shows only this one
    model.predict(x)
    (backend,) = [b for op, b in plan_backends(model) if op == "linear"]
    return backend


# -- parsing ----------------------------------------------------------------------------------------
def test_missing_file_names_it(tmp_path):
    path = tmp_path / "nowhere.json"
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*cannot read"):
        tl.load_dispatch_table(path)


BAD_TABLES = {
    "not json": ("{ rules: ", "at byte"),
    "truncated": ('{"format": "treadle-dispatch-table", "version": 1, "rules": [', "at byte"),
    "not an object": ("[1, 2]", "expected a JSON object"),
    "no format": ({"version": 1, "rules": []}, "'format' must be"),
    "other format": (table(format="something-else"), "'format' must be"),
    "version": (table(version=2), "'version' must be 1, got 2"),
    "rules not a list": (table() | {"rules": {}}, "'rules' must be an array"),
    "unknown op": (table(rule(op="lnear")), "rule 0: unknown op 'lnear'"),
    "unknown backend": (table(rule(), rule(start=9, backend="onedn")), "rule 1: unknown backend 'onedn'"),
    "unknown dtype": (table(rule(dtype="float33")), "unknown dtype 'float33'"),
    "wrong measure": (table(rule(measure="elements")), "measured in macs, the rule says 'elements'"),
    "negative from": (table(rule(start=-1)), "'from' must be a non-negative integer"),
    "fractional from": (table(rule(start=1.5)), "'from' must be a non-negative integer"),
    "missing backend": (table({"op": "linear", "dtype": "float32", "measure": "macs", "from": 0}),
                        "'backend' must be a string"),
    "duplicate from": (table(rule(start=8), rule(start=8, backend="onednn")), "a second rule for linear float32 from 8"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_invalid_table_is_a_value_error_naming_the_file(tmp_path, case):
    content, message = BAD_TABLES[case]
    path = write(tmp_path, content)
    with pytest.raises(ValueError) as err:
        tl.load_dispatch_table(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_failed_load_keeps_the_table_in_use(tmp_path):
    good = write(tmp_path, table(rule(backend="onednn")), "good.json")
    tl.load_dispatch_table(good)
    with pytest.raises(ValueError):
        tl.load_dispatch_table(write(tmp_path, "{", "bad.json"))
    assert tl.dispatch_table_source() == f"{good} (loaded)"
    assert tl.dispatch_lookup("linear", "float32", 5) == "onednn"


def test_environment_variable_table_and_its_errors(tmp_path, monkeypatch):
    path = write(tmp_path, table(rule(op="tanh", measure="elements", backend="onednn")))
    monkeypatch.setenv("TREADLE_DISPATCH_TABLE", str(path))
    assert tl.dispatch_table_source() == f"{path} (TREADLE_DISPATCH_TABLE)"
    assert tl.dispatch_lookup("tanh", "float32", 10) == "onednn"
    bad = write(tmp_path, '{"format": 1}', "bad.json")
    monkeypatch.setenv("TREADLE_DISPATCH_TABLE", str(bad))
    model = tl.nn.Sequential(tl.nn.Linear(4, 4)).set_backend("auto")
    with pytest.raises(ValueError, match=re.escape(str(bad)) + ".*TREADLE_DISPATCH_TABLE"):
        model.predict(np.zeros((2, 4), np.float32))  # the table is read when the plan compiles
    # An explicitly loaded table wins over the environment.
    tl.load_dispatch_table(path)
    assert model.predict(np.zeros((2, 4), np.float32)).shape == (2, 4)


def test_shipped_table_is_the_default_and_records_its_conditions():
    path = tl.dispatch.default_table_path()
    assert path is not None, "the package ships dispatch_table.json"
    assert tl.dispatch_table_source() == f"{path} (default)"
    shipped = json.loads(open(path).read())
    for key in ("date", "machine", "treadle", "threads", "sweep"):
        assert key in shipped["conditions"]
    assert shipped["conditions"]["machine"]["cpu_model"]
    tl.load_dispatch_table(path)  # parses
    assert {r["op"] for r in shipped["rules"]} >= {"linear"}


def test_without_any_table_auto_is_the_priority_order():
    tl._core.set_default_dispatch_table("")  # what a C++ host without TREADLE_DISPATCH_TABLE has
    try:
        assert tl.dispatch_table_source() == "none"
        assert tl.dispatch_lookup("linear", "float32", 10**6) == ""
        model = tl.nn.Sequential(tl.nn.Linear(256, 256))
        assert linear_backend(model, np.ones((512, 256), np.float32)) == HOST_BACKENDS[0]
    finally:
        tl._core.set_default_dispatch_table(tl.dispatch.default_table_path())


# -- lookup and plans -------------------------------------------------------------------------------
def test_lookup_follows_the_ranges(tmp_path):
    tl.load_dispatch_table(write(tmp_path, table(rule(start=100), rule(start=1000, backend="onednn"),
                                                 rule(start=10**6, backend="cuda"),
                                                 rule(start=50, backend="onednn", dtype="float64"))))
    expect = [(99, ""), (100, "eigen"), (999, "eigen"), (1000, "onednn"), (10**6 - 1, "onednn"), (10**6, "cuda"),
              (10**12, "cuda")]
    for size, backend in expect:
        assert tl.dispatch_lookup("linear", "float32", size) == backend, size
    assert tl.dispatch_lookup("linear", "float64", 49) == "" and tl.dispatch_lookup("linear", "float64", 50) == "onednn"
    assert tl.dispatch_lookup("matmul", "float32", 10**6) == ""  # no rule for the op: priority order


def test_set_backend_auto_is_accepted_and_unknown_names_are_not():
    model = tl.nn.Sequential(tl.nn.Linear(3, 2))
    assert model.set_backend("auto")._compiled().backend == "auto"
    with pytest.raises(ValueError, match="unknown backend 'fast'"):
        model.set_backend("fast")


def test_auto_picks_per_size_as_the_table_says(tmp_path):
    """A table saying "onednn from 64 rows" for Linear(64, 64): oneDNN takes the big batches when it is
    built; the Eigen-only build runs everything on eigen. The cuda rule is passed over (not built)."""
    rows = 64
    tl.load_dispatch_table(write(tmp_path, table(rule(), rule(start=rows * 64 * 64, backend="onednn"),
                                                 rule(start=10**9, backend="cuda"))))
    model = tl.nn.Sequential(tl.nn.Linear(64, 64))
    for n in (8, 32, 63, 64, 200):
        want = "onednn" if HAS_ONEDNN and n >= rows else "eigen"
        assert linear_backend(model, np.ones((n, 64), np.float32)) == want, n
    assert linear_backend(model, np.ones((16384, 64), np.float32)) == ("onednn" if HAS_ONEDNN else "eigen")


@pytest.mark.skipif(not HAS_ONEDNN, reason="needs the oneDNN build")
def test_table_overrides_the_priority_order(tmp_path):
    x = np.ones((512, 256), np.float32)  # oneDNN takes this node in priority order
    model = tl.nn.Sequential(tl.nn.Linear(256, 256))
    model.set_backend("")
    model.predict(x)
    assert ("linear", "onednn") in plan_backends(model)
    tl.load_dispatch_table(write(tmp_path, table(rule(backend="eigen"))))
    assert linear_backend(model, x) == "eigen"
    # Plans compiled before a new table keep their kernels until set_backend("auto") recompiles.
    tl.load_dispatch_table(write(tmp_path, table(rule(backend="onednn")), "other.json"))
    model.predict(x)
    assert ("linear", "eigen") in plan_backends(model)
    assert linear_backend(model, x) == "onednn"


def test_no_rule_means_priority_order(tmp_path):
    tl.load_dispatch_table(write(tmp_path, table(rule(op="conv"))))
    model = tl.nn.Sequential(tl.nn.Linear(256, 256))
    assert linear_backend(model, np.ones((512, 256), np.float32)) == HOST_BACKENDS[0]


def test_run_op_accepts_auto(tmp_path):
    tl.load_dispatch_table(write(tmp_path, table(rule(), rule(start=2**20, backend="onednn"))))
    x, w, b = (np.ones(s, np.float32) for s in ((512, 256), (256, 256), (256,)))
    plan = tl._core.describe_op("linear", [x, w, b], {}, None, "auto", False)
    assert "[onednn]" in plan if HAS_ONEDNN else "[eigen]" in plan


# -- results under auto equal the pinned backends' ----------------------------------------------------
def mlp():
    return tl.nn.Sequential(tl.nn.Linear(96, 256), tl.nn.Tanh(), tl.nn.Linear(256, 256), tl.nn.ReLU(),
                            tl.nn.Linear(256, 10))


@pytest.mark.parametrize("source", ["shipped", "mixed"])
def test_auto_results_equal_pinned_within_float32_tolerance(tmp_path, source):
    if source == "mixed":  # alternate backends along the sizes so one plan mixes them
        tl.load_dispatch_table(write(tmp_path, table(rule(), rule(start=2**21, backend="onednn"),
                                                     rule(start=2**23, backend="eigen"),
                                                     rule(op="matmul", backend="onednn"))))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 96)).astype(np.float32)
    y = rng.standard_normal((128, 10)).astype(np.float32)
    models = {}
    for backend in ["auto"] + BACKENDS:
        m = mlp()
        if models:
            m.load_state_dict(next(iter(models.values())).state_dict())
        models[backend] = m.set_backend(backend)
    outs = {b: m.predict(x) for b, m in models.items()}
    for b, out in outs.items():
        np.testing.assert_allclose(out, outs["eigen"], rtol=1e-5, atol=1e-5, err_msg=b)
    losses = {}
    for b, m in models.items():
        trainer = tl.Trainer(m, tl.loss.MSE(), tl.optim.SGD(lr=1e-2))  # Adam would amplify roundoff of tiny gradients
        losses[b] = [trainer.step(x, y) for _ in range(3)]
    for b, ls in losses.items():
        np.testing.assert_allclose(ls, losses["eigen"], rtol=1e-5, err_msg=b)
    params = {b: m.state_dict() for b, m in models.items()}
    for name, ref in params["eigen"].items():
        np.testing.assert_allclose(params["auto"][name], ref, rtol=1e-4, atol=1e-6, err_msg=name)


# -- the study ----------------------------------------------------------------------------------------
def test_crossover_quick_runs_end_to_end(tmp_path, capsys):
    from treadle import bench

    out, path = tmp_path / "results", tmp_path / "mine.json"
    argv = ["crossover", "--quick", "--configs", "linear-32,linear-256,lstm-32", "--batches", "1,32",
            "--min-time", "0.005", "--out", str(out), "--write-table", str(path), "--quiet"]
    assert bench.main(argv) == 0
    summary = capsys.readouterr().out
    assert "Where each backend wins" in summary and "cuda**: unavailable" in summary
    result = json.loads((out / "latest-crossover.json").read_text())
    assert (out / "latest-crossover.md").read_text().strip() == summary.strip()
    assert result["backends"]["cuda"] == {"available": False, "device": "cuda", "transfers_included": True,
                                          "note": result["backends"]["cuda"]["note"]}
    assert [c["name"] for c in result["configs"]] == ["linear-32", "linear-256", "lstm-32"]
    for c in result["configs"]:
        assert [p["batch"] for p in c["points"]] == [1, 32]
        for p in c["points"]:
            for mode in ("infer", "train"):
                assert p[mode]["us"]["eigen"] > 0 and p[mode]["winner"] in tl.backends() + ["tie"]
                assert max(p[mode]["max_rel_diff"].values()) < 1e-4
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        assert len(list(out.glob("crossover-*/linear-32.png"))) == 1
    written = json.loads(path.read_text())
    assert written["conditions"]["sweep"] == "quick" and written["conditions"]["machine"]["cpu_model"]
    tl.load_dispatch_table(path)  # what the study writes, the core reads
    assert tl.dispatch_table_source() == f"{path} (loaded)"
    if HAS_ONEDNN:
        assert {r["op"] for r in written["rules"]} >= {"linear"}
