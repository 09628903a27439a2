"""treadle: deep learning that an HPC code drives.

A compiled core (layers, reverse-mode autodiff, planned memory, backend dispatch) that never starts
a thread or a process: the host lends it workers and drives every step.
"""
import os as _os

# Development builds: `TREADLE_BUILD_DIR=<cmake build dir>` makes the extension built there importable
# as treadle._core without installing (the wheel puts it beside this file).
_dev_build = _os.environ.get("TREADLE_BUILD_DIR")
if _dev_build:
    __path__.append(_os.path.join(_dev_build, "python"))  # noqa: F821 (package __path__)

from . import _core  # noqa: E402

from . import distributed, functional, loss, nn, optim  # noqa: E402
from . import symbol  # noqa: E402,F401  (torch.Tensor's methods on traced symbols)
from ._core import Context, PoolExecutor, manual_seed  # noqa: E402
from .trainer import StepResult, Trainer  # noqa: E402
from .profile import profile  # noqa: E402
from .replay import ReplayBuffer  # noqa: E402
from .io import load, load_checkpoint, save, save_checkpoint  # noqa: E402
from .dispatch import dispatch_lookup, dispatch_table_source, load_dispatch_table  # noqa: E402
from . import onnx_conv  # noqa: E402,F401  (ONNX exporters of the conv/pool layers)

# torch's tensor functions that a forward calls as torch.<name> (torch.flatten(x, 1), torch.cat(...)):
# the functional ops under the same names, so `torch.` becomes `tl.` in a ported forward.
from .functional import (  # noqa: E402,F401
    abs, bmm, cat, chunk, clamp, exp, flatten, log, mean, permute, relu, reshape, sigmoid, softmax, split, sqrt,
    squeeze, sum, tanh, transpose, unsqueeze, where)

from .tensors import full, ones, zeros  # noqa: E402,F401 (torch.zeros ... in __init__ and in forward)

__version__ = "0.1.0"
float32, float64 = "float32", "float64"
double, float = float64, float32  # noqa: A001 (torch.double, torch.float as dtype names)


def info():
    """What this install is and what it runs on: {"version", "backends" (fastest first),
    "compiled_for" ("native" or "portable", with the widest instruction set the core's own kernels
    use), "cpu_features" (of this CPU), "eigen" (its version), then per backend, e.g.
    "onednn.version" and "onednn.isa" (the instruction set oneDNN dispatches to here, after any
    ONEDNN_MAX_CPU_ISA cap)}. `python -m treadle --version` prints the same."""
    return dict(_core.build_info())


def backends():
    """Names of the compiled backends, fastest first (the Eigen reference is always last)."""
    return list(_core.backends())


def backend_ops(backend):
    """{op: [dtype names]}: the ops a backend has kernels for, sorted by op.

    A backend other than "eigen" is partial: it takes a node only where its kernel measured faster
    and as accurate (sizes, shapes and attributes decide when a plan is compiled; a model's
    ``_compiled().describe_plans()`` shows the choice), and every other node falls back to Eigen.
    Raises ValueError for a backend this build does not have."""
    return dict(_core.backend_ops(backend))
