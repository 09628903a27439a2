"""Fixtures shared by the core test files (model, trainer, step API, threads, bad input, end to end)."""
import numpy as np
import pytest

try:
    import torch as _torch
except ImportError:  # the torch comparisons skip themselves
    _torch = None
else:
    # The references are tiny; torch's intra-op pool only costs time on a shared machine (a 200-step
    # loop takes ~40x longer with 2 contending threads). Results do not depend on it.
    _torch.set_num_threads(1)

# float32 results are compared with PyTorch at ~1e-5 relative, float64 at ~1e-12.
# Under tools/sanitize.sh the ASan runtime is preloaded: memory figures then measure its shadow memory
# and quarantine, and kernels run 5 to 25 times slower.
with open("/proc/self/maps") as _maps:
    UNDER_ASAN = "libasan" in _maps.read()

CORE_TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-12, atol=1e-13)}

_ACTIVATIONS = {"tanh": ("Tanh", "Tanh"), "relu": ("ReLU", "ReLU"), "sigmoid": ("Sigmoid", "Sigmoid")}


def _mlp_pair(sizes, act="tanh", dtype="float32", seed=0):
    """The same MLP in treadle and torch.nn, treadle holding a copy of torch's initial weights.

    sizes = (8, 32, 32, 1) gives Linear(8,32) act Linear(32,32) act Linear(32,1), named "0", "1", ...
    as torch.nn.Sequential names them.
    """
    import torch

    import treadle as tl

    tl_act, torch_act = _ACTIVATIONS[act]
    torch.manual_seed(seed)
    tl_layers, torch_layers = [], []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        if i:
            tl_layers.append(getattr(tl.nn, tl_act)())
            torch_layers.append(getattr(torch.nn, torch_act)())
        tl_layers.append(tl.nn.Linear(a, b))
        torch_layers.append(torch.nn.Linear(a, b))
    ref = torch.nn.Sequential(*torch_layers)
    net = tl.nn.Sequential(*tl_layers)
    if dtype == "float64":
        ref = ref.double()
        net.double()
    net.load_state_dict(ref.state_dict())
    return net, ref


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def all_kernels():
    """Plans compiled inside let every backend take what it declines for speed (size thresholds, or a
    CPU where Eigen is faster): a pinned backend's kernels are tested on any CPU."""
    import treadle as tl

    with tl._core.AllKernels():
        yield


@pytest.fixture
def mlp_pair():
    """Factory: mlp_pair(sizes, act="tanh", dtype="float32", seed=0) -> (treadle net, torch net)."""
    pytest.importorskip("torch")
    return _mlp_pair


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that reached a CUDA plan on a machine without a usable device is skipped with the reason,
    wherever it compiled the plan (the op suite does this in opcheck.run; model-level tests reach the
    same error through Model/Trainer). Coverage errors ("no CUDA kernel") are not touched."""
    outcome = yield
    report = outcome.get_result()
    error = call.excinfo.value if call.excinfo is not None else None
    if call.when == "call" and isinstance(error, Exception) and "needs a CUDA device" in str(error):
        report.outcome = "skipped"
        report.longrepr = (str(item.fspath), item.location[1] or 0, f"Skipped: cuda: {error}")
