"""Shared checks for the op suite: run one op on a backend, finite differences, PyTorch comparison.

Every op test goes through `run`, which calls the compiled core's `run_op` (one op, one backend,
forward and backward outside any model), so the same test runs on every backend that is built.
"""
import os

import numpy as np
import pytest

import treadle as tl


def cuda_device_usable():
    """Whether a plan for backend "cuda" can run here (a CUDA build on a machine with a GPU)."""
    if "cuda" not in tl.backends():
        return False
    try:
        tl._core.run_op("relu", [np.ones(1, np.float32)], {}, None, "cuda", True, 0)
    except ValueError as e:
        if "needs a CUDA device" in str(e):
            return False
        raise
    return True


def _selected_backends():
    """The compiled backends that can run here, or those named in TREADLE_TEST_BACKENDS (comma-separated),
    e.g. "cuda" to run the op suite against the CUDA backend only (bench/gpu_check.sh does). A CUDA build
    on a machine without a GPU leaves "cuda" out unless it is named: then every case the device covers
    is skipped with "needs a CUDA device" (tests/test_cuda_build.py checks the coverage that way)."""
    built = tl.backends()
    wanted = [b for b in os.environ.get("TREADLE_TEST_BACKENDS", "").split(",") if b]
    unknown = [b for b in wanted if b not in built]
    if unknown:
        raise RuntimeError(f"TREADLE_TEST_BACKENDS names {unknown}, but this build has only {built}")
    if wanted:
        return wanted
    return [b for b in built if b != "cuda" or cuda_device_usable()]


BACKENDS = _selected_backends()  # e.g. ["eigen"]; later backends join automatically

# The CUDA backend has no fallback: an op it does not cover fails when the plan is compiled. Coverage
# is checked, not skipped: a float32 op without a CUDA kernel fails the case, unless it is one of the
# gaps listed here (each with its reason), which are expected failures (xfail) so that the suite shows
# them and a kernel that appears for one is noticed (XPASS). The device runs float32 only: other
# dtypes are skipped with that reason, as is every case when no device is there ("needs a CUDA device").
CUDA_GAPS = {
    "upsample2d": "modes nearest-exact and bicubic have no device kernel (nearest and bilinear do)",
}


def _cuda_not_covered(op, message):
    """Skips or xfails a case the CUDA backend cannot run here; returns when the error is a real one."""
    if "needs a CUDA device" in message:
        pytest.skip(f"cuda: {message}")
    if "no CUDA kernel for" not in message:
        return
    if "no CUDA kernel for float32" not in message:
        pytest.skip(f"cuda runs float32 only: {message}")
    gap = message.split(":", 1)[0]  # the op the plan found no kernel for (a node of `op`'s plan)
    if gap in CUDA_GAPS:
        pytest.xfail(f"cuda gap: {gap}: {CUDA_GAPS[gap]}")
    pytest.fail(f"cuda coverage: {message} (running {op}); add the kernel, or list the gap in opcheck.CUDA_GAPS "
                f"with its reason", pytrace=False)


def run(op, inputs, attrs=None, grad_outputs=None, backend="", training=True, seed=0, all_kernels=False):
    """Returns (outputs, input_grads) as lists of numpy arrays (None where no gradient).
    all_kernels: the backend also takes nodes it declines for speed (below its size thresholds, or
    where this CPU's instruction set makes Eigen faster), so that its kernels are checked."""
    try:
        return tl._core.run_op(op, list(inputs), dict(attrs or {}), grad_outputs, backend, training, seed,
                               all_kernels=all_kernels)
    except ValueError as e:
        if backend == "cuda":
            _cuda_not_covered(op, str(e))
        raise


def seeded_grads(outputs, rng):
    """Random upstream gradients shaped like the outputs (so every output element matters)."""
    return [rng.standard_normal(o.shape).astype(o.dtype) for o in outputs]


def numeric_grads(op, inputs, attrs, grad_outputs, wrt, eps=1e-6, backend="eigen", training=True, seed=0):
    """Central differences of sum_k <grad_outputs[k], outputs[k]> with respect to inputs[i] for i in wrt.

    Inputs must be float64. The same seed is used at every evaluation, so dropout masks are fixed.
    """
    grads = {}
    for i in wrt:
        x = inputs[i]
        g = np.zeros_like(x)
        flat = x.reshape(-1)
        for j in range(flat.size):
            orig = flat[j]
            vals = []
            for h in (eps, -eps):
                flat[j] = orig + h
                outs, _ = run(op, inputs, attrs, None, backend, training, seed)
                vals.append(sum(float(np.sum(go * o)) for go, o in zip(grad_outputs, outs) if go is not None))
            flat[j] = orig
            g.reshape(-1)[j] = (vals[0] - vals[1]) / (2 * eps)
        grads[i] = g
    return grads


