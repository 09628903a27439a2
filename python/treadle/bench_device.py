"""The benchmark pair on a GPU: `python -m treadle bench --device cuda` (a CUDA build and a GPU).

treadle runs the workload with `model.set_backend("cuda")`: `Trainer.step` and `predict` take host
arrays, upload them, and read the loss (or the prediction) back, so every timed step includes one
host-to-device copy of the batch and one synchronising read-back. PyTorch is timed doing the same
work under the same conditions: the batch copied from host memory each step (`.to("cuda")`), the
loss read back with `.item()` (the prediction with `.cpu()`). TF32 is off on both sides: treadle's
float32 products are exact float32 (cuBLASLt without TF32, cuDNN FMA-only convolutions).
"""
from .bench_pair import Pair

DEVICE = "cuda"


def device_info(torch):
    """Name and capability of the GPU, for the report's header."""
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda}


def require_device(tl, torch):
    """SystemExit with what is missing, before anything is built."""
    if "cuda" not in tl.backends():
        raise SystemExit("bench --device cuda: this treadle build has no CUDA backend (build with "
                         "-DTREADLE_WITH_CUDA=ON, docs/cuda.md)")
    if not torch.cuda.is_available():
        raise SystemExit(f"bench --device cuda: torch {torch.__version__} sees no CUDA device")


class DevicePair(Pair):
    """Pair on the GPU: treadle's model on backend "cuda", PyTorch's module on cuda:0."""

    def __init__(self, w, tl, torch, seed, torch_adam="default", lr=1e-3):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self._tl = tl
        super().__init__(w, tl, torch, seed, torch_adam, lr)

    def _make_trainer(self, tl, lr):
        self.model.set_backend(DEVICE)  # before the trainer: its optimizer state starts on the device
        return super()._make_trainer(tl, lr)

    def _place_torch_model(self):
        self.tmodel.to(DEVICE)

    def torch_train(self):
        self.topt.zero_grad(set_to_none=True)
        loss = self.tloss(self.tmodel(self.tx.to(DEVICE)), self.ty.to(DEVICE))
        loss.backward()
        self.topt.step()
        return loss.item()  # the read-back treadle's step makes too

    def torch_infer(self):
        return self.tmodel(self.tx.to(DEVICE)).cpu()
