"""Training steps on the executors a C++ host lends treadle: the calling thread alone, the header-only
thread pool and the OpenMP adapter, W workers each (bench/executors_cpp/main.cpp), in alternating
rounds; the speedups over the calling thread, with the conditions, as JSON and a table.

    python bench/executors_cpp.py                       # treadle installed (pip): its C++ package
    python bench/executors_cpp.py --prefix /tmp/tl       # or a `cmake --install <build> --prefix /tmp/tl`

Writes bench/results/executors-cpp-<date>.{json,md} and executors-cpp-latest.{json,md}.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))


def cmake_dir(prefix):
    if prefix:
        return str(Path(prefix) / "lib" / "cmake" / "treadle")
    out = subprocess.run([sys.executable, "-m", "treadle", "--cmake-dir"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("executors_cpp: " + (out.stderr.strip() or "treadle's C++ package not found; pass --prefix"))
    return out.stdout.strip()


def build(package_dir, build_dir):
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(HERE / "executors_cpp"), "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                    f"-Dtreadle_DIR={package_dir}", *gen], check=True, capture_output=True, text=True)
    subprocess.run(["cmake", "--build", build_dir], check=True, capture_output=True, text=True)
    return str(Path(build_dir) / "executors_cpp")


def to_markdown(result):
    m, w = result["machine"], result["workers"]
    lines = [f"# treadle in a C++ host: training steps on lent workers ({result['date']})\n",
             f"- Machine: {m['cpu_model']}; {m['cpus_usable']} usable CPUs; load average at start "
             f"{', '.join(f'{v:.2f}' for v in m['loadavg_at_start'] or [])}",
             f"- Executors, {w} workers each: treadle::executors::ThreadPool({w}) (host-owned std::threads) and "
             f"OpenMPExecutor({w}) (the host's OpenMP team), against the calling thread alone. Median us per "
             f"training step (Adam, cross-entropy) over alternating rounds of ~10 ms, {result['seconds']} s of "
             f"serial steps per row. 'bitwise': all three trainers hold identical parameters afterwards.", "",
             "| workload | batch | serial | thread pool | speedup | OpenMP | speedup | bitwise |",
             "|" + "---|" * 8]
    for r in result["rows"]:
        s, tp, om = r["serial_us"], r["thread_pool_us"], r["openmp_us"]
        lines.append(f"| {r['workload']} {r['title']} | {r['batch']} | {s:,.0f} | {tp:,.0f} | {s / tp:.2f}x | "
                     f"{om:,.0f} | {s / om:.2f}x | {'yes' if r['bitwise_equal'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefix", help="install prefix of treadle's C++ package (default: the installed wheel's)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=1.0, help="seconds of serial steps per row")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    from treadle.bench import machine_info, write_result_files  # as the main suite describes and writes

    with tempfile.TemporaryDirectory(prefix="treadle-executors-cpp-") as tmp:
        exe = build(cmake_dir(args.prefix), tmp)
        env = dict(os.environ, OMP_PROC_BIND=os.environ.get("OMP_PROC_BIND", "false"))
        out = subprocess.run([exe, str(args.workers), str(args.seconds)], check=True, capture_output=True,
                             text=True, env=env).stdout
    result = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(),
              "workers": args.workers, "seconds": args.seconds,
              "rows": [json.loads(line) for line in out.splitlines() if line.startswith("{")]}
    print(to_markdown(result))
    write_result_files(result, to_markdown(result), args.out, "executors-cpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
