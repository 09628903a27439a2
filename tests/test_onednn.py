"""The oneDNN backend: every op it takes, cross-checked against Eigen (float32, fresh random inputs)
and the float64 reference; which nodes it takes; no threads (its OpenMP guard); results independent
of executor chunking and of concurrent contexts; primitives created at plan time only; the library
found without LD_LIBRARY_PATH. The whole op suite also runs on "onednn" through opcheck.BACKENDS.

Skipped when treadle was built without oneDNN (TREADLE_WITH_ONEDNN=OFF, the default wheel).
"""
import ctypes
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import treadle as tl
from opcheck import assert_close_f32, assert_concurrent_predictions_bitwise, backends_by_op, grads_for, run

pytestmark = pytest.mark.skipif("onednn" not in tl.backends(),
                                reason="treadle was built without oneDNN (TREADLE_WITH_ONEDNN=OFF)")

F32 = np.float32


def randn(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(F32)


# (id, op, input shapes, attrs, backward op that oneDNN also takes or None). Sizes cross the
# backend's tile boundaries with a remainder (products: 256 x 512 output tiles, narrower for a small
# output with a long sum; elementwise: 65536
# elements) and sit above its size thresholds (2^17 multiply-adds; 256 elements).
LINEAR = [("linear-bias", "linear", [(300, 70), (50, 70), (50,)], {}, "matmul"),
          ("linear-nobias", "linear", [(64, 48), (56, 48)], {}, "matmul"),
          ("linear-3d", "linear", [(4, 75, 33), (17, 33), (17,)], {}, "matmul"),
          ("linear-tiles", "linear", [(300, 20), (600, 20), (600,)], {}, "matmul"),
          # one 256 x 512 tile of output but a long sum: narrowed to two tiles (matmul_kernels.cpp)
          ("linear-narrowed", "linear", [(200, 1024), (300, 1024), (300,)], {}, "matmul")]
MATMUL = [(f"matmul-{ta}{tb}-{n}", "matmul", [((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))],
           {"trans_a": ta, "trans_b": tb}, "matmul")
          for ta in (0, 1) for tb in (0, 1)
          for (m, k, n) in [(300, 40, 70), (270, 9, 530), (200, 1024, 300),
                            # a stride of 1024 floats read in place (AVX2 kernels): B with 1024 columns,
                            # A^T with 1024 rows (padded copies), both packed (matmul_kernels.cpp)
                            (100, 40, 1024), (1024, 24, 128), (1024, 16, 1024)]]
BMM = [(f"bmm-{ta}{tb}", "bmm", [((b, k, m) if ta else (b, m, k)), ((b, n, k) if tb else (b, k, n))],
        {"trans_a": ta, "trans_b": tb}, "bmm")
       for ta in (0, 1) for tb in (0, 1) for (b, m, k, n) in [(37, 20, 24, 30)]]
ACTIVATIONS = [("elu", "elu", [(70000,)], {"alpha": 1.3}, "elu_backward"),
               ("silu", "silu", [(70000,)], {}, "silu_backward"),
               ("silu-2d", "silu", [(16, 16)], {}, "silu_backward")]
SOFTMAX = [("softmax-last", "softmax", [(300, 257)], {"axis": 1}, "softmax_backward"),
           ("softmax-3d-last", "softmax", [(4, 6, 20)], {"axis": -1}, "softmax_backward")]
SUPPORTED = LINEAR + MATMUL + BMM + ACTIVATIONS + SOFTMAX
IDS = [c[0] for c in SUPPORTED]


def inputs_for(shapes, rng):
    return [randn(rng, *s) for s in shapes]


@pytest.mark.parametrize("case", SUPPORTED, ids=IDS)
def test_matches_eigen_and_float64_reference(case):
    name, op, shapes, attrs, _ = case
    seed = int(np.random.SeedSequence().entropy % 2**63)  # fresh inputs on every run, named on failure
    rng = np.random.default_rng(seed)
    x = inputs_for(shapes, rng)
    gy = grads_for(op, x, attrs, rng)
    outs, grads = run(op, x, attrs, gy, "onednn")
    e_outs, e_grads = run(op, x, attrs, gy, "eigen")
    r_outs, r_grads = run(op, [a.astype(np.float64) for a in x], attrs, [g.astype(np.float64) for g in gy], "eigen")
    for got, eig, ref, what in zip(outs + grads, e_outs + e_grads, r_outs + r_grads,
                                   ["output"] + [f"gradient {i}" for i in range(len(grads))]):
        assert got.dtype == F32
        assert_close_f32(got, eig, f"{name} (seed {seed}): {what} vs Eigen float32")
        assert_close_f32(got, ref, f"{name} (seed {seed}): {what} vs the float64 reference")


def test_softmax_masked_and_large_logits_match_eigen():
    """Causal-mask rows (-inf entries give exact zeros) and logits far beyond exp's range."""
    rng = np.random.default_rng(5)
    x = randn(rng, 64, 64, scale=3.0)
    x[np.triu_indices(64, 1)] = -np.inf
    x[0] += F32(1e4)
    x[1] = F32(-1e4)  # a row of equal, hugely negative logits (unmasked)
    gy = [randn(rng, 64, 64)]
    assert backends_by_op(tl._core.describe_op("softmax", [x], {"axis": 1}, gy, "onednn"))["softmax"] == {"onednn"}
    (y,), (dx,) = run("softmax", [x], {"axis": 1}, gy, "onednn")
    (ye,), (dxe,) = run("softmax", [x], {"axis": 1}, gy, "eigen")
    masked = np.triu(np.ones((64, 64), bool), 1)
    masked[1] = False
    assert np.all(y[masked] == 0) and np.all(np.isfinite(y)) and np.all(np.isfinite(dx))
    assert_close_f32(y, ye, "softmax output")
    assert_close_f32(dx, dxe, "softmax gradient")


@pytest.mark.parametrize("case", SUPPORTED, ids=IDS)
def test_backend_takes_the_node_and_its_backward(case):
    name, op, shapes, attrs, backward = case
    rng = np.random.default_rng(0)
    x = inputs_for(shapes, rng)
    plan = tl._core.describe_op(op, x, attrs, grads_for(op, x, attrs, rng), "onednn")
    found = backends_by_op(plan)
    assert found[op] == {"onednn"}, plan
    if backward:
        assert found[backward] == {"onednn"}, plan
    else:  # plain arithmetic that Eigen runs at memory speed
        assert found[op + "_backward"] == {"eigen"}, plan


def test_automatic_dispatch_prefers_onednn_and_falls_back_to_eigen():
    assert tl.backends()[0] == "onednn" and tl.backends()[-1] == "eigen"
    rng = np.random.default_rng(0)
    x, w, b = randn(rng, 128, 64), randn(rng, 32, 64), randn(rng, 32)
    found = backends_by_op(tl._core.describe_op("linear", [x, w, b], {}, [randn(rng, 128, 32)], ""))
    assert found == {"linear": {"onednn"}, "matmul": {"onednn"}, "sum_to": {"eigen"}}


BIG = np.linspace(-3, 3, 4096, dtype=F32).reshape(64, 64)
UNSUPPORTED = {
    "f64": ("linear", [np.ones((300, 70)), np.ones((50, 70))], {}),        # float64: Eigen only
    "gelu": ("gelu", [BIG], {}),                                           # not accurate enough in oneDNN
    "softplus": ("softplus", [BIG], {}),
    "log_softmax": ("log_softmax", [BIG], {"axis": 1}),
    "relu": ("relu", [BIG], {}),                                           # no faster in oneDNN
    "leaky_relu": ("leaky_relu", [BIG], {"negative_slope": 0.1}),
    "softmax-axis0": ("softmax", [BIG], {"axis": 0}),                      # no optimised oneDNN kernel
    "linear-1row": ("linear", [np.ones((1, 512), F32), np.ones((512, 512), F32)], {}),  # Eigen's GEMV wins
    "linear-small": ("linear", [np.ones((32, 32), F32), np.ones((32, 32), F32)], {}),   # call overhead wins
    "tanh": ("tanh", [np.ones((300, 300), F32)], {}),                      # Eigen's is vectorised, and faster
    "sigmoid": ("sigmoid", [np.ones((300, 100), F32)], {}),                # Eigen's is vectorised too
    "add": ("add", [BIG, BIG], {}),                                        # no oneDNN kernel
    # A^T B with 2 output columns: Eigen's thin weight-gradient path streams A once (a PINN's first layer)
    "matmul-thin-wgrad": ("matmul", [np.ones((1024, 64), F32), np.ones((1024, 2), F32)], {"trans_a": 1}),
}


@pytest.mark.parametrize("op, inputs, attrs", list(UNSUPPORTED.values()), ids=list(UNSUPPORTED))
def test_unsupported_nodes_run_on_eigen(op, inputs, attrs):
    (y_pinned,), _ = run(op, inputs, attrs, None, "onednn")
    (y_eigen,), _ = run(op, inputs, attrs, None, "eigen")
    np.testing.assert_array_equal(y_pinned, y_eigen)
    assert backends_by_op(tl._core.describe_op(op, inputs, attrs, None, "onednn"), cpu_declines_as_onednn=False)[op] == {"eigen"}


@pytest.mark.parametrize("case", SUPPORTED, ids=IDS)
def test_results_do_not_depend_on_executor_chunking(case):
    name, op, shapes, attrs, _ = case
    rng = np.random.default_rng(1)
    x = inputs_for(shapes, rng)
    gy = grads_for(op, x, attrs, rng)
    serial = run(op, x, attrs, gy, "onednn")
    for workers in (2, 3, 7):
        chunked = tl._core.run_op(op, x, attrs, gy, "onednn", True, 0, workers)
        for a, b in zip(serial[0] + serial[1], chunked[0] + chunked[1]):
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: workers={workers}")


def _mlp(seed, widths=(40, 96, 96, 7), act="Tanh"):
    tl.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        if i:
            layers.append(getattr(tl.nn, act)())
        layers.append(tl.nn.Linear(a, b))
    return tl.nn.Sequential(*layers)


def test_training_plan_runs_linear_layers_on_onednn():
    rng = np.random.default_rng(0)
    net = _mlp(0)
    trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-3))
    trainer.step(randn(rng, 200, 40), rng.integers(0, 7, 200))
    found = backends_by_op(net._compiled().describe_plans())
    assert found["linear"] == {"onednn"} and found["matmul"] == {"onednn"}
    # tanh is fused into the linear before it (applied to each tile); its backward stays on Eigen
    assert "tanh" not in found and found["fused_activation"] == {"view"} and found["tanh_backward"] == {"eigen"}
    assert "+tanh" in net._compiled().describe_plans()


