"""oneDNN convolutions in blocked layouts: every convolution op the backend takes (forward with
fused bias, backward data = transposed convolution, backward weights), cross-checked against Eigen
float32 and the float64 reference on fresh random inputs; which nodes it takes and which it leaves
to Eigen; results bitwise independent of the number of workers and of concurrent contexts; a CNN's
training curve equal to Eigen's. The parameterised op suite (tests/test_conv.py) also runs on
"onednn" through opcheck.BACKENDS.

Skipped when treadle was built without oneDNN (TREADLE_WITH_ONEDNN=OFF, the default wheel).
"""
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
GRADS = ("conv_backward_data", "conv_backward_weight")


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


# (id, op, input shapes, attrs, {op: backend} expected in the forward + backward plan). Batches are
# not multiples of the backend's piece size (a remainder piece), and the weight gradient of most
# cases is summed over several pieces.
CASES = [
    ("2d-bias", "conv", [(7, 32, 14, 14), (64, 32, 3, 3), (64,)], {"padding": [1]}, None),
    # one input channel: the forward ties with Eigen, the data gradient is slower blocked
    ("2d-first-layer", "conv", [(9, 1, 28, 28), (32, 1, 3, 3), (32,)], {"padding": [1]},
     {"conv": "eigen", "conv_backward_data": "eigen"}),
    ("2d-2-channels", "conv", [(9, 2, 28, 28), (16, 2, 3, 3), (16,)], {"padding": [1]},
     {"conv_backward_data": "eigen"}),
    ("2d-rgb", "conv", [(5, 3, 20, 20), (16, 3, 3, 3), (16,)], {"padding": [1]}, {"conv_backward_data": "eigen"}),
    # 4 input channels: oneDNN's weight gradient falls back to a slower AVX2 kernel
    ("2d-4-channels", "conv", [(6, 4, 16, 16), (16, 4, 3, 3)], {"padding": [1]},
     {"conv_backward_data": "eigen", "conv_backward_weight": "eigen"}),
    # 20 pieces of 2 images in 16 slots: slots run several pieces
    ("2d-many-pieces", "conv", [(40, 32, 14, 14), (64, 32, 3, 3), (64,)], {"padding": [1]}, None),
    ("2d-small", "conv", [(2, 16, 8, 8), (16, 16, 3, 3)], {"padding": [1]}, None),
    ("2d-tiny", "conv", [(2, 4, 6, 6), (4, 4, 3, 3)], {"padding": [1]},
     {"conv": "eigen", "conv_backward_data": "eigen", "conv_backward_weight": "eigen"}),
    ("2d-stride-dilation-asym", "conv", [(5, 16, 21, 18), (32, 16, 3, 3)],
     {"stride": [2, 1], "dilation": [2], "padding": [2, 1], "padding_end": [1, 2]},
     # oneDNN 3.2 has only im2col + GEMM for the gradients of a strided, dilated convolution: Eigen
     # runs them, and the plan names that decline (backends_by_op counts it as the rule's oneDNN)
     None),
    # pointwise: one GEMM for Eigen in the forward direction
    ("2d-1x1", "conv", [(6, 64, 14, 14), (64, 64, 1, 1), (64,)], {}, {"conv": "eigen"}),
    ("2d-depthwise", "conv", [(5, 32, 14, 14), (32, 1, 3, 3)], {"padding": [1], "groups": 32}, None),
    ("2d-groups", "conv", [(5, 32, 12, 12), (64, 8, 3, 3), (64,)], {"padding": [1], "groups": 4}, None),
    ("1d", "conv", [(6, 16, 100), (32, 16, 5), (32,)], {"padding": [2], "stride": [2]}, None),
    ("1d-same", "conv", [(11, 64, 64), (64, 64, 3)], {"padding": [1]}, None),
    ("3d", "conv", [(3, 16, 6, 10, 10), (16, 16, 3, 3, 3), (16,)], {"padding": [1]}, None),
    ("transpose2d-bias", "conv_backward_data", [(6, 32, 10, 10), (32, 16, 4, 4), (16,)],
     {"stride": [2], "padding": [1], "input_size": [20, 20]}, None),
    ("transpose1d", "conv_backward_data", [(5, 32, 40), (32, 16, 3)],
     {"stride": [2], "padding": [1], "padding_end": [0], "input_size": [80]}, None),
] + [  # an activation fused into the convolution when a plan is compiled: an eltwise post-op
    (f"2d-fused-{act}", "conv", [(7, 16, 12, 12), (32, 16, 3, 3), (32,)], {"padding": [1], "activation": act}, None)
    for act in ("relu", "tanh", "sigmoid")
]
IDS = [c[0] for c in CASES]


