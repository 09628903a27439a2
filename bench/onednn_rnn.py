"""LSTM layers on oneDNN vs Eigen vs PyTorch, 1 thread, CPU time of the calling thread.

    TREADLE_BUILD_DIR=$PWD/build/onednn PYTHONPATH=$PWD/python python bench/onednn_rnn.py [--min-time 0.3]

Three parts, all timed in alternating rounds (bench/onednn_mlp.py's time_alternating), medians:

1. crossover: predict of one LSTM(H, H) layer over T = 16 steps, batch N, returning the output
   sequence, pinned to "eigen" and to "onednn" (which takes lstm_layer in inference plans), and
   torch.nn.LSTM under inference_mode, over a grid of N and H;
2. W5 (bench/workloads.py: LSTM seq 32, input 16, hidden 64, batch 32 -> Linear -> 1, MSE): the
   training step (zero-grad + forward + MSE + backward + Adam) and inference, for the three;
3. training feasibility: a training forward must also write `saved` (gates and cells of every step),
   which oneDNN keeps opaque. Recomputing it on top of oneDNN's output needs at least the recurrent
   product h_{t-1} W_hh^T for all steps again, as one (T N, H) x (H, 4H) product; the part prints
   Eigen's whole LSTM forward against oneDNN's inference plus that product alone (a lower bound).

Writes bench/results/onednn_rnn.{json,md} and prints the tables.
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
import workloads  # noqa: E402
from onednn_mlp import time_alternating  # noqa: E402

BACKENDS = ("eigen", "onednn")


def lstm_net(input_size, hidden, batch_first=False):
    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = tl.nn.LSTM(input_size, hidden, batch_first=batch_first)

        def forward(self, x):
            return self.lstm(x)[0]

    return Net()


def predict_runners(torch, make_treadle, make_torch, x):
    """{name: run(k)} for treadle predict per backend (same weights) and torch inference (a bare
    torch.nn.LSTM: its parameters sit under "lstm." in the treadle net)."""
    tmodel = make_torch().float().eval()
    state = {"lstm." + k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    runners = {}
    for backend in BACKENDS:
        net = make_treadle()
        net.load_state_dict(state)
        net.set_backend(backend)
        out = net.predict(x)
        runners["treadle-" + backend] = lambda k, net=net, out=out: [net.predict(x, out=out) for _ in range(k)]
        runners["_plan-" + backend] = net._compiled().describe_plans()
    tx = torch.from_numpy(x)

    def run_torch(k):
        with torch.inference_mode():
            for _ in range(k):
                tmodel(tx)

    runners["torch"] = run_torch
    return runners


def timed(runners, min_time):
    plans = {k: runners.pop(k) for k in list(runners) if k.startswith("_plan-")}
    t = time_alternating(runners, min_time)
    return {k: v["cpu_s"] * 1e6 for k, v in t.items()}, plans


def crossover(torch, min_time, seq=16, batches=(1, 2, 4, 8, 32, 128), hiddens=(8, 16, 32, 64, 128, 256)):
    rows = []
    rng = np.random.default_rng(0)
    for n in batches:
        for h in hiddens:
            x = rng.standard_normal((seq, n, h)).astype(np.float32)
            runners = predict_runners(torch, lambda h=h: lstm_net(h, h), lambda h=h: torch.nn.LSTM(h, h), x)
            us, plans = timed(runners, min_time)
            rows.append({"T": seq, "N": n, "H": h, "macs": seq * n * 4 * h * 2 * h, "us": us,
                         "taken": "lstm_layer [onednn]" in plans["_plan-onednn"]})
            print(f"N {n:4d} H {h:4d}: eigen {us['treadle-eigen']:9.1f} onednn {us['treadle-onednn']:9.1f} "
                  f"torch {us['torch']:9.1f} us, onednn taken: {rows[-1]['taken']}", flush=True)
    return rows


def w5(torch, min_time, seed=0):
    w = next(w for w in workloads.all_workloads() if w.name == "W5")
    torch.manual_seed(seed)
    tmodel = w.build_torch(torch).float().train()
    state = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    x, y = tb._data(w, np.random.default_rng(seed))
    trainers, nets = {}, {}
    for backend in BACKENDS:
        net = w.build_treadle(tl)
        net.load_state_dict(state)
        net.set_backend(backend)
        nets[backend] = net
        trainers[backend] = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
    topt = torch.optim.Adam(tmodel.parameters(), lr=1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step(k):
        for _ in range(k):
            topt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(tmodel(tx), ty)
            loss.backward()
            topt.step()

    train = {"treadle-" + b: (lambda k, tr=tr: [tr.step(x, y) for _ in range(k)]) for b, tr in trainers.items()}
    train["torch"] = torch_step
    train_us = {k: v["cpu_s"] * 1e6 for k, v in time_alternating(train, min_time).items()}
    infer = {"treadle-" + b: (lambda k, n=n: [n.predict(x) for _ in range(k)]) for b, n in nets.items()}

    def torch_infer(k):
        with torch.inference_mode():
            for _ in range(k):
                tmodel(tx)

    infer["torch"] = torch_infer
    infer_us = {k: v["cpu_s"] * 1e6 for k, v in time_alternating(infer, min_time).items()}
    plans = {b: n._compiled().describe_plans() for b, n in nets.items()}
    return {"train_us": train_us, "infer_us": infer_us, "plans": plans}


def feasibility(torch, min_time, seq=32, batch=32, inp=16, hidden=64):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((seq, batch, inp)).astype(np.float32)
    runners = predict_runners(torch, lambda: lstm_net(inp, hidden), lambda: torch.nn.LSTM(inp, hidden), x)
    runners.pop("torch")
    proj = tl.nn.Linear(hidden, 4 * hidden, bias=False)
    proj.set_backend("onednn")
    hs = rng.standard_normal((seq * batch, hidden)).astype(np.float32)
    out = proj.predict(hs)
    runners["recurrent product (onednn)"] = lambda k: [proj.predict(hs, out=out) for _ in range(k)]
    us, _ = timed(runners, min_time)
    return {"T": seq, "N": batch, "I": inp, "H": hidden, "us": us}


def markdown(cross, w5r, feas):
    lines = ["LSTM(H, H) predict, T = 16, one thread, CPU time (us); ratio = Eigen / oneDNN (> 1: oneDNN faster)", "",
             "| N | H | multiply-adds | eigen | onednn | torch | eigen / onednn | onednn taken |",
             "|---|---|---|---|---|---|---|---|"]
    for r in cross:
        u = r["us"]
        lines.append(f"| {r['N']} | {r['H']} | {r['macs']} | {u['treadle-eigen']:.1f} | {u['treadle-onednn']:.1f} | "
                     f"{u['torch']:.1f} | {u['treadle-eigen'] / u['treadle-onednn']:.2f} | {r['taken']} |")
    lines += ["", "W5 (LSTM seq 32, in 16, hidden 64, batch 32 -> 1, MSE), one thread, CPU time (us)", "",
              "| pass | treadle eigen | treadle onednn | torch |", "|---|---|---|---|"]
    for key, name in (("train_us", "training step"), ("infer_us", "inference")):
        u = w5r[key]
        lines.append(f"| {name} | {u['treadle-eigen']:.1f} | {u['treadle-onednn']:.1f} | {u['torch']:.1f} |")
    u = feas["us"]
    lines += ["", f"Training feasibility, LSTM T {feas['T']}, N {feas['N']}, I {feas['I']}, H {feas['H']} (us): "
              f"Eigen forward {u['treadle-eigen']:.1f}; oneDNN inference {u['treadle-onednn']:.1f} + recurrent "
              f"product {u['recurrent product (onednn)']:.1f} = "
              f"{u['treadle-onednn'] + u['recurrent product (onednn)']:.1f} before any gate arithmetic"]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-time", type=float, default=0.3, help="seconds of timed calls per runner")
    p.add_argument("--out", default=str(here / "results"))
    args = p.parse_args(argv)
    if "onednn" not in tl.backends():
        print("treadle was built without oneDNN (TREADLE_WITH_ONEDNN=ON); nothing to compare", file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(1)
    cross = crossover(torch, args.min_time)
    w5r = w5(torch, args.min_time * 3)
    feas = feasibility(torch, args.min_time * 3)
    table = markdown(cross, w5r, feas)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    result = {"machine": tb.machine_info(), "loadavg": os.getloadavg()[0], "crossover": cross, "w5": w5r,
              "feasibility": feas}
    Path(args.out, "onednn_rnn.json").write_text(json.dumps(result, indent=1))
    Path(args.out, "onednn_rnn.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
