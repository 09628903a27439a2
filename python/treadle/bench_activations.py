"""`python -m treadle bench activations`: ns per element of each activation, forward and backward,
float32, one thread: treadle's kernel against relu's and against PyTorch's.

Forward: a model of just that activation, `predict(x, out=...)` on a (rows, cols) input (the kernel
plus treadle's per-call floor, amortised over the elements). Backward: the same model's input
gradient through `Trainer.forward` / `backward`, minus the forward. PyTorch: the functional op under
inference_mode, and its autograd backward, same shapes, torch.set_num_threads(1). Median of
alternating rounds; the conditions go into the JSON and the table.
"""
import argparse
import datetime
import importlib.util
import sys

import numpy as np

from .bench_common import _default_out_dir, machine_info, treadle_info, write_result_files
from .bench_timing import time_alternating

# (name, treadle module factory(tl), torch function factory(torch))
ACTIVATIONS = [
    ("relu", lambda tl: tl.nn.ReLU(), lambda t: t.nn.functional.relu),
    ("leaky_relu", lambda tl: tl.nn.LeakyReLU(0.01), lambda t: lambda x: t.nn.functional.leaky_relu(x, 0.01)),
    ("tanh", lambda tl: tl.nn.Tanh(), lambda t: t.tanh),
    ("sigmoid", lambda tl: tl.nn.Sigmoid(), lambda t: t.sigmoid),
    ("softplus", lambda tl: tl.nn.Softplus(), lambda t: t.nn.functional.softplus),
    ("silu", lambda tl: tl.nn.SiLU(), lambda t: t.nn.functional.silu),
    ("elu", lambda tl: tl.nn.ELU(), lambda t: t.nn.functional.elu),
    ("gelu", lambda tl: tl.nn.GELU(), lambda t: t.nn.functional.gelu),
    ("gelu_tanh", lambda tl: tl.nn.GELU(approximate="tanh"),
     lambda t: lambda x: t.nn.functional.gelu(x, approximate="tanh")),
    # rows of the last axis: a reduction per row, then a map
    ("softmax", lambda tl: tl.nn.Softmax(dim=-1), lambda t: lambda x: t.softmax(x, dim=-1)),
    ("log_softmax", lambda tl: tl.nn.LogSoftmax(dim=-1), lambda t: lambda x: t.log_softmax(x, dim=-1)),
]


def measure(name, make_tl, make_torch, tl, torch, rows, cols, min_time, warmup):
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32) * 3
    model = tl.nn.Sequential(make_tl(tl))
    out = np.empty_like(x)
    model.predict(x, out=out)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    dy = np.ones_like(x)

    def tl_forward(k):
        for _ in range(k):
            model.predict(x, out=out)

    def tl_both(k):
        for _ in range(k):
            trainer.forward(x, input_grad=True)
            trainer.backward(dy)

    runners = {"tl_fwd": tl_forward, "tl_fwd_bwd": tl_both}
    if torch is not None:
        fn, tx = make_torch(torch), torch.from_numpy(x)
        tdy = torch.from_numpy(dy)

        def torch_forward(k):
            with torch.inference_mode():
                for _ in range(k):
                    fn(tx)

        def torch_both(k):
            for _ in range(k):
                xi = tx.detach().requires_grad_(True)
                fn(xi).backward(tdy)

        runners.update(torch_fwd=torch_forward, torch_fwd_bwd=torch_both)
    t = time_alternating(runners, min_time, warmup)
    n = rows * cols
    ns = {k: v["median_s"] * 1e9 / n for k, v in t.items()}
    row = {"op": name, "rows": rows, "cols": cols, "treadle_forward_ns": ns["tl_fwd"],
           "treadle_backward_ns": max(ns["tl_fwd_bwd"] - ns["tl_fwd"], 0.0)}
    if torch is not None:
        row["torch_forward_ns"] = ns["torch_fwd"]
        row["torch_backward_ns"] = max(ns["torch_fwd_bwd"] - ns["torch_fwd"], 0.0)
    return row


def to_markdown(result):
    m, s = result["machine"], result["settings"]
    relu = next((r for r in result["rows"] if r["op"] == "relu"), None)
    lines = [f"# Activations: ns per element, float32, 1 thread ({result['date']})\n",
             f"- Machine: {m['cpu_model']}; load average at start "
             f"{', '.join(f'{v:.2f}' for v in m['loadavg_at_start'] or [])}; treadle {result['treadle']['version']} "
             f"({result['treadle']['git'] or 'no git'}); torch {result.get('torch_version') or 'not installed'}",
             f"- Input ({s['rows']}, {s['cols']}) N(0, 9) float32. treadle forward: predict(x, out=) of a model "
             f"of the activation alone (the per-call floor included, amortised); backward: Trainer.forward + "
             f"backward (input gradient) minus the forward. torch: the functional op under inference_mode; "
             f"backward: autograd minus the forward. Medians of alternating rounds, {s['min_time']} s each.", "",
             "| op | treadle fwd | x relu | torch fwd | torch / treadle | treadle bwd | x relu | torch bwd | "
             "torch / treadle |", "|" + "---|" * 9]

    def f(v):
        return "-" if v is None else f"{v:.2f}"

    for r in result["rows"]:
        tf, tb = r["treadle_forward_ns"], r["treadle_backward_ns"]
        pf, pb = r.get("torch_forward_ns"), r.get("torch_backward_ns")
        lines.append(f"| {r['op']} | {tf:.2f} | {tf / relu['treadle_forward_ns']:.1f} | {f(pf)} | "
                     f"{'-' if pf is None else f'{pf / tf:.2f}x'} | {tb:.2f} | "
                     f"{tb / max(relu['treadle_backward_ns'], 1e-9):.1f} | {f(pb)} | "
                     f"{'-' if pb is None or tb == 0 else f'{pb / tb:.2f}x'} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m treadle bench activations", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import treadle as tl

    torch = None
    if importlib.util.find_spec("torch") is not None:
        import torch
        torch.set_num_threads(1)
    result = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(),
              "treadle": treadle_info(tl), "torch_version": torch.__version__ if torch is not None else None,
              "settings": {"rows": args.rows, "cols": args.cols, "min_time": args.min_time, "threads": 1},
              "rows": [measure(n, a, b, tl, torch, args.rows, args.cols, args.min_time, args.warmup)
                       for n, a, b in ACTIVATIONS]}
    print(to_markdown(result))
    write_result_files(result, to_markdown(result), args.out or _default_out_dir(), "activations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