@pytest.mark.parametrize("act", ["tanh", "sigmoid"])
@pytest.mark.parametrize("shapes", [[(300, 70), (64, 70), (64,)], [(40, 1024), (600, 1024), (600,)]],
                         ids=["row-tiles", "column-tiles"])
def test_fused_tanh_and_sigmoid_are_the_eigen_activation_of_the_product(act, shapes):
    # oneDNN's tanh / sigmoid post-ops differ from Eigen's in the last bits and were ~5x slower on AVX2:
    # the backend applies the Eigen kernel's function to each tile it wrote, so the fused node is the
    # unfused pair bit for bit (widths that are multiples of 8: Eigen's vector blocks line up).
    rng = np.random.default_rng(3)
    x = [randn(rng, *s, scale=2.0) for s in shapes]
    x[1] /= F32(np.sqrt(shapes[1][1]))  # pre-activations of order 2: the activation's whole range
    describe = tl._core.describe_op("linear", x, {"activation": act}, None, "onednn")
    assert backends_by_op(describe)["linear"] == {"onednn"}, describe
    (fused,), _ = run("linear", x, {"activation": act}, None, "onednn")
    (pre,), _ = run("linear", x, {}, None, "onednn")
    (unfused,), _ = run(act, [pre], {}, None, "eigen")
    np.testing.assert_array_equal(fused, unfused)
    (ref,), _ = run("linear", [a.astype(np.float64) for a in x], {"activation": act}, None, "eigen")
    assert_close_f32(fused, ref, f"fused {act} vs the float64 reference")


