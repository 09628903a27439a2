"""CUDA arrays (anything with __cuda_array_interface__: CuPy, torch CUDA tensors) as the inputs,
targets and predict outputs of a model on backend "cuda": copied on the device, never read on the host.

Without CUDA support, or with a model on a CPU backend, they are refused with TypeError before any
data is touched; the fakes below carry only the interface (their pointer is never dereferenced).
The device tests need a CUDA build, a GPU and torch with CUDA (bench/gpu_check.sh runs them)."""
import numpy as np
import pytest

import treadle as tl


class FakeCudaArray:
    """The CUDA array interface (version 3) over a pointer nothing reads."""

    def __init__(self, shape, typestr="<f4", strides=None, readonly=False, stream=None, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, readonly),
                                         "strides": strides, "version": 3}
        if stream is not None:
            self.__cuda_array_interface__["stream"] = stream


def mlp():
    return tl.nn.Sequential(tl.nn.Linear(4, 8), tl.nn.Tanh(), tl.nn.Linear(8, 3))


HAS_CUDA = "cuda" in tl.backends()


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA build takes CUDA arrays")
def test_cpu_build_refuses_cuda_arrays_naming_the_build():
    model = mlp()
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    with pytest.raises(TypeError, match="no CUDA support"):
        trainer.step(FakeCudaArray((5, 4)), np.zeros((5, 3), np.float32))
    with pytest.raises(TypeError, match="no CUDA support"):
        model.predict(FakeCudaArray((5, 4)))


def test_host_only_entry_points_name_the_cuda_array():
    """run_op, load_state_dict and friends read host memory: a CUDA array gets a TypeError saying where
    device arrays are taken."""
    with pytest.raises(TypeError, match="got a CUDA array .*backend 'cuda'"):
        tl._core.run_op("relu", [FakeCudaArray((3,))], {}, None, "eigen", True, 0)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA build")
class TestValidationInACudaBuild:
    """Checks made before the runtime is asked anything (no device needed)."""

    def trainer(self):
        return tl.Trainer(mlp(), tl.loss.MSE(), tl.optim.SGD(lr=0.1))

    @pytest.mark.parametrize("typestr", ["<f2", ">f4", "|u1"])
    def test_unsupported_type(self, typestr):
        with pytest.raises(TypeError, match=f"unsupported CUDA array type '{typestr}'"):
            self.trainer().step(FakeCudaArray((5, 4), typestr=typestr), np.zeros((5, 3), np.float32))

    def test_not_c_contiguous(self):
        with pytest.raises(ValueError, match="not C-contiguous"):
            self.trainer().step(FakeCudaArray((5, 4), strides=(4, 20)), np.zeros((5, 3), np.float32))

    def test_read_only_out(self):
        model = mlp()
        with pytest.raises(ValueError, match="read-only"):
            model.predict(np.zeros((5, 4), np.float32), out=FakeCudaArray((5, 3), readonly=True))

    def test_stream_zero_is_refused(self):
        with pytest.raises(ValueError, match="stream must not be 0"):
            self.trainer().step(FakeCudaArray((0, 4), stream=0), np.zeros((0, 3), np.float32))


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not HAS_CUDA or not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of treadle and torch with a GPU")
    return torch


def _pair(seed=3):
    a, b = mlp(), mlp()
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        m.set_backend("cuda")
    return a, b


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_device_arrays_train_exactly_as_host_arrays(cuda_graph):
    torch = _torch_cuda()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    y = rng.standard_normal((16, 3)).astype(np.float32)
    host_model, dev_model = _pair()
    host = tl.Trainer(host_model, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), cuda_graph=cuda_graph)
    dev = tl.Trainer(dev_model, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), cuda_graph=cuda_graph)
    xd, yd = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    for _ in range(5):  # the same bytes reach the same kernels: bitwise equal
        assert dev.step(xd, yd) == host.step(x, y)
    for k, v in host_model.state_dict().items():
        np.testing.assert_array_equal(dev_model.state_dict()[k], v)
    out = torch.empty((16, 3), device="cuda")
    dev_model.predict(xd, out=out)
    np.testing.assert_array_equal(out.cpu().numpy(), host_model.predict(x))


def test_device_labels_out_of_range_leave_the_parameters():
    torch = _torch_cuda()
    model = mlp()
    model.set_backend("cuda")
    trainer = tl.Trainer(model, tl.loss.CrossEntropy(), tl.optim.SGD(lr=0.1))
    before = {k: np.array(v) for k, v in model.state_dict().items()}
    x = torch.zeros((4, 4), device="cuda")
    labels = torch.tensor([0, 1, 7, 2], device="cuda")
    with pytest.raises(ValueError, match="outside \\[0, 3\\)"):
        trainer.step(x, labels)
    for k, v in before.items():
        np.testing.assert_array_equal(model.state_dict()[k], v)


def test_cpu_model_refuses_device_arrays():
    torch = _torch_cuda()
    trainer = tl.Trainer(mlp(), tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    with pytest.raises(TypeError, match="on cuda:0 but the model runs on the CPU"):
        trainer.step(torch.zeros((2, 4), device="cuda"), np.zeros((2, 3), np.float32))
