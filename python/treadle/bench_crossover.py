"""`python -m treadle bench crossover`: finds and runs the study in bench/crossover.py (see bench/README.md).

Like the workloads of `python -m treadle bench`, the study lives in the source tree's bench/ folder:
$TREADLE_BENCH_DIR, the source tree beside this package, or ./bench.
"""
import importlib.util
import os
import sys
from pathlib import Path


def _study_file():
    here = Path(__file__).resolve().parent
    candidates = [Path(os.environ["TREADLE_BENCH_DIR"])] if os.environ.get("TREADLE_BENCH_DIR") else []
    candidates += [here.parent.parent / "bench", Path.cwd() / "bench"]
    for d in candidates:
        if (d / "crossover.py").is_file():
            return d / "crossover.py"
    raise FileNotFoundError("bench crossover: cannot find bench/crossover.py (looked in "
                            + ", ".join(str(c) for c in candidates) + "); set TREADLE_BENCH_DIR to the suite's folder")


def main(argv):
    path = _study_file()
    spec = importlib.util.spec_from_file_location("treadle_bench_crossover", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module.main(argv)
