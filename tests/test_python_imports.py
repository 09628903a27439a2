"""The Python package's imports form no circle, and each module of treadle.nn imports on its own.

A circle makes the outcome depend on which module is imported first: the one entered second sees
the first half-initialised, and a name defined below the import is missing.

The graph is read statically (ast) from every module under python/treadle. An edge is any
`import treadle.x` / `from treadle.x import y` / relative `from .x import y` / `from . import x`,
function-local imports included: io.py runs function-local imports while it is imported (its
registration functions are called at module level), and a function that imports its caller's
module back is the same circle, only entered later. `from p import x` is an edge to the submodule
p.x where x is one, else to p's __init__. Importing p.x from outside package p runs p's __init__
first, so that is an edge to p's __init__ as well: a package whose __init__ re-exports a module
that imports p.x back is a circle (the re-export can see a half-initialised module). A module's
own parent packages are no edge: they have started before it, and import their submodules by
design.
"""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import treadle as tl

PACKAGE_DIR = Path(tl.__file__).resolve().parent
PACKAGE_ROOT = PACKAGE_DIR.parent
# The compiled extensions (python/src): imported as `from . import _core`, they import no Python module back.
EXTENSIONS = {"treadle._core", "treadle._distributed"}


def _modules():
    """{dotted module name: (path, is_package)} for every .py file under the package."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _resolve(name, level, module, is_package):
    """The absolute module a `from <level dots><name>` in `module` names."""
    if not level:
        return name
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _target(name, modules):
    """`name` if it is a module of the package, else its nearest enclosing one (treadle._core, a
    compiled extension, and names inside a module resolve upwards); None outside the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph():
    """{module: {imported module: line of the first such import}} over the package's own modules."""
    modules = _modules()
    graph = {}
    for module, (path, is_package) in modules.items():
        edges = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module, node.level, module, is_package)
                # `from p import x`: the submodule p.x where there is one, else p itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules.keys() | EXTENSIONS else base
                           for a in node.names]
            for name in targets:
                if name in EXTENSIONS:
                    continue
                target = _target(name, modules)
                for imported in _entered(target, module, modules):
                    edges.setdefault(imported, node.lineno)
    return graph


def _entered(target, module, modules):
    """The modules an import of `target` from `module` runs: `target` and the __init__ of each
    package above it that is not above `module` too (those have started already)."""
    if target is None or target == module:
        return []
    parts = target.split(".")
    above = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [name for name in above if name in modules and not module.startswith(name + ".")] + [target]


def cycles(graph):
    """One circle per strongly connected component of more than one module (Tarjan's algorithm, then a
    shortest path back to the component's first module), each as [m0, m1, ..., m0]."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(set(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            connect(v)
    circles = []
    for component in components:
        start = min(component)
        previous, queue, end = {start: None}, [start], None
        for v in queue:  # breadth first, so the circle named is a shortest one
            if start in graph[v]:
                end = v
                break
            for w in sorted(graph[v]):
                if w in component and w not in previous:
                    previous[w] = v
                    queue.append(w)
        path = []
        while end is not None:
            path.append(end)
            end = previous[end]
        circles.append(path[::-1] + [start])
    return sorted(circles, key=lambda c: (c[0], len(c)))


def _describe(circle, graph):
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(circle, circle[1:])]
    return " -> ".join(steps + [circle[-1]])


def _knot(circle, graph):
    """The modules that reach and are reached from the circle's first one: all of them must change."""
    def reach(start, edges):
        seen, stack = {start}, [start]
        while stack:
            for w in edges.get(stack.pop(), ()):
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        return seen
    reverse = {}
    for v, targets in graph.items():
        for w in targets:
            reverse.setdefault(w, set()).add(v)
    return sorted(reach(circle[0], graph) & reach(circle[0], reverse))


def test_the_graph_sees_relative_absolute_and_function_local_imports():
    graph = import_graph()
    assert "treadle.trainer" in graph["treadle"]  # from .trainer import ...
    assert "treadle.functional" in graph["treadle"]  # from . import ..., functional, ...
    assert "treadle" in graph["treadle.bench"]  # import treadle as tl, inside a function
    assert "treadle.bench_activations" in graph["treadle.bench"]  # from .bench_activations import main, in main()
    # from .nn.losses import *: the package's __init__ runs first, so it is an edge too; from inside
    # the package it is not (it has started already)
    assert {"treadle.nn", "treadle.nn.losses"} <= set(graph["treadle.loss"])
    assert "treadle.nn.module" in graph["treadle.nn.losses"] and "treadle.nn" not in graph["treadle.nn.losses"]


def test_the_circle_finder_names_a_circle():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert _describe(["a", "b", "c", "a"], graph) == "a (line 1) -> b (line 2) -> c (line 3) -> a"
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_the_package_imports_form_no_circle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles in python/treadle (module (line of the import) -> ...):\n" + "\n".join(
        f"{_describe(c, graph)}\n  (the circles through it join {', '.join(_knot(c, graph))})" for c in found)


def test_treadle_nn_is_a_package():
    assert (PACKAGE_DIR / "nn" / "__init__.py").is_file()
    assert not (PACKAGE_DIR / "nn.py").exists()


NN_MODULES = sorted(m for m in _modules() if m == "treadle.nn" or m.startswith("treadle.nn."))


@pytest.mark.parametrize("module", NN_MODULES)
def test_each_nn_module_imports_on_its_own(module):
    """A fresh interpreter that imports only `module` (whatever its parents import first)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                              if p])
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"import {module} failed:\n{proc.stderr}"
