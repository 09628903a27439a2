"""The oneDNN backend's pooling and normalisation: layer_norm, group_norm, max_pool, avg_pool and
adaptive_avg_pool (where its windows are an avg_pool's), and the backward ops of all but max_pool.
Every node it takes is checked against Eigen float32 and the float64 reference on fresh random
inputs, for the op's exact outputs (max_pool's int64 indices included, ties and NaN as the
reference), bitwise on 1/2/3/7 workers; what it does not take (batch_norm, whose float32 statistics
oneDNN gets wrong on inputs with a large mean; max_pool_backward; rms_norm; small or float64
inputs; average pools whose divisor oneDNN defines otherwise; adaptive pools whose sizes do not
divide or whose windows are large) is checked to run on Eigen. A small CNN trains on oneDNN along
Eigen's curve.

Skipped when treadle was built without oneDNN (TREADLE_WITH_ONEDNN=OFF, the default wheel).
"""
import numpy as np
import pytest

import treadle as tl
from opcheck import assert_close_f32, assert_concurrent_predictions_bitwise, backends_by_op, grads_for, run

pytestmark = pytest.mark.skipif("onednn" not in tl.backends(),
                                reason="treadle was built without oneDNN (TREADLE_WITH_ONEDNN=OFF)")

F32 = np.float32


def pool_attrs(nd, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, **extra):
    a = {"kernel_size": [kernel_size] * nd, "stride": [stride or kernel_size] * nd, "padding": [padding] * nd,
         "ceil_mode": int(ceil_mode)}
    if dilation != 1:
        a["dilation"] = [dilation] * nd
    a.update({k: int(v) for k, v in extra.items()})
    return a


def ln_attrs(k):
    return {"normalized_ndim": k, "eps": 1e-5}


# (id, op, input shapes, attrs, mean of x, backward op oneDNN also takes or None). Sizes cross the
# piece boundaries (65536 elements) with a remainder where they can, and sit above the thresholds.
LAYER_NORM = [("ln-affine", "layer_norm", [(300, 257), (257,), (257,)], ln_attrs(1), 0.0, "layer_norm_backward"),
              ("ln-affine-mean100", "layer_norm", [(300, 257), (257,), (257,)], ln_attrs(1), 100.0,
               "layer_norm_backward"),
              ("ln-weight-2d", "layer_norm", [(8, 6, 40), (6, 40)], ln_attrs(2), 0.0, "layer_norm_backward"),
              ("ln-plain-mean100", "layer_norm", [(30, 40, 64)], ln_attrs(1), 100.0, "layer_norm_backward"),
              ("ln-many-rows", "layer_norm", [(2000, 70), (70,), (70,)], ln_attrs(1), 0.0, "layer_norm_backward")]
MAX_POOL = [("max-2x2", "max_pool", [(8, 16, 28, 28)], pool_attrs(2, 2), 0.0, None),
            ("max-3x3-s2-p1", "max_pool", [(8, 16, 28, 28)], pool_attrs(2, 3, 2, 1), 0.0, None),
            ("max-ceil", "max_pool", [(8, 16, 27, 27)], pool_attrs(2, 3, 2, 1, ceil_mode=True), 0.0, None),
            ("max-pieces", "max_pool", [(40, 16, 20, 20)], pool_attrs(2, 2), 0.0, None),
            ("max-1d-ceil", "max_pool", [(4, 8, 300)], pool_attrs(1, 4, 3, 2, ceil_mode=True), 0.0, None),
            ("max-3d", "max_pool", [(2, 4, 10, 12, 11)], pool_attrs(3, 3, 2, 1), 0.0, None)]
AVG_POOL = [("avg-2x2", "avg_pool", [(8, 16, 28, 28)], pool_attrs(2, 2), 0.0, "avg_pool_backward"),
            ("avg-3x3-include", "avg_pool", [(8, 16, 28, 28)], pool_attrs(2, 3, 2, 1), 0.0, "avg_pool_backward"),
            ("avg-ceil-exclude", "avg_pool", [(8, 16, 28, 28)],
             pool_attrs(2, 3, 2, 1, ceil_mode=True, count_include_pad=False), 0.0, "avg_pool_backward"),
            ("avg-pieces", "avg_pool", [(40, 16, 20, 20)], pool_attrs(2, 3, 1, 1), 0.0, "avg_pool_backward"),
            ("avg-1d-exclude", "avg_pool", [(4, 8, 300)],
             pool_attrs(1, 4, 3, 2, ceil_mode=True, count_include_pad=False), 0.0, "avg_pool_backward"),
            ("avg-3d", "avg_pool", [(2, 4, 10, 12, 11)], pool_attrs(3, 3, 2, 1, count_include_pad=False), 0.0,
             "avg_pool_backward")]
