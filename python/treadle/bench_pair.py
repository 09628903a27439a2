"""One benchmark workload built in treadle and in PyTorch with the same weights and data (bench.py)."""
import concurrent.futures

import numpy as np

from .bench_timing import time_alternating

LOSS_CHECK_TOL = 1e-4   # first-step loss agreement, relative to max(1, |loss|)
INFER_CHECK_TOL = 1e-4  # inference output agreement, relative to max(1, max |output|)


def treadle_loss(w, tl):
    """Workload w's loss in treadle: a custom loss is fn(output, target, input)."""
    if w.loss == "custom":
        F = tl.functional
        return w.custom_loss(F, F.grad, F.ones_like)
    return tl.loss.MSE() if w.loss == "mse" else tl.loss.CrossEntropy()


def torch_loss(w, torch, tx):
    """Workload w's loss in PyTorch, fn(output, target); a custom loss reads the input tensor tx."""
    if w.loss == "custom":
        grad = lambda out, x, g: torch.autograd.grad(out, x, g, create_graph=True)  # noqa: E731
        fn = w.custom_loss(torch, grad, torch.ones_like)
        return lambda out, y: fn(out, y, tx)
    return torch.nn.MSELoss() if w.loss == "mse" else torch.nn.CrossEntropyLoss()


# -- one workload ---------------------------------------------------------------------------------
class Missing(Exception):
    """The workload needs a treadle layer or op that does not exist yet."""


def _data(w, rng):
    x = rng.standard_normal((w.batch,) + tuple(w.sample_shape)).astype(np.float32)
    if w.loss in ("mse", "custom"):
        y = rng.standard_normal((w.batch, w.out_features)).astype(np.float32)
    else:
        y = rng.integers(0, w.out_features, size=w.batch).astype(np.int64)
    return x, y


def _as_arrays(out):
    """A model's output(s) as a list of numpy arrays (a multi-output model returns a tuple)."""
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o.detach().numpy() if hasattr(o, "detach") else np.asarray(o) for o in outs]


class Pair:
    """One workload built in both frameworks with the same weights, plus its data."""

    def __init__(self, w, tl, torch, seed, torch_adam="default", lr=1e-3):
        self.w, self.torch = w, torch
        self._pool, self.context = None, None  # set_workers: the executor lent to treadle
        torch.manual_seed(seed)
        self.tmodel = w.build_torch(torch).float()
        self.x, self.y = _data(w, np.random.default_rng(seed))
        self.tx, self.ty = torch.from_numpy(self.x), torch.from_numpy(self.y)
        if w.input_grad:
            self.tx.requires_grad_(True)
        try:
            self.model = w.build_treadle(tl)
            self.model.load_state_dict({k: v.detach().numpy() for k, v in self.tmodel.state_dict().items()})
            if w.train:
                self.trainer = self._make_trainer(tl, lr)
        except (AttributeError, NotImplementedError) as e:
            raise Missing(f"{type(e).__name__}: {e}") from e
        self._place_torch_model()
        if w.train:
            self.tloss = self._torch_loss(torch)
            kw = {} if torch_adam == "default" else {torch_adam: True}
            self.topt = torch.optim.Adam(self.tmodel.parameters(), lr=lr, **kw)

    def _torch_loss(self, torch):
        return torch_loss(self.w, torch, self.tx)

    def _make_trainer(self, tl, lr, executor=None):
        self.loss = treadle_loss(self.w, tl)
        return tl.Trainer(self.model, self.loss, tl.optim.Adam(lr=lr), executor=executor)

    def set_workers(self, tl, workers, lr=1e-3):
        """treadle on `workers` lent workers, as a Python host lends them: a host-owned
        ThreadPoolExecutor of workers - 1 threads, plus the calling thread, through tl.PoolExecutor
        (the trainer is rebuilt with it: a fresh Adam state, which timing does not care about)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        executor = None
        if workers > 1:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers - 1)
            executor = tl.PoolExecutor(self._pool, workers)
        self.context = tl.Context(executor=executor) if executor is not None else None
        if self.w.train:
            self.trainer = self._make_trainer(tl, lr, executor)

    def _place_torch_model(self):
        """Where the PyTorch module computes (the CPU here; bench_device.DevicePair: the GPU)."""

    # One step each; run(k) wrappers below do k of them.
    def treadle_train(self):
        return self.trainer.step(self.x, self.y)

    def torch_train(self):
        self.topt.zero_grad(set_to_none=True)
        loss = self.tloss(self.tmodel(self.tx), self.ty)
        loss.backward()
        self.topt.step()
        return loss.detach()  # a 0-d tensor; float() of it is the read-back, outside the timed loop

    def torch_infer(self):
        return self.tmodel(self.tx)

    def check(self):
        """Inference outputs and (when training) the first two step losses must agree."""
        torch = self.torch
        self.tmodel.eval()
        with torch.inference_mode():
            ref = _as_arrays(self.torch_infer())
        got = _as_arrays(self.model.predict(self.x))
        scale = max(1.0, max(float(np.max(np.abs(r))) for r in ref))
        same = len(got) == len(ref) and all(a.shape == b.shape for a, b in zip(got, ref))
        c = {"infer_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(got, ref)) if same else None}
        c["ok"] = c["infer_max_abs_diff"] is not None and c["infer_max_abs_diff"] <= INFER_CHECK_TOL * scale
        if self.w.train:
            self.tmodel.train()
            losses = [(self.treadle_train(), float(self.torch_train())) for _ in range(2)]
            (a, b), (a2, b2) = losses
            c.update(loss_treadle=a, loss_torch=b, loss_abs_diff=abs(a - b), step2_loss_treadle=a2,
                     step2_loss_torch=b2, step2_abs_diff=abs(a2 - b2))
            if self.w.stochastic:  # different noise: the losses differ by design (tests compare with replayed noise)
                c["loss_check"] = "skipped: noise in the forward"
            else:
                c["ok"] = c["ok"] and abs(a - b) <= LOSS_CHECK_TOL * max(1.0, abs(b))
        return c

    def time_train(self, min_time, warmup):
        self.tmodel.train()

        def tl_run(k):
            for _ in range(k):
                self.trainer.step(self.x, self.y)

        def torch_run(k):
            for _ in range(k):
                self.torch_train()

        return time_alternating({"treadle": tl_run, "torch": torch_run}, min_time, warmup)

    def time_infer(self, min_time, warmup):
        self.tmodel.eval()
        torch = self.torch

        def tl_run(k):
            for _ in range(k):
                self.model.predict(self.x, context=self.context)

        def torch_run(k):
            with torch.inference_mode():  # entered once per round: the cheapest way a user calls torch
                for _ in range(k):
                    self.torch_infer()

        return time_alternating({"treadle": tl_run, "torch": torch_run}, min_time, warmup)
