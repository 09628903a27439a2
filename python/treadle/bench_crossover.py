"""`python -m treadle bench crossover`: the backend crossover study (treadle/bench_crossover_study.py;
bench/README.md). It ships in the package, so it runs from an installed wheel; it needs no torch."""


def main(argv):
    from .bench_crossover_study import main as study_main

    return study_main(argv)