GN = {"num_groups": 8, "eps": 1e-5}
GROUP_NORM = [("gn-affine", "group_norm", [(8, 64, 14, 14), (64,), (64,)], GN, 0.0, "group_norm_backward"),
              ("gn-affine-mean100", "group_norm", [(8, 64, 14, 14), (64,), (64,)], GN, 100.0, "group_norm_backward"),
              ("gn-plain-1d", "group_norm", [(4, 6, 50)], {"num_groups": 3, "eps": 1e-5}, 0.0, "group_norm_backward"),
              ("gn-pieces", "group_norm", [(40, 32, 8, 8), (32,), (32,)], {"num_groups": 32, "eps": 1e-5}, 0.0,
               "group_norm_backward"),
              ("gn-3d", "group_norm", [(2, 4, 10, 12, 11), (4,), (4,)], {"num_groups": 2, "eps": 1e-5}, 0.0,
               "group_norm_backward")]
ADAPTIVE = [("adaptive-global", "adaptive_avg_pool", [(32, 64, 7, 7)], {"output_size": [1, 1]}, 0.0,
             "adaptive_avg_pool_backward"),
            ("adaptive-14-7", "adaptive_avg_pool", [(8, 16, 14, 14)], {"output_size": [7, 7]}, 0.0,
             "adaptive_avg_pool_backward"),
            ("adaptive-1d", "adaptive_avg_pool", [(4, 8, 300)], {"output_size": [30]}, 0.0,
             "adaptive_avg_pool_backward"),
            ("adaptive-3d", "adaptive_avg_pool", [(2, 4, 8, 12, 10)], {"output_size": [4, 3, 5]}, 0.0,
             "adaptive_avg_pool_backward")]
SUPPORTED = LAYER_NORM + GROUP_NORM + MAX_POOL + AVG_POOL + ADAPTIVE
IDS = [c[0] for c in SUPPORTED]


def inputs_for(shapes, mean, rng):
    x = (mean + rng.standard_normal(shapes[0])).astype(F32)
    return [x] + [(1 + 0.2 * rng.standard_normal(s)).astype(F32) for s in shapes[1:]]


def as_f64(arrays):
    return [a if a is None else a.astype(np.float64) for a in arrays]


@pytest.mark.parametrize("case", SUPPORTED, ids=IDS)
def test_matches_eigen_and_float64_reference(case):
    name, op, shapes, attrs, mean, _ = case
    seed = int(np.random.SeedSequence().entropy % 2**63)  # fresh inputs on every run, named on failure
    rng = np.random.default_rng(seed)
    x = inputs_for(shapes, mean, rng)
    gy = grads_for(op, x, attrs, rng)
    # all_kernels: oneDNN's kernel also where this CPU's instruction set makes Eigen the faster choice
    outs, grads, plan = tl._core.run_op(op, x, attrs, gy, "onednn", all_kernels=True, return_plan=True)
    assert backends_by_op(plan, cpu_declines_as_onednn=False)[op] == {"onednn"}, plan
    e_outs, e_grads = run(op, x, attrs, gy, "eigen")
    r_outs, r_grads = run(op, as_f64(x), attrs, as_f64(gy), "eigen")
    labels = [f"output {i}" for i in range(len(outs))] + [f"gradient {i}" for i in range(len(grads))]
    for got, eig, ref, what in zip(outs + grads, e_outs + e_grads, r_outs + r_grads, labels):
        if got is None:
            continue
        if got.dtype == np.int64:  # max_pool's argmax: exactly the reference's
            np.testing.assert_array_equal(got, eig, err_msg=f"{name} (seed {seed}): {what}")
            np.testing.assert_array_equal(got, ref, err_msg=f"{name} (seed {seed}): {what}")
            continue
        assert got.dtype == F32
        assert_close_f32(got, eig, f"{name} (seed {seed}): {what} vs Eigen float32")
        assert_close_f32(got, ref, f"{name} (seed {seed}): {what} vs the float64 reference")


