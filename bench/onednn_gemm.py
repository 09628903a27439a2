"""oneDNN's float32 GEMM read in place vs from row-padded copies vs Eigen vs torch.mm, 1 thread.

    python bench/onednn_gemm.py [--quick]

Why (cpp/src/backends/onednn/matmul_kernels.cpp): with its AVX2 kernels, oneDNN 3.2 reads a
product's operands in place (no packing) whenever 1/m + 1/n >= 0.0038, and an operand read along a
stride that is a multiple of 1024 floats then runs at about half speed. treadle gives such a product
tiles oneDNN packs where it can, else a copy of the operand with rows 16 floats further apart.
This measures the three ways for C = op(A) op(B) over m, n, k and each transposition, on buffers
aligned as in treadle's arena (bench/onednn_gemm.cpp, compiled here with g++ -O3 -march=native
against the oneDNN and Eigen that treadle builds with), and torch.mm on the same shapes.
GFLOP/s are medians of 7 calls (the padded column includes the copy). Which way treadle's plan
takes is matmul_kernels.cpp's rule, not repeated here. Writes bench/results/onednn_gemm.{json,md} and prints the table.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

here = Path(__file__).resolve().parent


def include_dirs():
    prefix = Path(sys.prefix)
    site = Path(sysconfig.get_paths()["purelib"])
    dnnl = next((d for d in (prefix / "include", Path("/usr/include")) if (d / "dnnl.hpp").exists()), None)
    eigen = next((d for d in (site / "cmeel.prefix/include/eigen3", Path("/usr/include/eigen3"))
                  if (d / "Eigen").exists()), None)
    if not dnnl or not eigen:
        sys.exit("needs oneDNN (onednn-devel-cpu-gomp) and Eigen (cmeel-eigen) headers")
    return dnnl, eigen, prefix / "lib"


def build(out_dir):
    dnnl, eigen, lib = include_dirs()
    exe = Path(out_dir) / "onednn_gemm"
    subprocess.run(["g++", "-O3", "-march=native", "-DNDEBUG", "-std=c++17", str(here / "onednn_gemm.cpp"),
                    f"-I{dnnl}", f"-I{eigen}", f"-L{lib}", "-ldnnl", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    return exe


def shapes(quick):
    ms = (64, 256, 1024) if quick else (64, 128, 256, 512, 1024, 2048)
    ns = (128, 1024) if quick else (128, 256, 512, 1024, 2048)
    ks = (256, 1024) if quick else (128, 256, 1024)
    return [(ta, tb, m, n, k) for ta in (0, 1) for tb in (0, 1) for m in ms for n in ns for k in ks]


def torch_gflops(torch, ta, tb, m, n, k):
    a = torch.full((k, m) if ta else (m, k), 0.5)
    b = torch.full((n, k) if tb else (k, n), 0.25)
    a_, b_ = (a.t() if ta else a), (b.t() if tb else b)
    c = torch.empty(m, n)
    torch.mm(a_, b_, out=c)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        torch.mm(a_, b_, out=c)
        times.append(time.perf_counter() - t0)
    return 2.0 * m * n * k / sorted(times)[3] / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--out", default=str(here / "results"))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    flags = Path("/proc/cpuinfo").read_text()
    wide = all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))  # oneDNN's avx512_core
    cases = shapes(args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        text = "\n".join(" ".join(map(str, c)) for c in cases) + "\n"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        lines = subprocess.run([str(exe)], input=text, capture_output=True, text=True, env=env, check=True).stdout
    rows = []
    for (ta, tb, m, n, k), line in zip(cases, lines.split("\n")):
        in_place, padded, eigen = map(float, line.split())
        rows.append({"ta": ta, "tb": tb, "m": m, "n": n, "k": k, "onednn_in_place": in_place,
                     "onednn_padded_copy": padded, "eigen": eigen, "torch_mm": torch_gflops(torch, ta, tb, m, n, k)})
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    conditions = {"cpu": cpu, "avx512": wide, "threads": 1, "torch": torch.__version__,
                  "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    md = [f"# oneDNN float32 GEMM: in place vs padded copy vs Eigen vs torch.mm ({conditions['date']})", "",
          f"- CPU: {cpu} (AVX-512: {'yes' if wide else 'no'}); 1 thread; torch {torch.__version__}; "
          "GFLOP/s, medians of 7 calls; the padded copy's time includes the copy", "",
          "| A^T | B^T | m | n | k | oneDNN in place | oneDNN padded copy | Eigen | torch.mm |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['ta']} | {r['tb']} | {r['m']} | {r['n']} | {r['k']} | {r['onednn_in_place']:.1f} | "
                  f"{r['onednn_padded_copy']:.1f} | {r['eigen']:.1f} | {r['torch_mm']:.1f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "onednn_gemm.json").write_text(json.dumps({"conditions": conditions, "rows": rows}, indent=1))
    (out / "onednn_gemm.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
