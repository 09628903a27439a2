"""BatchNorm1d/2d/3d and GroupNorm with torch's keyword bias=False (an affine weight, no bias) against
torch: parameter names, training-step outputs, input and weight gradients, running statistics and
eval outputs, in float32 and float64; saving keeps the layout."""
import numpy as np
import pytest
import torch

import treadle as tl
from opcheck import assert_grads_like_torch

LAYERS = [("BatchNorm1d", (3,), (4, 3, 5)), ("BatchNorm2d", (3,), (2, 3, 4, 4)), ("BatchNorm3d", (2,), (2, 2, 3, 2, 2)),
          ("GroupNorm", (2, 4), (3, 4, 5))]
TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-11, atol=1e-12)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,args,shape", LAYERS, ids=[layer[0] for layer in LAYERS])
def test_bias_false_is_torchs(name, args, shape, dtype):
    ref = getattr(torch.nn, name)(*args, bias=False, dtype=torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        ref.weight.copy_(torch.linspace(0.5, 1.5, ref.weight.numel()))
    layer = getattr(tl.nn, name)(*args, bias=False, dtype=dtype)
    net = tl.nn.Sequential(layer).to(np.dtype(dtype).name)
    assert [n for n, _ in net.named_parameters()] == ["0.weight"]
    net[0].weight[...] = ref.weight.detach().numpy()
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    g = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    tx = torch.tensor(x, requires_grad=True)
    ref.train()
    y_ref = ref(tx)
    y_ref.backward(torch.tensor(g))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    y = trainer.forward(x, input_grad=True)
    dx = trainer.backward(g, input_grad=True)
    np.testing.assert_allclose(y, y_ref.detach().numpy(), **TOL[dtype])
    np.testing.assert_allclose(dx, tx.grad.numpy(), **TOL[dtype])
    assert_grads_like_torch(net, ref, prefix="0.", **TOL[dtype])
    if name.startswith("BatchNorm"):
        np.testing.assert_allclose(layer.running_mean, ref.running_mean.numpy(), **TOL[dtype])
        np.testing.assert_allclose(layer.running_var, ref.running_var.numpy(), **TOL[dtype])
    ref.eval()
    np.testing.assert_allclose(net.eval()(x), ref(torch.tensor(x)).detach().numpy(), **TOL[dtype])


def test_saved_and_loaded(tmp_path):
    net = tl.nn.Sequential(tl.nn.BatchNorm1d(3, bias=False), tl.nn.GroupNorm(1, 3, bias=False))
    tl.save(net, tmp_path / "norms.treadle")
    back = tl.load(tmp_path / "norms.treadle")
    assert [n for n, _ in back.named_parameters()] == ["0.weight", "1.weight"]
    assert [n for n, _ in back.named_buffers()] == ["0.running_mean", "0.running_var", "0.num_batches_tracked"]
