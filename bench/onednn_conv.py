"""oneDNN convolutions vs Eigen vs PyTorch: per-op times and the W4 CNN training step, 1 thread.

    TREADLE_BUILD_DIR=$PWD/build/onednn PYTHONPATH=$PWD/python python bench/onednn_conv.py [--min-time 0.5]
        [--problems NAME,...] [--no-w4] [--w4-threads 1,2] [--precision bf16]

Per op, for each problem (a convolution layer's geometry and batch), median CPU time of the calling
thread per call, in alternating rounds (all runners see the same machine noise; treadle starts no
threads and torch runs with set_num_threads(1), so every runner computes on the calling thread):
  forward          treadle: predict of the Conv layer (the "conv" node, bias fused); torch: F.convNd
  backward data    treadle: predict of a bias-free ConvTranspose layer with the same geometry, which
                   is exactly the "conv_backward_data" node; torch: aten.convolution_backward (input)
  backward weight  treadle: a training step of the bias-free Conv layer (forward, MSE loss, weight
                   gradient, SGD) minus its forward, times the weight gradient's share of the rest
                   of the step (kernel times from tl.profile, which reads wall clocks: the MSE loss
                   over the output is 10-25% of the step's non-forward time, not to be counted);
                   torch: aten.convolution_backward (weight)
treadle "onednn" is the layer pinned to oneDNN: it shows whether the backend takes the node (a node
it declines runs on Eigen, marked "(eigen)"). Before timing,
the three implementations' results must agree (1e-4 of the tensor's scale). Then the W4 training
step (bench/workloads.py) on both backends and torch, timed the same way (bench/onednn_mlp.py); with
--w4-threads 1,2 also on a 2-worker tl.PoolExecutor against torch.set_num_threads(2) (wall time).
With --precision bf16 every treadle layer computes in bf16 (set_precision("bf16"): operands
rounded to bf16, float32 accumulation and results) and torch runs the same ops on bf16 tensors
converted beforehand (bf16 results); results must then agree within 3e-2 of the scale, and the W4
step is timed on oneDNN in float32 and bf16 against torch in float32 and under
torch.autocast("cpu", torch.bfloat16).
Writes bench/results/onednn_conv[-bf16].{json,md} and prints the tables.
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

here = Path(__file__).resolve().parent
try:
    import treadle as tl
except ImportError:
    sys.path.insert(0, str(here.parent / "python"))
    import treadle as tl
import treadle.bench as tb  # noqa: E402

sys.path.insert(0, str(here))
import onednn_mlp  # noqa: E402
import workloads  # noqa: E402

# name: (batch, in channels, out channels, spatial size, kernel, stride, padding, groups)
PROBLEMS = {
    "w4-conv1": (64, 1, 32, (28, 28), 3, 1, 1, 1),
    "w4-conv2": (64, 32, 64, (14, 14), 3, 1, 1, 1),
    "rgb-3-16-32x32": (32, 3, 16, (32, 32), 3, 1, 1, 1),
    "8-8-8x8": (16, 8, 8, (8, 8), 3, 1, 1, 1),
    "16-16-16x16": (32, 16, 16, (16, 16), 3, 1, 1, 1),
    "64-64-32x32": (32, 64, 64, (32, 32), 3, 1, 1, 1),
    "128-128-8x8": (32, 128, 128, (8, 8), 3, 1, 1, 1),
    "32-64-28x28-s2": (32, 32, 64, (28, 28), 3, 2, 1, 1),
    "64-64-1x1": (32, 64, 64, (14, 14), 1, 1, 0, 1),
    "64-64-g4": (32, 64, 64, (14, 14), 3, 1, 1, 4),
    "dw32-28x28": (32, 32, 32, (28, 28), 3, 1, 1, 32),
    "1d-16-32-k5-L256": (32, 16, 32, (256,), 5, 1, 2, 1),
    "1d-64-64-k3-L128": (32, 64, 64, (128,), 3, 1, 1, 1),
    "1d-4-8-k3-L64": (16, 4, 8, (64,), 3, 1, 1, 1),
    "3d-16-32-8x16x16": (4, 16, 32, (8, 16, 16), 3, 1, 1, 1),
    "3d-4-8-8x8x8": (4, 4, 8, (8, 8, 8), 3, 1, 1, 1),
    "small-4-4-8x8-b4": (4, 4, 4, (8, 8), 3, 1, 1, 1),
    "small-8-8-6x6-b2": (2, 8, 8, (6, 6), 3, 1, 1, 1),
    "small-16-16-8x8-b2": (2, 16, 16, (8, 8), 3, 1, 1, 1),
    "2-16-28x28": (32, 2, 16, (28, 28), 3, 1, 1, 1),
    "4-16-28x28": (32, 4, 16, (28, 28), 3, 1, 1, 1),
    "128-256-1x1-8x8": (32, 128, 256, (8, 8), 1, 1, 0, 1),
    "32-32-1x1-28x28": (32, 32, 32, (28, 28), 1, 1, 0, 1),
}
AGREE = {"float32": 1e-4, "bf16": 3e-2}


def _layers(tl_or_torch_nn, nd, transpose):
    names = {1: "1d", 2: "2d", 3: "3d"}
    return getattr(tl_or_torch_nn, ("ConvTranspose" if transpose else "Conv") + names[nd])


def _torch_ops(torch, p, x, w, b, precision):
    batch, cin, cout, size, k, stride, pad, groups = p
    nd = len(size)
    conv = getattr(torch.nn.functional, f"conv{nd}d")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    tx, tw, tb_ = (torch.from_numpy(a).to(dtype) for a in (x, w, b))
    ty = conv(tx, tw, tb_, stride, pad, 1, groups)
    gy_np = np.random.default_rng(1).standard_normal(tuple(ty.shape)).astype(np.float32)
    gy = torch.from_numpy(gy_np).to(dtype)
    args = ([stride] * nd, [pad] * nd, [1] * nd, False, [0] * nd, groups)

    def backward(mask):
        return torch.ops.aten.convolution_backward(gy, tx, tw, None, *args, mask)

    return {"forward": lambda: conv(tx, tw, tb_, stride, pad, 1, groups),
            "backward_data": lambda: backward([True, False, False])[0],
            "backward_weight": lambda: backward([False, True, False])[1]}, gy_np


def _treadle_runners(p, x, w, b, gy, backend, precision):
    batch, cin, cout, size, k, stride, pad, groups = p
    nd = len(size)
    conv = _layers(tl.nn, nd, False)(cin, cout, k, stride=stride, padding=pad, groups=groups)
    conv.load_state_dict({"weight": w, "bias": b})
    # ConvTranspose(cout -> cin) with the same weights is the data gradient of the convolution.
    out_pad = [s - ((o - 1) * stride - 2 * pad + k) for s, o in zip(size, gy.shape[2:])]
    tconv = _layers(tl.nn, nd, True)(cout, cin, k, stride=stride, padding=pad, output_padding=out_pad,
                                     groups=groups, bias=False)
    tconv.load_state_dict({"weight": w})
    wconv = _layers(tl.nn, nd, False)(cin, cout, k, stride=stride, padding=pad, groups=groups, bias=False)
    wconv.load_state_dict({"weight": w})
    for layer in (conv, tconv, wconv):
        layer.set_backend(backend)
        layer.set_precision(precision)
    trainer = tl.Trainer(wconv, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    target = np.zeros_like(gy)
    y_out, dx_out = np.empty_like(gy), np.empty_like(x)
    return {"forward": lambda: conv.predict(x, out=y_out),
            "backward_data": lambda: tconv.predict(gy, out=dx_out),
            "step": lambda: trainer.step(x, target),
            "forward_nobias": lambda: wconv.predict(x, out=y_out)}, (conv, tconv, trainer)


def _taken(model_or_trainer):
    model = model_or_trainer.model if hasattr(model_or_trainer, "model") else model_or_trainer
    plans = model._compiled().describe_plans()
    return {line.split()[1]: line.split()[2].strip("[]") for line in plans.splitlines()
            if line.split()[1].startswith("conv")}


def _weight_grad_share(trainer, x, gy, steps=20):
    """The weight gradient's part of a training step's kernel time outside the forward convolution."""
    target = np.zeros_like(gy)
    with tl.profile() as prof:
        for _ in range(steps):
            trainer.step(x, target)
    nodes = prof.nodes()
    weight = sum(n["seconds"] for n in nodes if n["op"] == "conv_backward_weight")
    rest = sum(n["seconds"] for n in nodes if n["op"] != "conv")
    return weight / rest if rest > 0 else 1.0


def _check(name, torch_ops, runners, precision):
    """The forward and data gradient of both backends agree with torch (scale-relative)."""
    ref_y, ref_dx = (torch_ops[what]().float().numpy() for what in ("forward", "backward_data"))
    for backend, r in runners.items():
        for what, got, ref in (("forward", r["forward"](), ref_y), ("backward data", r["backward_data"](), ref_dx)):
            err = float(np.max(np.abs(got - ref))) / max(1.0, float(np.max(np.abs(ref))))
            if err > AGREE[precision]:
                raise SystemExit(f"{name}: {backend} {what} differs from torch by {err:.2e}")


def bench_problem(torch, name, p, min_time, precision="float32"):
    batch, cin, cout, size, k, stride, pad, groups = p
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, cin) + tuple(size)).astype(np.float32)
    w = (rng.standard_normal((cout, cin // groups) + (k,) * len(size)) / np.sqrt(cin // groups * k ** len(size)))
    w, b = w.astype(np.float32), rng.standard_normal(cout).astype(np.float32)
    torch_ops, gy = _torch_ops(torch, p, x, w, b, precision)
    runners, keep = {}, {}
    for backend in ("eigen", "onednn"):
        runners[backend], keep[backend] = _treadle_runners(p, x, w, b, gy, backend, precision)
    _check(name, torch_ops, runners, precision)
    for r in runners.values():
        r["step"]()
    taken = {}
    for model in keep["onednn"]:
        taken.update(_taken(model))

    def loop(f):
        return lambda n: [f() for _ in range(n)]

    timers = {f"{be}:{what}": loop(r[what]) for be, r in runners.items() for what in r}
    timers.update({f"torch:{what}": loop(f) for what, f in torch_ops.items()})
    t = onednn_mlp.time_alternating(timers, min_time)
    us = {key: v["cpu_s"] * 1e6 for key, v in t.items()}
    shares = {be: _weight_grad_share(keep[be][2], x, gy) for be in runners}
    row = {"problem": name, "geometry": dict(zip(["batch", "in", "out", "size", "kernel", "stride", "padding",
                                                   "groups"], p)),
           "macs": int(batch * cout * np.prod(gy.shape[2:]) * (cin // groups) * k ** len(size)), "taken": taken}
    for be in ("eigen", "onednn"):
        rest = us[f"{be}:step"] - us[f"{be}:forward_nobias"]
        row[be] = {"forward": us[f"{be}:forward"], "backward_data": us[f"{be}:backward_data"],
                   "backward_weight": rest * shares[be], "step_minus_forward": rest,
                   "weight_grad_share": shares[be]}
    row["torch"] = {what: us[f"torch:{what}"] for what in torch_ops}
    return row


def w4_bf16(w, torch, min_time, seed=0):
    """The W4 step on oneDNN in float32 and bf16, torch in float32 and autocast bf16 (median CPU us)."""
    torch.manual_seed(seed)
    tmodel = w.build_torch(torch).float().train()
    state = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    x, y = tb._data(w, np.random.default_rng(seed))
    runners = {}
    for precision in ("float32", "bf16"):
        model = w.build_treadle(tl)
        model.load_state_dict(state)
        model.set_backend("onednn")
        model.set_precision(precision)
        trainer = tl.Trainer(model, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-3))
        runners["treadle-onednn-" + precision] = lambda k, tr=trainer: [tr.step(x, y) for _ in range(k)]
    topt = torch.optim.Adam(tmodel.parameters(), lr=1e-3)
    tx, ty, tloss = torch.from_numpy(x), torch.from_numpy(y), torch.nn.CrossEntropyLoss()

    def torch_step(autocast):
        topt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            loss = tloss(tmodel(tx), ty)
        loss.backward()
        topt.step()

    runners["torch-float32"] = lambda k: [torch_step(False) for _ in range(k)]
    runners["torch-autocast-bf16"] = lambda k: [torch_step(True) for _ in range(k)]
    timing = onednn_mlp.time_alternating(runners, min_time)
    return {"workload": w.name, "title": w.title, "batch": w.batch, "us": {k: v["cpu_s"] * 1e6 for k, v in timing.items()}}


def w4_bf16_table(r):
    u = r["us"]
    return "\n".join([f"W4 training step ({r['title']}, batch {r['batch']}), us, median CPU time, 1 thread:", "",
                      "| treadle onednn float32 | treadle onednn bf16 | torch float32 | torch autocast bf16 | "
                      "bf16 / float32 (treadle) |", "|---|---|---|---|---|",
                      f"| {u['treadle-onednn-float32']:.0f} | {u['treadle-onednn-bf16']:.0f} | {u['torch-float32']:.0f} | "
                      f"{u['torch-autocast-bf16']:.0f} | {u['treadle-onednn-float32'] / u['treadle-onednn-bf16']:.2f}x |"])


def op_table(rows):
    lines = ["Per op, us (median CPU time, 1 thread): eigen / onednn / torch, and eigen / onednn "
             "(> 1: oneDNN faster; '(eigen)': the backend declined the node).", "",
             "| problem | MMAC | forward | fwd x | backward data | bwd data x | backward weight | bwd weight x |",
             "|---|---|---|---|---|---|---|---|"]
    ops = (("forward", "conv"), ("backward_data", "conv_backward_data"), ("backward_weight", "conv_backward_weight"))
    for r in rows:
        cells = []
        for what, op in ops:
            e, o, t = r["eigen"][what], r["onednn"][what], r["torch"][what]
            mark = "" if r["taken"].get(op) == "onednn" else " (eigen)"
            cells += [f"{e:.0f} / {o:.0f}{mark} / {t:.0f}", f"{e / o:.2f}"]
        lines.append(f"| {r['problem']} | {r['macs'] / 1e6:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds of timed calls per runner")
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--no-w4", action="store_true", help="skip the W4 training step")
    ap.add_argument("--w4-threads", default="1", help="thread counts for the W4 step (float32)")
    ap.add_argument("--precision", default="float32", choices=["float32", "bf16"])
    ap.add_argument("--out", default=str(here / "results"))
    args = ap.parse_args(argv)
    if "onednn" not in tl.backends():
        print("treadle was built without oneDNN (TREADLE_WITH_ONEDNN=ON); nothing to compare", file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(1)
    rows = []
    for name in args.problems.split(","):
        rows.append(bench_problem(torch, name, PROBLEMS[name], args.min_time, args.precision))
        print(op_table(rows[-1:]).splitlines()[-1], flush=True)
    tables = [op_table(rows)]
    w4 = []
    w4_spec = next(w for w in workloads.all_workloads() if w.name == "W4")
    if not args.no_w4 and args.precision == "float32":
        import concurrent.futures
        for threads in (int(t) for t in args.w4_threads.split(",")):
            pool = concurrent.futures.ThreadPoolExecutor(threads) if threads > 1 else None
            executor = tl.PoolExecutor(pool, threads) if pool else None
            w4.append(onednn_mlp.bench(w4_spec, torch, 2 * args.min_time, threads, executor))
            if pool:
                pool.shutdown()
        torch.set_num_threads(1)
        tables.append(onednn_mlp.markdown(w4))
    elif not args.no_w4:
        w4 = [w4_bf16(w4_spec, torch, 2 * args.min_time)]
        tables.append(w4_bf16_table(w4[0]))
    conditions = (f"Conditions: {tb.machine_info()}, 1 thread (torch.set_num_threads(1)), "
                  f"precision {args.precision}, load average {os.getloadavg()[0]:.1f}.")
    text = "\n\n".join(tables + [conditions])
    print(text)
    os.makedirs(args.out, exist_ok=True)
    result = {"machine": tb.machine_info(), "loadavg": os.getloadavg()[0], "ops": rows, "w4": w4}
    stem = "onednn_conv" + ("-bf16" if args.precision == "bf16" else "")
    Path(args.out, stem + ".json").write_text(json.dumps(result, indent=1, default=str))
    Path(args.out, stem + ".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