def test_training_curve_matches_eigen():
    rng = np.random.default_rng(0)
    x, y = randn(rng, 256, 40), rng.integers(0, 7, 256)
    losses = {}
    for backend in ("onednn", "eigen"):
        net = _mlp(3)
        net.set_backend(backend)
        trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=3e-3))
        losses[backend] = [trainer.fit(x, y, epochs=1, batch_size=64, shuffle=False)["loss"][-1] for _ in range(20)]
        assert "[onednn]" in net._compiled().describe_plans() or backend == "eigen"
    np.testing.assert_allclose(losses["onednn"], losses["eigen"], rtol=1e-4)
    assert losses["onednn"][-1] < 0.7 * losses["onednn"][0]


def test_concurrent_predictions_on_shared_primitives_are_bitwise_serial():
    """Plans (and their primitives) are shared by threads with their own contexts."""
    rng = np.random.default_rng(2)
    net = _mlp(1, widths=(64, 256, 256, 10))
    net.set_backend("onednn")
    assert_concurrent_predictions_bitwise(net, [randn(rng, 300, 64) for _ in range(8)], repeats=5)


def test_training_on_a_host_pool_is_bitwise_serial():
    """The host's worker threads run oneDNN pieces concurrently; results equal the serial run."""
    import concurrent.futures

    rng = np.random.default_rng(4)
    x, y = randn(rng, 300, 64), rng.integers(0, 10, 300)
    weights = []
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        for executor in (None, tl.PoolExecutor(pool, 3)):
            net = _mlp(2, widths=(64, 600, 600, 10))
            trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-3), executor=executor)
            for _ in range(3):
                trainer.step(x, y)
            assert "[onednn]" in net._compiled().describe_plans()
            weights.append(net.flat_parameters().copy())
    np.testing.assert_array_equal(weights[0], weights[1])


