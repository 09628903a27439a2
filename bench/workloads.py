"""The benchmark workloads live in the package (treadle/bench_workloads.py), so that `python -m treadle
bench` runs from an installed wheel; this file keeps `import workloads` working for the scripts here."""
from treadle.bench_workloads import *  # noqa: F401,F403
from treadle.bench_workloads import Workload, all_workloads  # noqa: F401 (named for readers)
