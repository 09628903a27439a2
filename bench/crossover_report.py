"""The crossover report lives in the package (treadle/bench_crossover_report.py); re-exported here."""
from treadle.bench_crossover_report import *  # noqa: F401,F403