def gradcheck(op, inputs, attrs=None, wrt=None, rtol=1e-7, atol=1e-9, seed_rng=0, training=True, backend="eigen"):
    """Asserts analytic gradients match central differences in float64 (relative error ~1e-8).

    `wrt` lists the indices of differentiable inputs (default: every floating input).
    """
    rng = np.random.default_rng(seed_rng)
    inputs = [np.array(x, copy=True) for x in inputs]
    if wrt is None:
        wrt = [i for i, x in enumerate(inputs) if x.dtype.kind == "f"]
    outs, _ = run(op, inputs, attrs, None, backend, training)
    gos = seeded_grads(outs, rng)
    _, analytic = run(op, inputs, attrs, gos, backend, training)
    numeric = numeric_grads(op, inputs, attrs, gos, wrt, backend=backend, training=training)
    # Central differences of f = sum(go * out) carry rounding noise of about eps_machine * |f| / h
    # (h = 1e-6), so the absolute tolerance grows with the magnitude of the summed outputs.
    magnitude = sum(float(np.sum(np.abs(go * o))) for go, o in zip(gos, outs) if go is not None)
    atol = max(atol, 4e-10 * magnitude)
    for i in wrt:
        assert analytic[i] is not None, f"{op}: no gradient for input {i}"
        np.testing.assert_allclose(analytic[i], numeric[i], rtol=rtol, atol=atol,
                                   err_msg=f"{op}: gradient of input {i} disagrees with finite differences")
    return analytic


def torch_grads(fn, inputs, grad_outputs, wrt):
    """Runs a PyTorch function on copies of `inputs` and returns (outputs, grads of inputs in wrt)."""
    import torch

    ts = [torch.tensor(x, requires_grad=(i in wrt)) for i, x in enumerate(inputs)]
    outs = fn(*ts)
    if not isinstance(outs, (tuple, list)):
        outs = [outs]
    pairs = [(o, torch.tensor(g)) for o, g in zip(outs, grad_outputs) if g is not None]
    if wrt and pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    grads = {i: ts[i].grad.numpy() if ts[i].grad is not None else None for i in wrt}
    return [o.detach().numpy() for o in outs], grads


def tol(dtype):
    """Tolerances against PyTorch: float32 ~1e-5, float64 ~1e-12."""
    return dict(rtol=1e-5, atol=1e-6) if np.dtype(dtype) == np.float32 else dict(rtol=1e-11, atol=1e-12)


def assert_concurrent_predictions_bitwise(net, xs, repeats=4):
    """One thread per input, each predicting `repeats` times on the shared model with its own
    pooled context: every result must equal the serial prediction bit for bit."""
    import threading

    serial = [net.predict(x) for x in xs]
    results = [None] * len(xs)

    def work(i):
        for _ in range(repeats):
            results[i] = net.predict(xs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(serial, results):
        np.testing.assert_array_equal(a, b)


CPU_DECLINE = "onednn declined on this CPU"


def backends_by_op(plan_text, cpu_declines_as_onednn=True):
    """{op: set of backends} from a plan description ("<node> <op> [<backend>] -> shape"), as the
    dispatch rules place the nodes. A node that oneDNN declined only because it has no fast kernel for
    it on this CPU (its line ends "# onednn declined on this CPU: <why>") counts as oneDNN's: which
    kernels oneDNN has depends on the instruction set (ONEDNN_MAX_CPU_ISA, tests/test_isa_caps.py),
    and a test must hold on every CPU. Its results are checked against the reference either way.
    cpu_declines_as_onednn=False: the backends that ran the nodes here, as the plan says."""
    found = {}
    for line in plan_text.splitlines():
        parts = line.split()
        backend = "onednn" if cpu_declines_as_onednn and CPU_DECLINE in line else parts[2].strip("[]")
        found.setdefault(parts[1], set()).add(backend)
    return found


def grads_for(op, inputs, attrs, rng):
    """float32 random upstream gradient for an op's first output; None for the others (statistics,
    indices). Output shapes come from running the op on Eigen."""
    outs, _ = run(op, inputs, attrs, None, "eigen")
    return [rng.standard_normal(outs[0].shape).astype(np.float32)] + [None] * (len(outs) - 1)


def assert_close_f32(got, ref, what):
    """float32 at ~1e-5 relative, measured against the tensor's scale (sums of products cancel)."""
    scale = max(1.0, float(np.max(np.abs(ref))))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


def param_grads(net):
    """A module's accumulated gradients by parameter name, as views of its flat gradient buffer."""
    flat = net.flat_gradients()
    return {n: flat[o:o + int(np.prod(s))].reshape(s) for n, s, o in net._compiled().layout}


def assert_grads_like_torch(net, ref, prefix="", rtol=1e-10, atol=1e-12):
    """Each gradient of torch module `ref` (after its backward) equals `net`'s gradient of the same
    parameter (named with `prefix` when ref is a submodule of net)."""
    grads = net.named_gradients()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads[prefix + name], p.grad.numpy(), rtol=rtol, atol=atol, err_msg=name)
    return grads