def _subprocess(script, env_extra=None, drop=()):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


_TRAIN_AND_COUNT = """
    import json, os
    import numpy as np

    def count():
        return len(os.listdir("/proc/self/task"))

    start = count()
    import treadle as tl
    assert tl.backends()[0] == "onednn"
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(64, 256), tl.nn.ReLU(), tl.nn.Linear(256, 256), tl.nn.Tanh(),
                           tl.nn.Linear(256, 10), tl.nn.Softmax(dim=1))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 64)).astype(np.float32)
    y = rng.standard_normal((512, 10)).astype(np.float32)
    during = set()
    for i in range(20):
        trainer.step(x, y)
        during.add(count())
    for i in range(50):
        net.predict(x[: 1 + 10 * i])
        during.add(count())
    plans = net._compiled().describe_plans()
    print(json.dumps({"start": start, "during": sorted(during), "end": count(), "onednn": "[onednn]" in plans}))
"""


@pytest.mark.parametrize("omp_threads", [None, "4"])
def test_no_threads_started_with_onednn(omp_threads):
    """With OMP_NUM_THREADS=4 libgomp would start 3 workers on the first parallel region; the guard
    keeps every oneDNN call at one thread."""
    env = {"OMP_NUM_THREADS": omp_threads} if omp_threads else None
    drop = () if omp_threads else ("OMP_NUM_THREADS",)
    r = json.loads(_subprocess(_TRAIN_AND_COUNT, env, drop).strip().splitlines()[-1])
    assert r["onednn"]
    assert r["during"] == [r["start"]] and r["end"] == r["start"], r


def test_guard_restores_the_callers_openmp_thread_count():
    gomp = ctypes.CDLL("libgomp.so.1")  # the runtime libdnnl uses (same soname: same instance)
    previous = gomp.omp_get_max_threads()
    rng = np.random.default_rng(0)
    try:
        gomp.omp_set_num_threads(3)
        run("linear", [randn(rng, 300, 70), randn(rng, 50, 70)], {}, [randn(rng, 300, 50)], "onednn")
        assert gomp.omp_get_max_threads() == 3
    finally:
        gomp.omp_set_num_threads(previous)


def test_primitives_are_created_at_plan_time_only():
    script = """
        import numpy as np
        import treadle as tl
        tl.manual_seed(0)
        net = tl.nn.Sequential(tl.nn.Linear(32, 300), tl.nn.ReLU(), tl.nn.Linear(300, 5))
        trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.SGD(lr=0.1))
        rng = np.random.default_rng(0)
        x = rng.standard_normal((700, 32)).astype(np.float32)
        y = rng.integers(0, 5, 700)
        for i in range(4):
            print("STEP", i, flush=True)
            trainer.step(x, y)
    """
    out = _subprocess(script, {"ONEDNN_VERBOSE": "2"})  # 2: creation and execution
    sections = out.split("STEP ")
    creates = [s.count("onednn_verbose,create") for s in sections[1:]]
    execs = [s.count("onednn_verbose,exec") for s in sections[1:]]
    assert creates[0] > 0 and creates[1:] == [0, 0, 0], creates
    assert min(execs) > 0 and len(set(execs)) == 1, execs


def test_library_found_without_ld_library_path():
    out = _subprocess("""
        import numpy as np, treadle as tl
        (y,), _ = tl._core.run_op("relu", [np.array([-1.0, 2.0], np.float32)], {}, None, "onednn")
        print(tl.backends(), y.tolist())
    """, drop=("LD_LIBRARY_PATH",))
    assert out.strip().splitlines()[-1] == "['onednn', 'eigen'] [0.0, 2.0]"
