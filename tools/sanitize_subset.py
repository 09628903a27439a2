"""pytest plugin for the sanitized Python run (tools/sanitize.sh loads it with -p sanitize_subset).

1. It refuses to run unless the extension imported is the sanitized build's and the ASan runtime is
   in the process: a run that silently imported an installed, uninstrumented treadle would pass
   without checking anything.
2. It thins parameter grids. Under ASan the kernels run 5 to 25 times slower, and whether a memory
   error shows depends on which op, layout and shape run far more than on every combination of
   them, so each parametrised test keeps, in collection order, the cases that add a parameter value
   (SANITIZE_PARAM_COVERAGE=1) or a pair of values of two parameters (=2, the default) not yet
   covered by an earlier case of the same test. "all" keeps every case. Tests with a single
   parameter (a list of bad inputs, say) keep every case either way.
"""
import itertools
import os

import pytest


def _check_sanitized_import():
    build = os.environ.get("TREADLE_BUILD_DIR")
    if not build:
        raise pytest.UsageError("sanitize_subset: TREADLE_BUILD_DIR is not set (run tools/sanitize.sh python)")
    import treadle._core as core

    module = os.path.realpath(core.__file__)
    if not module.startswith(os.path.realpath(build) + os.sep):
        raise pytest.UsageError(f"sanitize_subset: imported {module}, not the sanitized build in {build}")
    with open("/proc/self/maps") as maps:
        if "asan" not in maps.read():
            raise pytest.UsageError("sanitize_subset: the ASan runtime is not loaded (LD_PRELOAD)")
    return module


def _coverage():
    value = os.environ.get("SANITIZE_PARAM_COVERAGE", "2")
    if value not in ("1", "2", "all"):
        raise pytest.UsageError(f"sanitize_subset: SANITIZE_PARAM_COVERAGE must be 1, 2 or all, got {value!r}")
    return None if value == "all" else int(value)


def _value_key(value):
    """A value's identity within one test's grid: itself when hashable (ints, strings, dtypes), else
    the object (pytest passes the same argvalues object to every case that uses it)."""
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))
    return (type(value).__name__, value)


def _keys(item, strength):
    """The parameter values (strength 1) or value pairs (strength 2) that a case exercises."""
    values = sorted((name, _value_key(value)) for name, value in item.callspec.params.items())
    if strength == 1 or len(values) < 2:
        return set(values)
    return set(itertools.combinations(values, 2))


def pytest_configure(config):
    config._sanitize_module = _check_sanitized_import()
    config._sanitize_strength = _coverage()


def pytest_collection_modifyitems(session, config, items):
    config._sanitize_counts = (len(items), len(items))
    strength = config._sanitize_strength
    if strength is None:
        return
    covered, kept, dropped = {}, [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            kept.append(item)
            continue
        test = item.nodeid.split("[")[0]
        new = _keys(item, strength) - covered.setdefault(test, set())
        if new:
            covered[test] |= new
            kept.append(item)
        else:
            dropped.append(item)
    config._sanitize_counts = (len(kept), len(items))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    strength = config._sanitize_strength
    kept, total = getattr(config, "_sanitize_counts", (0, 0))
    grid = "every case" if strength is None else f"parameter coverage {strength}"
    terminalreporter.write_line(f"sanitized run of {config._sanitize_module}: {grid}, {kept} of {total} cases")
