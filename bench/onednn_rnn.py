"""LSTM and GRU layers on oneDNN vs Eigen vs PyTorch, 1 thread, CPU time of the calling thread.

    TREADLE_BUILD_DIR=$PWD/build/onednn PYTHONPATH=$PWD/python python bench/onednn_rnn.py [--min-time 0.3]
        [--parts crossover,w5,training]

Three parts, all timed in alternating rounds (bench/onednn_mlp.py's time_alternating), medians:

1. crossover: predict of one LSTM(H, H) or GRU(H, H) layer over T = 16 steps, batch N, returning
   the output sequence, pinned to "eigen" and to "onednn" (compiled with oneDNN's speed thresholds
   off, so it takes lstm_layer and gru_layer in inference plans at every size), and
   torch.nn.LSTM/GRU under inference_mode, over a grid of N and H;
2. W5 (bench/workloads.py: LSTM seq 32, input 16, hidden 64, batch 32 -> Linear -> 1, MSE): the
   training step (zero-grad + forward + MSE + backward + Adam) and inference, for the three;
3. training crossover: the gradient pass (forward + MSE + backward) of one LSTM(H, H) or GRU(H, H)
   layer over T = 16 steps, pinned to "eigen" and to "onednn" (the forward_training/backward pair,
   thresholds off),
   and torch autograd, over a grid of N and H.

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


def recurrent_net(cell, input_size, hidden):
    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(tl.nn, cell)(input_size, hidden)

        def forward(self, x):
            return self.rnn(x)[0]

    return Net()


def predict_runners(torch, make_treadle, make_torch, x):
    """{name: run(k)} for treadle predict per backend (same weights) and torch inference (a bare
    torch.nn.LSTM/GRU: its parameters sit under "rnn." in the treadle net)."""
    tmodel = make_torch().float().eval()
    state = {"rnn." + k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    runners = {}
    for backend in BACKENDS:
        net = make_treadle()
        net.load_state_dict(state)
        net.set_backend(backend)
        with forced_kernels():
            out = net.predict(x)
        runners["treadle-" + backend] = lambda k, net=net, out=out: [net.predict(x, out=out) for _ in range(k)]
        runners["_plan-" + backend] = default_plans(make_treadle(), state, backend, lambda n: n.predict(x))
    tx = torch.from_numpy(x)

    def run_torch(k):
        with torch.inference_mode():
            for _ in range(k):
                tmodel(tx)

    runners["torch"] = run_torch
    return runners


def forced_kernels():
    """Plans compiled inside take oneDNN's recurrent kernels at every size (its speed thresholds off):
    the crossover measures the kernels, and "taken" says what the default rules choose."""
    return tl._core.AllKernels()


def default_plans(net, state, backend, compile_plans):
    """The plans `net` gets from the default rules (what "taken" reports), compiled by compile_plans(net)."""
    net.load_state_dict(state)
    net.set_backend(backend)
    compile_plans(net)
    return net._compiled().describe_plans()


def timed(runners, min_time):
    plans = {k: runners.pop(k) for k in list(runners) if k.startswith("_plan-")}
    t = time_alternating(runners, min_time)
    return {k: v["cpu_s"] * 1e6 for k, v in t.items()}, plans


def crossover(torch, min_time, cell="LSTM", seq=16, batches=(1, 2, 4, 8, 32, 128),
              hiddens=(8, 16, 32, 64, 128, 256)):
    rows = []
    rng = np.random.default_rng(0)
    gates = 4 if cell == "LSTM" else 3
    for n in batches:
        for h in hiddens:
            x = rng.standard_normal((seq, n, h)).astype(np.float32)
            runners = predict_runners(torch, lambda h=h: recurrent_net(cell, h, h),
                                      lambda h=h: getattr(torch.nn, cell)(h, h), x)
            us, plans = timed(runners, min_time)
            rows.append({"cell": cell, "T": seq, "N": n, "H": h, "macs": seq * n * gates * h * 2 * h, "us": us,
                         "taken": f"{cell.lower()}_layer [onednn]" in plans["_plan-onednn"]})
            print(f"{cell} N {n:4d} H {h:4d}: eigen {us['treadle-eigen']:9.1f} onednn {us['treadle-onednn']:9.1f} "
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


def training_crossover(torch, min_time, seq=16, batches=(2, 4, 8, 32, 128), hiddens=(16, 32, 64, 128)):
    """Gradient pass (forward + MSE + backward, no update) of one LSTM(H, H) or GRU(H, H) layer over
    T = 16 steps, pinned to "eigen" and to "onednn" (which takes the forward_training/backward pair),
    and torch's autograd."""
    rows = []
    rng = np.random.default_rng(1)
    for cell in ("LSTM", "GRU"):
        for n in batches:
            for h in hiddens:
                x = rng.standard_normal((seq, n, h)).astype(np.float32)
                y = rng.standard_normal((seq, n, h)).astype(np.float32)
                tmodel = getattr(torch.nn, cell)(h, h).float()
                state = {"rnn." + k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
                runners, plans = {}, {}
                for backend in BACKENDS:
                    net = recurrent_net(cell, h, h)
                    net.load_state_dict(state)
                    net.set_backend(backend)
                    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
                    with forced_kernels():
                        trainer.compute_gradients(x, y)
                    runners["treadle-" + backend] = lambda k, tr=trainer: [tr.compute_gradients(x, y) for _ in range(k)]
                    plans[backend] = default_plans(
                        recurrent_net(cell, h, h), state, backend,
                        lambda n: tl.Trainer(n, tl.loss.MSE(), tl.optim.SGD(lr=0.0)).compute_gradients(x, y))
                tx, ty = torch.from_numpy(x), torch.from_numpy(y)

                def torch_grads(k, tmodel=tmodel, tx=tx, ty=ty):
                    for _ in range(k):
                        tmodel.zero_grad(set_to_none=True)
                        torch.nn.functional.mse_loss(tmodel(tx)[0], ty).backward()

                runners["torch"] = torch_grads
                us = {k: v["cpu_s"] * 1e6 for k, v in time_alternating(runners, min_time).items()}
                op = cell.lower() + "_layer_backward [onednn]"
                rows.append({"cell": cell, "T": seq, "N": n, "H": h, "macs": seq * n * (4 if cell == "LSTM" else 3) * h * 2 * h,
                             "us": us, "taken": op in plans["onednn"]})
                print(f"{cell} N {n:4d} H {h:4d}: eigen {us['treadle-eigen']:9.1f} onednn {us['treadle-onednn']:9.1f} "
                      f"torch {us['torch']:9.1f} us, onednn taken: {rows[-1]['taken']}", flush=True)
    return rows


def markdown(cross, w5r, train_cross):
    lines = ["LSTM(H, H) / GRU(H, H) predict, T = 16, one thread, CPU time (us); ratio = Eigen / oneDNN "
             "(> 1: oneDNN faster)", "",
             "| cell | N | H | multiply-adds | eigen | onednn | torch | eigen / onednn | onednn taken |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in cross:
        u = r["us"]
        lines.append(f"| {r['cell']} | {r['N']} | {r['H']} | {r['macs']} | {u['treadle-eigen']:.1f} | {u['treadle-onednn']:.1f} | "
                     f"{u['torch']:.1f} | {u['treadle-eigen'] / u['treadle-onednn']:.2f} | {r['taken']} |")
    if w5r:
        lines += ["", "W5 (LSTM seq 32, in 16, hidden 64, batch 32 -> 1, MSE), one thread, CPU time (us)", "",
                  "| pass | treadle eigen | treadle onednn | torch |", "|---|---|---|---|"]
        for key, name in (("train_us", "training step"), ("infer_us", "inference")):
            u = w5r[key]
            lines.append(f"| {name} | {u['treadle-eigen']:.1f} | {u['treadle-onednn']:.1f} | {u['torch']:.1f} |")
    lines += ["", "One LSTM(H, H) / GRU(H, H) layer, gradient pass (forward + MSE + backward), T = 16, one thread, "
              "CPU time (us); ratio = Eigen / oneDNN", "",
              "| cell | N | H | multiply-adds (forward) | eigen | onednn | torch | eigen / onednn | onednn taken |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in train_cross:
        u = r["us"]
        lines.append(f"| {r['cell']} | {r['N']} | {r['H']} | {r['macs']} | {u['treadle-eigen']:.1f} | "
                     f"{u['treadle-onednn']:.1f} | {u['torch']:.1f} | {u['treadle-eigen'] / u['treadle-onednn']:.2f} | "
                     f"{r['taken']} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-time", type=float, default=0.3, help="seconds of timed calls per runner")
    p.add_argument("--out", default=str(here / "results"))
    p.add_argument("--parts", default="crossover,w5,training", help="comma-separated: crossover, w5, training")
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    if "onednn" not in tl.backends():
        print("treadle was built without oneDNN (TREADLE_WITH_ONEDNN=ON); nothing to compare", file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(1)
    cross = []
    if "crossover" in parts:
        cross = crossover(torch, args.min_time) + crossover(torch, args.min_time, "GRU", batches=(1, 2, 4, 8, 32, 128),
                                                             hiddens=(16, 32, 64, 128))
    w5r = w5(torch, args.min_time * 3) if "w5" in parts else None
    train_cross = training_crossover(torch, args.min_time) if "training" in parts else []
    table = markdown(cross, w5r, train_cross)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    result = {"machine": tb.machine_info(), "loadavg": os.getloadavg()[0], "crossover": cross, "w5": w5r,
              "training_crossover": train_cross}
    Path(args.out, "onednn_rnn.json").write_text(json.dumps(result, indent=1))
    Path(args.out, "onednn_rnn.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
