"""`python -m treadle verify`: checks this installation's ops on this machine, without torch.

The check is the C++ core's (treadle/verify.hpp; also the `treadle-verify` program and the C function
treadle_verify()): for every case of its catalog (one or more small cases per forward op, and one per
gradient op that is differentiable itself) it runs
- a float64 central-difference check of the Eigen reference's gradients, and
- every other backend and dtype this build has and this machine can run (Eigen in float32, oneDNN,
  CUDA with a device) against that float64 reference, outputs and input gradients alike,
each on fresh random inputs, at the test suite's tolerances. It prints a matrix (a row per case, a
column per check, each cell the worst error as a fraction of its tolerance: at most 1 passes), can
write the same as JSON, and exits with status 1 if any check fails. It also reports the build and
that the run started no thread (the thread count before and after must agree).
"""
import json
import sys

from . import _core

QUICK_ELEMENTS = 6  # finite differences on this many elements per input with --quick (the core's)


def cases():
    """[(case name, op)] of the catalog, in the order verify runs them."""
    return [tuple(c) for c in _core.verify_cases()]


def uncovered_ops():
    """{op: why} for the forward ops the catalog has no case for."""
    return dict(_core.verify_uncovered_ops())


def usable_backends():
    """The backends built into this library that can run here ("cuda" needs a device): the columns
    verify checks."""
    return list(_core.verify_usable_backends())


def run(quick=False, ops=None, backends=None, seed=0, progress=None, tamper=None):
    """The verification matrix: {"build", "quick", "threads": {"before", "after"}, "columns", "rows":
    [{case, op, cells: {column: fraction, None (no kernel listed), {"declined": why} (none this CPU runs)
    or an error message}}], "failures": [{case, op, check, backend, dtype, error}], "seconds"}.
    ValueError names an op without a case or a backend this build lacks. `tamper(op, backend, dtype,
    outputs, input_grads)` (tests only) may change a kernel's results in place before they are checked."""
    report, _text = _run(quick, ops, backends, seed, progress, tamper)
    return report


def _run(quick, ops, backends, seed, progress, tamper):
    text_json, text = _core.verify(quick, list(ops or ()), list(backends or ()), seed, progress, tamper)
    return json.loads(text_json), text


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true",
                        help=f"finite differences on {QUICK_ELEMENTS} elements per input instead of all")
    parser.add_argument("--ops", help="comma-separated op names (default: every op in the catalog)")
    parser.add_argument("--backend", help="comma-separated backends to compare (default: every usable one)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


def main(args, tamper=None):
    split = lambda text: [s for s in (text or "").split(",") if s]  # noqa: E731
    try:
        report, text = _run(args.quick, split(args.ops), split(args.backend), args.seed,
                            lambda i, n: print(f"\rverify: {i}/{n} cases", end="", file=sys.stderr, flush=True),
                            tamper)
    except ValueError as e:
        print(f"\n{e}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    print(text, end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if report["failures"] else 0