@pytest.mark.parametrize("case", SUPPORTED, ids=IDS)
def test_backend_takes_the_node_and_its_backward(case):
    name, op, shapes, attrs, mean, backward = case
    rng = np.random.default_rng(0)
    x = inputs_for(shapes, mean, rng)
    found = backends_by_op(tl._core.describe_op(op, x, attrs, grads_for(op, x, attrs, rng), "onednn"))
    assert found[op] == {"onednn"}, found
    assert found[backward or op + "_backward"] == {"onednn" if backward else "eigen"}, found


@pytest.mark.parametrize("case", SUPPORTED, ids=IDS)
def test_results_do_not_depend_on_executor_chunking(case):
    name, op, shapes, attrs, mean, _ = case
    rng = np.random.default_rng(1)
    x = inputs_for(shapes, mean, rng)
    gy = grads_for(op, x, attrs, rng)
    serial = run(op, x, attrs, gy, "onednn", all_kernels=True)
    for workers in (2, 3, 7):
        chunked = tl._core.run_op(op, x, attrs, gy, "onednn", True, 0, workers, all_kernels=True)
        for a, b in zip(serial[0] + serial[1], chunked[0] + chunked[1]):
            if a is not None:
                np.testing.assert_array_equal(a, b, err_msg=f"{name}: workers={workers}")


@pytest.mark.parametrize("opts", [pool_attrs(2, 2), pool_attrs(2, 3, 1, 1), pool_attrs(2, 3, 2, 1, ceil_mode=True)],
                         ids=["2x2", "3x3-s1-p1", "3x3-ceil"])
def test_max_pool_ties_nan_and_neg_inf_follow_the_reference(opts):
    """Ties pick the first maximum in scan order; a NaN wins its window; -inf windows keep an index."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, size=(8, 16, 25, 25)).astype(F32)  # many ties
    clean = x.copy()
    x[0, 0, 1, 1] = np.nan
    x[5, 3, 6, 6:8] = np.nan  # two NaNs in one window
    x[3, 2, :4, :4] = -np.inf
    for data in (clean, x):
        (y, idx), _, plan = tl._core.run_op("max_pool", [data], opts, None, "onednn", all_kernels=True,
                                            return_plan=True)
        assert backends_by_op(plan, cpu_declines_as_onednn=False)["max_pool"] == {"onednn"}, plan
        (ye, idxe), _ = run("max_pool", [data], opts, None, "eigen")
        np.testing.assert_array_equal(y, ye)
        np.testing.assert_array_equal(idx, idxe)
        for workers in (2, 7):
            (yw, idxw), _ = tl._core.run_op("max_pool", [data], opts, None, "onednn", True, 0, workers,
                                            all_kernels=True)
            np.testing.assert_array_equal(yw, y)
            np.testing.assert_array_equal(idxw, idx)


def test_layer_norm_with_a_large_mean_meets_the_contract():
    """Rows of N(1000, 1): oneDNN's float32 mean is within an ulp or two of the true one."""
    rng = np.random.default_rng(7)
    x = (1000 + rng.standard_normal((256, 512))).astype(F32)
    attrs = ln_attrs(1)
    (y, mean, rstd), _ = run("layer_norm", [x], attrs, None, "onednn")
    (yr, meanr, rstdr), _ = run("layer_norm", [x.astype(np.float64)], attrs, None, "eigen")
    assert_close_f32(mean, meanr, "mean")
    assert_close_f32(rstd, rstdr, "rstd")
    # y's error is the float32 rounding of the mean (ulp 6e-5 at 1000) times rstd ~ 1: the contract's
    # 1e-5 of scale holds up to means of about 100 standard deviations; here it is 1e-4 of scale.
    np.testing.assert_allclose(y, yr, atol=1e-4 * np.abs(yr).max())


