"""The measured dispatch table behind `model.set_backend("auto")`.

Under "auto", each node of a plan runs on the backend that a table names for its op, dtype and
problem size (multiply-adds for linear/matmul/bmm/conv, element count otherwise), and in the usual
priority order where the table has no rule. The table in use, first match wins:

1. the file given to `load_dispatch_table(path)`;
2. the file named by the environment variable TREADLE_DISPATCH_TABLE;
3. the table shipped with the package (`default_table_path()`), measured by the crossover study
   (`python -m treadle bench crossover`) on the machine named in its "conditions".

`python -m treadle bench crossover --write-table PATH` measures this machine and writes a table.
Tables are read when a plan is compiled; call `model.set_backend("auto")` again to recompile
existing plans after loading another table.
"""
import os

from . import _core

_SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dispatch_table.json")


def default_table_path():
    """The table shipped with the package, or None when this installation lacks it."""
    return _SHIPPED if os.path.isfile(_SHIPPED) else None


def load_dispatch_table(path=None):
    """Installs the table in `path` for backend "auto" (None: forget it and use the default again).

    Raises ValueError naming the file when it is missing or not a valid table.
    """
    if path is None:
        _core.clear_dispatch_table()
    else:
        _core.load_dispatch_table(os.fspath(path))


def dispatch_table_source():
    """Where the table in use comes from: '<path> (loaded|TREADLE_DISPATCH_TABLE|default)' or 'none'."""
    return _core.dispatch_table_source()


def dispatch_lookup(op, dtype, size):
    """The backend the table in use names for `op` at `size` ('' = no rule: priority order)."""
    return _core.dispatch_table_lookup(op, dtype, int(size))


_core.set_default_dispatch_table(default_table_path() or "")
