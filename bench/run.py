"""Runs the treadle vs PyTorch benchmark suite: `python bench/run.py [--min-time 0.5] [--workloads W1,W2]`.

Same as `python -m treadle bench`; see bench/README.md. With a development build, set
TREADLE_BUILD_DIR=<build dir> and PYTHONPATH=python (this script adds python/ itself if needed).
"""
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
try:
    import treadle.bench as tb
except ImportError:
    sys.path.insert(0, str(here.parent / "python"))
    import treadle.bench as tb

sys.path.insert(0, str(here))
import workloads  # noqa: E402 (this folder's workload list)

if __name__ == "__main__":
    # --workloads-file names another list; without it, this folder's.
    own = any(a == "--workloads-file" or a.startswith("--workloads-file=") for a in sys.argv[1:])
    sys.exit(tb.main(sys.argv[1:], workloads=None if own else workloads.all_workloads()))