BN_X = (100 + np.random.default_rng(0).standard_normal((32, 64, 14, 14))).astype(F32)
UNSUPPORTED = {
    "batch_norm-mean100": ("batch_norm", [BN_X, np.ones(64, F32), np.zeros(64, F32)], {"eps": 1e-5}),
    "batch_norm_eval": ("batch_norm_eval", [BN_X, np.full(64, 100, F32), np.ones(64, F32)], {"eps": 1e-5}),
    "group_norm-small": ("group_norm", [np.ones((1, 8, 8, 8), F32)], {"num_groups": 4, "eps": 1e-5}),
    "rms_norm": ("rms_norm", [BN_X], {"normalized_ndim": 2, "eps": 1e-5}),
    "layer_norm-small": ("layer_norm", [np.ones((8, 64), F32)], ln_attrs(1)),
    # rows of 65536: one row per piece, the partial weight gradients would take twice the input
    "layer_norm_backward-wide": ("layer_norm_backward", [np.ones((64, 65536), F32), np.ones((64, 65536), F32),
                                                         np.zeros(64, F32), np.ones(64, F32), np.ones(65536, F32)],
                                 {"normalized_ndim": 1}),
    "layer_norm-f64": ("layer_norm", [np.ones((300, 257))], ln_attrs(1)),
    "max_pool-small": ("max_pool", [np.ones((2, 4, 8, 8), F32)], pool_attrs(2, 2)),
    "avg_pool-small": ("avg_pool", [np.ones((1, 4, 8, 8), F32)], pool_attrs(2, 2)),
    "max_pool-2x2-large": ("max_pool", [np.ones((8, 64, 56, 56), F32)], pool_attrs(2, 2)),  # Eigen is as fast
    "max_pool-dilated": ("max_pool", [BN_X], pool_attrs(2, 3, 1, 1, dilation=2)),  # oneDNN: reference only
    "avg_pool-divisor": ("avg_pool", [BN_X], pool_attrs(2, 3, 2, 1, divisor_override=5)),
    # ceil mode makes the last window reach past the padding: PyTorch clips that divisor, oneDNN does not
    "avg_pool-ceil-include": ("avg_pool", [BN_X], pool_attrs(2, 3, 2, 1, ceil_mode=True)),
    "adaptive_avg_pool": ("adaptive_avg_pool", [BN_X], {"output_size": [5, 5]}),  # 14 is no multiple of 5
    "adaptive_avg_pool-global-28": ("adaptive_avg_pool", [np.ones((8, 64, 28, 28), F32)], {"output_size": [1, 1]}),
}


@pytest.mark.parametrize("op, inputs, attrs", list(UNSUPPORTED.values()), ids=list(UNSUPPORTED))
def test_unsupported_nodes_run_on_eigen(op, inputs, attrs):
    outs, _ = run(op, inputs, attrs, None, "onednn")
    e_outs, _ = run(op, inputs, attrs, None, "eigen")
    for a, b in zip(outs, e_outs):
        np.testing.assert_array_equal(a, b)
    assert backends_by_op(tl._core.describe_op(op, inputs, attrs, None, "onednn"), cpu_declines_as_onednn=False)[op] == {"eigen"}


def test_max_pool_backward_stays_on_eigen():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16, 28, 28)).astype(F32)
    found = backends_by_op(tl._core.describe_op("max_pool", [x], pool_attrs(2, 2), grads_for(
        "max_pool", [x], pool_attrs(2, 2), rng), "onednn"))
    assert found == {"max_pool": {"onednn"}, "max_pool_backward": {"eigen"}}


def _cnn(seed):
    tl.manual_seed(seed)
    return tl.nn.Sequential(tl.nn.Conv2d(1, 8, 3, padding=1), tl.nn.GroupNorm(4, 8), tl.nn.ReLU(),
                            tl.nn.MaxPool2d(2), tl.nn.Conv2d(8, 8, 3, padding=1), tl.nn.AvgPool2d(2), tl.nn.Flatten(),
                            tl.nn.LayerNorm(8 * 7 * 7), tl.nn.Linear(8 * 7 * 7, 5))


