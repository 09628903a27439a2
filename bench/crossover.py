"""The backend crossover study lives in the package (treadle/bench_crossover_study.py), so that
`python -m treadle bench crossover` runs from an installed wheel; `python bench/crossover.py [options]`
runs the same."""
import sys

from treadle.bench_crossover_study import *  # noqa: F401,F403
from treadle.bench_crossover_study import main

if __name__ == "__main__":
    sys.exit(main())
