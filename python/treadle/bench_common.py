"""What the benchmark commands share: the machine and build they ran on, where results go, the
workload list, and writing a result as JSON and markdown. `bench` and its subcommands
(bench_activations, bench_workers, the crossover study) import it; it imports none of them.
"""
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np


# -- machine --------------------------------------------------------------------------------------
def machine_info():
    """CPU model, vector flags of interest, core counts, load, library versions."""
    info = {"cpu_model": platform.processor() or platform.machine(), "flags": {}, "cores_physical": None}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "model name" in fields:
        info["cpu_model"] = fields["model name"]
    flags = set(fields.get("flags", "").split())
    for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"):
        info["flags"][f] = f in flags
    if "cpu cores" in fields:
        info["cores_physical"] = int(fields["cpu cores"])
    info["cpus_logical"] = os.cpu_count()
    info["cpus_usable"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info["loadavg_at_start"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    info["python"] = platform.python_version()
    info["numpy"] = np.__version__
    return info


def treadle_info(tl):
    info = {"version": tl.__version__, "backends": tl.backends(), "git": None,
            "build": tl.info() if hasattr(tl, "info") else {}}
    try:
        here = Path(tl.__file__).resolve().parent
        info["git"] = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True,
                                     text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def write_result_files(result, markdown, out_dir, name, latest=None):
    """<out_dir>/<name>-<date>.{json,md} and <latest or name-latest>.{json,md}; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result["date"].replace(":", "").replace("-", "").replace(" ", "-")
    text = json.dumps(result, indent=1)
    paths = []
    for stem in (f"{name}-{stamp}", latest or f"{name}-latest"):
        (out_dir / f"{stem}.json").write_text(text)
        (out_dir / f"{stem}.md").write_text(markdown)
        paths += [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    return paths


def load_workloads(path=None):
    """The workload list: treadle/bench_workloads.py, or a workloads.py of your own at `path` or in
    $TREADLE_BENCH_DIR."""
    custom = path or os.environ.get("TREADLE_BENCH_DIR")
    custom = Path(custom) if custom else None
    if custom is None:
        from .bench_workloads import all_workloads

        return all_workloads()
    f = custom / "workloads.py" if custom.is_dir() else custom
    if not f.is_file():
        raise FileNotFoundError(f"bench: no workloads file at {f}")
    spec = importlib.util.spec_from_file_location("treadle_bench_custom_workloads", f)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module.all_workloads()


def _default_out_dir():
    src = Path(__file__).resolve().parent.parent.parent / "bench"
    return src / "results" if src.is_dir() else Path.cwd() / "bench-results"