def inputs_for(shapes, rng, attrs=None):
    """N(0, 1) inputs; with a fused activation the weights are scaled by 1/sqrt(fan-in), as layers
    initialise them: tanh and sigmoid outputs are O(1) whatever their input, so float32 rounding of
    an O(10) pre-activation would exceed the 1e-5 of the output's scale in Eigen as well."""
    xs = [randn(rng, *s) for s in shapes]
    if attrs and "activation" in attrs:
        xs[1] /= F32(np.sqrt(np.prod(shapes[1][1:])))
    return xs


def away_from_the_relu_kink(op, x, attrs, gy):
    """With a fused relu, an output whose pre-activation lies within float32 rounding of zero may be
    masked by one backend and not the other (a whole window of input gradients then differs by
    O(w * dy), about 5% of random draws here). Its upstream gradient is zeroed, so either choice
    gives the same gradients; everything else is compared as usual."""
    if attrs.get("activation") != "relu":
        return gy
    plain = {k: v for k, v in attrs.items() if k != "activation"}
    (z,), _ = run(op, [a.astype(np.float64) for a in x], plain, None, "eigen")
    return [np.where(np.abs(z) < 1e-4 * max(1.0, np.abs(z).max()), F32(0), gy[0]).astype(F32)]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_eigen_and_float64_reference(case):
    name, op, shapes, attrs, _ = case
    seed = int(np.random.SeedSequence().entropy % 2**63)  # fresh inputs on every run, named on failure
    rng = np.random.default_rng(seed)
    x = inputs_for(shapes, rng, attrs)
    gy = away_from_the_relu_kink(op, x, attrs, grads_for(op, x, attrs, rng))
    # all_kernels: oneDNN also runs the nodes it declines for speed (small, or on this CPU), so its
    # kernels are checked on every CPU
    outs, grads = run(op, x, attrs, gy, "onednn", all_kernels=True)
    e_outs, e_grads = run(op, x, attrs, gy, "eigen")
    r_outs, r_grads = run(op, [a.astype(np.float64) for a in x], attrs, [g.astype(np.float64) for g in gy], "eigen")
    for got, eig, ref, what in zip(outs + grads, e_outs + e_grads, r_outs + r_grads,
                                   ["output"] + [f"gradient {i}" for i in range(len(grads))]):
        assert got.dtype == F32
        assert_close_f32(got, eig, f"{name} (seed {seed}): {what} vs Eigen float32")
        assert_close_f32(got, ref, f"{name} (seed {seed}): {what} vs the float64 reference")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backend_takes_the_convolution_and_its_gradients(case):
    name, op, shapes, attrs, expected = case
    rng = np.random.default_rng(0)
    x = inputs_for(shapes, rng, attrs)
    plan = tl._core.describe_op(op, x, attrs, grads_for(op, x, attrs, rng), "onednn")
    found = backends_by_op(plan)
    for conv_op in ("conv",) + GRADS:
        want = (expected or {}).get(conv_op, "onednn")
        assert found[conv_op] == {want}, f"{name}: {conv_op}\n{plan}"
    if len(shapes) == 3:  # the bias gradient is a reduction at memory speed
        assert found["conv_backward_bias"] == {"eigen"}, plan


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_results_do_not_depend_on_the_workers(case):
    name, op, shapes, attrs, _ = case
    rng = np.random.default_rng(1)
    x = inputs_for(shapes, rng, attrs)
    gy = grads_for(op, x, attrs, rng)
    serial = run(op, x, attrs, gy, "onednn", all_kernels=True)
    for workers in (2, 3, 7):
        chunked = tl._core.run_op(op, x, attrs, gy, "onednn", True, 0, workers, all_kernels=True)
        for a, b in zip(serial[0] + serial[1], chunked[0] + chunked[1]):
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: workers={workers}")


def bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), as float64."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(F32).astype(np.float64)


BF16_CASES = [c for c in CASES if c[0] in ("2d-bias", "2d-depthwise", "1d", "3d", "transpose2d-bias")] + [
    # a grouped weight gradient: whether oneDNN has a bf16 direct kernel for it depends on the CPU
    # (AMX: yes; AVX512_CORE_BF16: no); the plan then names the decline
    ("2d-groups", "conv", [(5, 32, 12, 12), (64, 8, 3, 3), (64,)], {"padding": [1], "groups": 4}, None)]


@pytest.mark.parametrize("case", BF16_CASES, ids=[c[0] for c in BF16_CASES])
def test_bf16_compute_matches_the_rounded_reference(case):
    """precision="bf16": oneDNN's reorders round the operands to bf16 into the blocked layout and its
    bf16 kernels accumulate in float32; the reference multiplies the rounded operands in float64."""
    name, op, shapes, attrs, expected = case
    attrs = dict(attrs, precision="bf16")
    seed = int(np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    x = inputs_for(shapes, rng, attrs)
    gy = grads_for(op, x, attrs, rng)
    found = backends_by_op(tl._core.describe_op(op, x, attrs, gy, "onednn"))
    for conv_op in ("conv",) + GRADS:
        assert found[conv_op] == {(expected or {}).get(conv_op, "onednn")}, f"{name}: {conv_op}"
    outs, grads = run(op, x, attrs, gy, "onednn")
    e_outs, e_grads = run(op, x, attrs, gy, "eigen")
    rounded = [bf16(a) if i < 2 else a.astype(np.float64) for i, a in enumerate(x)]
    r_outs, r_grads = run(op, rounded, {k: v for k, v in attrs.items() if k != "precision"}, [bf16(gy[0])], "eigen")
    for got, eig, ref, what in zip(outs + grads, e_outs + e_grads, r_outs + r_grads,
                                   ["output"] + [f"gradient {i}" for i in range(len(grads))]):
        if what == "gradient 2":  # a bias gradient sums the float32 upstream gradient, unrounded
            continue
        assert_close_f32(got, eig, f"{name} (seed {seed}): {what} vs Eigen bf16")
        assert_close_f32(got, ref, f"{name} (seed {seed}): {what} vs float64 on bf16-rounded operands")
    for workers in (2, 3, 7):
        chunked = tl._core.run_op(op, x, attrs, gy, "onednn", True, 0, workers)
        for a, b in zip(outs + grads, chunked[0] + chunked[1]):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} bf16: workers={workers}")


DECLINED = [
    # a transposed convolution whose output_padding >= stride: negative end padding in the forward view
    ("negative-end-padding", "conv_backward_data", [(4, 32, 10, 10), (32, 16, 3, 3)],
     {"stride": [2], "padding": [0], "padding_end": [-2], "input_size": [23, 23]}),
    ("float64", "conv", [(7, 32, 14, 14), (64, 32, 3, 3)], {"padding": [1]}),
]


@pytest.mark.parametrize("case", DECLINED, ids=[c[0] for c in DECLINED])
def test_declined_nodes_run_on_eigen(case):
    name, op, shapes, attrs = case
    rng = np.random.default_rng(2)
    x = inputs_for(shapes, rng, attrs)
    if name == "float64":
        x = [a.astype(np.float64) for a in x]
    assert backends_by_op(tl._core.describe_op(op, x, attrs, None, "onednn"))[op] == {"eigen"}
    (y,), _ = run(op, x, attrs, None, "onednn")
    (y_eigen,), _ = run(op, x, attrs, None, "eigen")
    np.testing.assert_array_equal(y, y_eigen)


