"""What a build configuration costs or gains: the benchmark suite (bench/run.py) run once per build
directory, each run against PyTorch in the same process, then one table of the ratios side by side.

    python bench/builds.py native=build/dev portable=build/portable eigen-only=build/eigen-check \
        [--workloads W1,W2,...] [--min-time 0.5]

Each build runs in its own child process (TREADLE_BUILD_DIR=<dir>), one after another, on 1 thread
for treadle and PyTorch. Absolute times of different runs are not comparable on a shared machine;
the ratios to PyTorch (measured alternately within each run) are, and the table compares those:
'vs first' is a build's train (infer) ratio over the first build's (< 1: slower than the first).
Writes bench/results/builds-<time>.{json,md} and prints the markdown.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_build(name, build_dir, workloads, min_time):
    out = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    env = dict(os.environ, TREADLE_BUILD_DIR=str(Path(build_dir).resolve()), PYTHONPATH=str(REPO / "python"))
    cmd = [sys.executable, str(REPO / "bench" / "run.py"), "--threads", "1", "--min-time", str(min_time),
           "--out", str(out), "--quiet"]
    if workloads:
        cmd += ["--workloads", workloads]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "latest.json").read_text())


def table(results):
    names = list(results)
    first = results[names[0]]
    lines = ["| workload | " + " | ".join(f"{n} train / infer ratio" for n in names) + " | " +
             " | ".join(f"{n} vs {names[0]} (train / infer)" for n in names[1:]) + " |",
             "|" + "---|" * (1 + 2 * len(names) - 1)]
    base = {r["workload"]: r for r in first["rows"]}
    for row in first["rows"]:
        w = row["workload"]
        cells, rel = [], []
        for n in names:
            r = next((x for x in results[n]["rows"] if x["workload"] == w), None)
            tr, inf = (r or {}).get("train_ratio"), (r or {}).get("infer_ratio")
            cells.append(f"{tr:.2f}x / {inf:.2f}x" if tr and inf else (f"- / {inf:.2f}x" if inf else "-"))
            if n != names[0]:
                b = base[w]
                parts = [f"{a / c:.2f}" if a and c else "-" for a, c in
                         ((tr, b.get("train_ratio")), (inf, b.get("infer_ratio")))]
                rel.append(" / ".join(parts))
        lines.append(f"| {w} {row['title']} | " + " | ".join(cells) + " | " + " | ".join(rel) + " |")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("builds", nargs="+", help="name=build_dir, the first is the baseline")
    p.add_argument("--workloads", default=None)
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    builds = dict(b.split("=", 1) for b in args.builds)
    results = {}
    for name, d in builds.items():
        print(f"== {name}: {d}", file=sys.stderr)
        results[name] = run_build(name, d, args.workloads, args.min_time)
    m = results[next(iter(results))]["machine"]
    md = [f"# Build configurations against PyTorch ({datetime.datetime.now():%Y-%m-%d %H:%M})", "",
          f"- Machine: {m['cpu_model']}, {m['cpus_usable']} usable CPUs; 1 thread for treadle and PyTorch; "
          f"min-time {args.min_time} s per side and measurement; ratio = PyTorch time / treadle time, measured "
          f"alternately within each build's run.",
          "- Builds: " + "; ".join(f"{n}: {r['treadle'].get('build', {}).get('compiled_for', '?')}, backends "
                                   f"{', '.join(r['treadle']['backends'])}" for n, r in results.items()),
          ""] + table(results)
    text = "\n".join(md) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (out / f"builds-{stamp}.json").write_text(json.dumps(results, indent=1))
    (out / f"builds-{stamp}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
