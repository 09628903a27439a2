"""Per-node kernel times of treadle's plans.

    with tl.profile() as prof:
        for _ in range(100):
            trainer.step(x, y)
    print(prof.report(top=10))

While a profile is active every kernel call of every plan (training steps, predictions, any thread)
is timed with two clock reads and added to its node's entry; the report lists the slowest nodes with
their op, backend, pass (forward/loss/backward), module and output shape, then the time per module
and pass. Setting TREADLE_PROFILE=1 in the environment profiles the whole process and prints the
report to stderr at exit (TREADLE_PROFILE_TOP sets how many rows, default 20).
"""
import atexit
import os
import sys

from . import _core

_stack = []  # installed profiles, innermost last; the innermost records


class Profile:
    """A profile being recorded (a context manager); nestable, restores the previous one on exit."""

    def __init__(self):
        self._native = _core.Profiler()

    def __enter__(self):
        _stack.append(self)
        _core._set_global_profiler(self._native)
        return self

    def __exit__(self, *exc):
        _stack.remove(self)
        _core._set_global_profiler(_stack[-1]._native if _stack else None)
        return False

    def nodes(self):
        """Recorded nodes, slowest first: dicts with op, backend, pass, module, output_shape, calls, seconds."""
        return self._native.nodes()

    @property
    def total_seconds(self):
        """Kernel time recorded over all nodes."""
        return self._native.total_seconds

    def by_module(self):
        """Seconds per (module, pass), slowest first."""
        totals = {}
        for n in self.nodes():
            key = (n["module"] or "<root>", n["pass"])
            totals[key] = totals.get(key, 0.0) + n["seconds"]
        return sorted(totals.items(), key=lambda kv: -kv[1])

    def report(self, top=20):
        """A readable table of the `top` slowest nodes, then the time per module and pass."""
        return self._native.report(int(top))

    def reset(self):
        self._native.reset()


def profile():
    """A new `Profile`; use it as a context manager around the steps to measure."""
    return Profile()


def _from_environment():
    if os.environ.get("TREADLE_PROFILE", "") in ("", "0"):
        return
    prof = Profile().__enter__()
    top = int(os.environ.get("TREADLE_PROFILE_TOP", "20"))

    def _report():
        print(prof.report(top), file=sys.stderr)
        prof.__exit__(None, None, None)

    atexit.register(_report)


_from_environment()