def _cnn(seed):
    tl.manual_seed(seed)
    nn = tl.nn
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def test_cnn_training_curve_matches_eigen():
    rng = np.random.default_rng(0)
    x, y = randn(rng, 96, 1, 28, 28), rng.integers(0, 10, 96)
    losses = {}
    for backend in ("onednn", "eigen"):
        net = _cnn(3)
        net.set_backend(backend)
        trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=2e-3))
        losses[backend] = [trainer.fit(x, y, epochs=1, batch_size=32, shuffle=False)["loss"][-1] for _ in range(8)]
        if backend == "onednn":
            # the first layer's forward (one input channel) stays on Eigen, the rest runs on oneDNN
            found = backends_by_op(net._compiled().describe_plans())
            assert found["conv"] == {"eigen", "onednn"}, found
            assert found["conv_backward_weight"] == {"onednn"} and found["conv_backward_data"] == {"onednn"}, found
    np.testing.assert_allclose(losses["onednn"], losses["eigen"], rtol=1e-4)
    assert losses["onednn"][-1] < 0.7 * losses["onednn"][0]


def test_training_on_a_host_pool_is_bitwise_serial():
    """The host's workers run pieces concurrently (and sum weight gradients); results equal serial."""
    import concurrent.futures

    rng = np.random.default_rng(4)
    x, y = randn(rng, 40, 1, 28, 28), rng.integers(0, 10, 40)
    weights = []
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        for executor in (None, tl.PoolExecutor(pool, 3)):
            net = _cnn(2)
            net.set_backend("onednn")
            trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-3), executor=executor)
            for _ in range(3):
                trainer.step(x, y)
            weights.append(net.flat_parameters().copy())
    np.testing.assert_array_equal(weights[0], weights[1])


def test_concurrent_predictions_on_shared_primitives_are_bitwise_serial():
    """Plans (primitives, weight reorders) are shared by threads with their own contexts."""
    rng = np.random.default_rng(5)
    net = _cnn(1)
    net.set_backend("onednn")
    assert_concurrent_predictions_bitwise(net, [randn(rng, 13, 1, 28, 28) for _ in range(6)], repeats=4)
    assert "conv [onednn]" in net._compiled().describe_plans()


_CNN_STEPS = """
    import json, os
    import numpy as np
    import treadle as tl

    def threads():
        return len(os.listdir("/proc/self/task"))

    tl.manual_seed(0)
    nn = tl.nn
    net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                        nn.Flatten(), nn.Linear(32 * 12 * 12, 5))
    trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.SGD(lr=0.01))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((37, 1, 12, 12)).astype(np.float32), rng.integers(0, 5, 37)
    start, during = threads(), set()
    for i in range(4):
        print("STEP", i, flush=True)
        trainer.step(x, y)
        during.add(threads())
    print("RESULT", json.dumps({"start": start, "during": sorted(during),
                                "plans": net._compiled().describe_plans()}), flush=True)
"""


def test_cnn_steps_create_no_primitive_and_start_no_thread():
    """Primitives and reorders are created when the plan is built; with OMP_NUM_THREADS=4 libgomp
    would start workers on the first parallel region, the guard keeps every call at one thread."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__)))
    env = dict(os.environ, ONEDNN_VERBOSE="2", OMP_NUM_THREADS="4")
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CNN_STEPS)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sections = proc.stdout.split("STEP ")[1:]
    result = json.loads(sections[-1].split("RESULT ", 1)[1])
    sections[-1] = sections[-1].split("RESULT ", 1)[0]
    creates = [s.count("onednn_verbose,create") for s in sections]
    conv_execs = [sum(line.startswith("onednn_verbose,exec") and ",convolution," in line for line in s.splitlines())
                  for s in sections]
    assert creates[0] > 0 and creates[1:] == [0, 0, 0], creates
    assert min(conv_execs) > 0 and len(set(conv_execs)) == 1, conv_execs
    assert result["during"] == [result["start"]], result
    # oneDNN's by the dispatch rule; which instruction set lets it take the node is the CPU's (and the
    # ONEDNN_MAX_CPU_ISA cap's) to decide, and backends_by_op counts such a decline as oneDNN's
    assert backends_by_op(result["plans"])["conv_backward_weight"] == {"onednn"}, result["plans"]