def test_training_curve_matches_eigen():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((128, 1, 28, 28)).astype(F32), rng.integers(0, 5, 128)
    losses = {}
    for backend in ("onednn", "eigen"):
        net = _cnn(3)
        net.set_backend(backend)
        trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=3e-3))
        losses[backend] = [trainer.fit(x, y, epochs=1, batch_size=32, shuffle=False)["loss"][-1] for _ in range(8)]
        if backend == "onednn":
            found = backends_by_op(net._compiled().describe_plans())
            for op in ("max_pool", "avg_pool", "avg_pool_backward", "layer_norm", "layer_norm_backward", "group_norm",
                       "group_norm_backward"):
                assert found[op] == {"onednn"}, (op, found)
    np.testing.assert_allclose(losses["onednn"], losses["eigen"], rtol=1e-4)
    assert losses["onednn"][-1] < 0.7 * losses["onednn"][0]


def test_concurrent_predictions_on_shared_primitives_are_bitwise_serial():
    """Plans (primitives, max_pool's index tables) are shared by threads with their own contexts."""
    rng = np.random.default_rng(2)
    net = _cnn(1)
    net.set_backend("onednn")
    assert_concurrent_predictions_bitwise(net, [rng.standard_normal((40, 1, 28, 28)).astype(F32) for _ in range(6)])
    found = backends_by_op(net._compiled().describe_plans())
    assert found["max_pool"] == {"onednn"} and found["layer_norm"] == {"onednn"}


def test_training_on_a_host_pool_is_bitwise_serial():
    """The host's worker threads run pieces concurrently (sharing scratchpads within a range of
    pieces only); the weights equal those of the serial run."""
    import concurrent.futures

    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((64, 1, 28, 28)).astype(F32), rng.integers(0, 5, 64)
    weights = []
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        for executor in (None, tl.PoolExecutor(pool, 3)):
            net = _cnn(2)
            trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-3), executor=executor)
            for _ in range(3):
                trainer.step(x, y)
            assert backends_by_op(net._compiled().describe_plans())["avg_pool_backward"] == {"onednn"}
            weights.append(net.flat_parameters().copy())
    np.testing.assert_array_equal(weights[0], weights[1])


def test_primitives_created_at_plan_time_and_no_threads_started():
    """Under ONEDNN_VERBOSE=2 every creation happens in the first step (the plan's), and with
    OMP_NUM_THREADS=4 the process still has the threads it started with (the OpenMP guard)."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import numpy as np
        import treadle as tl

        def threads():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))

        before = threads()
        tl.manual_seed(0)
        net = tl.nn.Sequential(tl.nn.Conv2d(1, 8, 3, padding=1), tl.nn.MaxPool2d(3, 2, 1), tl.nn.AvgPool2d(2),
                               tl.nn.AdaptiveAvgPool2d(1), tl.nn.Flatten(), tl.nn.LayerNorm(8), tl.nn.Linear(8, 5))
        trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.SGD(lr=0.1))
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((200, 1, 28, 28)).astype(np.float32), rng.integers(0, 5, 200)
        for i in range(4):
            print("STEP", i, flush=True)
            trainer.step(x, y)
        print("THREADS", before, threads(), flush=True)
    """)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__)))
    env = dict(os.environ, ONEDNN_VERBOSE="2", OMP_NUM_THREADS="4")
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sections = proc.stdout.split("STEP ")[1:]
    creates = [s.count("onednn_verbose,create") for s in sections]
    execs = [s.count("onednn_verbose,exec") for s in sections]
    assert creates[0] > 0 and creates[1:] == [0, 0, 0], creates
    assert min(execs) > 0 and len(set(execs)) == 1, execs
    for kind in ("pooling", "layer_normalization"):
        assert f"exec,cpu,{kind}" in sections[-1], kind
    before, after = (int(v) for v in proc.stdout.split("THREADS")[1].split())
    assert after == before


def test_benchmark_script_runs(tmp_path):
    """bench/onednn_norm_pool.py on one small case: a JSON and a markdown table with both backends."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "onednn_norm_pool.py"
    spec = importlib.util.spec_from_file_location("onednn_norm_pool", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--filter", "layer_norm 16x64", "--rounds", "1", "--round-seconds", "0.005", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "latest-onednn-norm-pool.json").read_text())["rows"]
    assert {r["op"] for r in rows} == {"layer_norm", "layer_norm_backward"}
    assert all(r["onednn_backend"] == "onednn" and r["eigen_us"] > 0 for r in rows)
    assert "| layer_norm 16x64 |" in (tmp_path / "latest-onednn-norm-pool.md").read_text()
