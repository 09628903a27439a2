"""torch.nn.functional's remaining activations, normalize and constant pad (compositions of treadle's
ops): values and gradients against torch in float64, through a traced forward."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import treadle as tl
import treadle.functional as F
from opcheck import param_grads

# (id, treadle function, torch function); inputs avoid the kinks (|x| in [0.1, 3] apart from +-3/6 etc.)
CASES = [
    ("relu6", F.relu6, TF.relu6),
    ("hardtanh", lambda x: F.hardtanh(x, -0.5, 1.5), lambda x: TF.hardtanh(x, -0.5, 1.5)),
    ("hardsigmoid", F.hardsigmoid, TF.hardsigmoid),
    ("hardswish", F.hardswish, TF.hardswish),
    ("logsigmoid", F.logsigmoid, TF.logsigmoid),
    ("mish", F.mish, TF.mish),
    ("selu", F.selu, TF.selu),
    ("celu", lambda x: F.celu(x, 0.7), lambda x: TF.celu(x, 0.7)),
    ("softsign", F.softsign, TF.softsign),
    ("tanhshrink", F.tanhshrink, TF.tanhshrink),
    ("normalize_p2", lambda x: F.normalize(x, dim=1), lambda x: TF.normalize(x, dim=1)),
    ("normalize_p1_dim0", lambda x: F.normalize(x, p=1, dim=0), lambda x: TF.normalize(x, p=1, dim=0)),
    ("normalize_p3", lambda x: F.normalize(x, p=3, dim=-1), lambda x: TF.normalize(x, p=3, dim=-1)),
    ("pad_last", lambda x: F.pad(x, (1, 2)), lambda x: TF.pad(x, (1, 2))),
    ("pad_two_dims_value", lambda x: F.pad(x, (0, 1, 3, 2), value=-1.5), lambda x: TF.pad(x, (0, 1, 3, 2), value=-1.5)),
    ("pad_crop", lambda x: F.pad(x, (-1, 2, 1, -2)), lambda x: TF.pad(x, (-1, 2, 1, -2))),
    ("pad_wider_than_input", lambda x: F.pad(x, (9, 0)), lambda x: TF.pad(x, (9, 0))),
]


# torch's backward kernels for these use float32 constants even in float64 (hardsigmoid's slope is
# float(1/6), celu's scale 1/alpha likewise), a relative error of ~3e-8; ours are exact.
TORCH_FLOAT32_CONSTANTS = {"hardsigmoid", "celu"}


class Head(tl.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fc = tl.nn.Linear(4, 4)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.fc(x))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_torch(case, rng):
    name, ours_fn, torch_fn = case
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 4).double()
    net = Head(ours_fn).double()
    net.load_state_dict({"fc." + k: v for k, v in ref.state_dict().items()})
    x = 1.5 * rng.standard_normal((5, 4))
    y_ref = torch_fn(ref(torch.tensor(x)))
    np.testing.assert_allclose(net.predict(x), y_ref.detach().numpy(), rtol=1e-12, atol=1e-14)
    g = rng.standard_normal(tuple(y_ref.shape))
    trainer = tl.Trainer(net, lambda out, t: (out * t).sum(), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    trainer.compute_gradients(x, g)
    (y_ref * torch.tensor(g)).sum().backward()
    rtol = 1e-7 if name in TORCH_FLOAT32_CONSTANTS else 1e-10
    np.testing.assert_allclose(param_grads(net)["fc.weight"], ref.weight.grad.numpy(), rtol=rtol, atol=1e-12)


def test_refusals_name_the_argument(rng):
    x = rng.standard_normal((2, 3))
    model = Head(lambda v: F.pad(v, (1, 1), mode="symmetric")).double()
    with pytest.raises(ValueError, match="mode must be 'constant', 'reflect', 'replicate' or 'circular'"):
        model.predict(rng.standard_normal((2, 4)))
    with pytest.raises(ValueError, match="even length"):
        Head(lambda v: F.pad(v, (1, 1, 1))).double().predict(rng.standard_normal((2, 4)))
    with pytest.raises(ValueError, match="min_val"):
        Head(lambda v: F.hardtanh(v, 1.0, -1.0)).double().predict(x[:, :2].repeat(2, 1))


@pytest.mark.parametrize("kw", [{"scale_factor": 2}, {"size": (5, 7)}, {"scale_factor": 1.5, "mode": "bilinear"},
                                {"size": (3, 9), "mode": "bilinear", "align_corners": True}])
def test_interpolate_is_torchs(kw):
    """F.interpolate records nn.Upsample's op: values and input gradients equal torch's (float64)."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))

    class Net(tl.nn.Module):
        def forward(self, x):
            return F.interpolate(x, **kw)

    tx = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.interpolate(tx, **kw)
    net = Net().double().eval()
    np.testing.assert_allclose(net(x), ref.detach().numpy(), rtol=1e-12, atol=1e-13)
    seed = np.random.default_rng(1).standard_normal(ref.shape)
    trainer = tl.Trainer(Net().double(), tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    trainer.forward(x, input_grad=True)
    grad_x = trainer.backward(seed, input_grad=True)
    ref.backward(torch.tensor(seed))
    np.testing.assert_allclose(grad_x, tx.grad.numpy(), rtol=1e-11, atol=1e-12)


def test_one_hot_is_torchs_on_data():
    y = np.array([[0, 3], [2, 1]])
    np.testing.assert_array_equal(F.one_hot(y), torch.nn.functional.one_hot(torch.tensor(y)).numpy())
    np.testing.assert_array_equal(F.one_hot(y, 6), torch.nn.functional.one_hot(torch.tensor(y), 6).numpy())
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        F.one_hot(y, 3)
    with pytest.raises(TypeError, match="integer"):
        F.one_hot(y.astype(float))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_hot_in_a_loss_is_torchs(dtype):
    """Inside a traced loss: 0/1 in the model's dtype (torch: int64 then .float()), e.g. a hand-written
    cross entropy; loss and gradients equal torch's."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 5).to(getattr(torch, dtype))
    net = tl.nn.Sequential(tl.nn.Linear(4, 5)).to(dtype)
    tl.io.from_torch(torch.nn.Sequential(ref), net)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 4)).astype(dtype), rng.integers(0, 5, 6)

    def loss(out, target):
        return -(F.log_softmax(out, -1) * F.one_hot(target, 5, dtype=dtype)).sum() / 6

    trainer = tl.Trainer(net, loss, tl.optim.SGD(lr=0.0))
    ours = trainer.compute_gradients(x, y)
    logits = ref(torch.tensor(x))
    theirs = -(TF.log_softmax(logits, -1) * TF.one_hot(torch.tensor(y), 5).to(logits.dtype)).sum() / 6
    theirs.backward()
    tol = 1e-5 if dtype == "float32" else 1e-12
    assert ours == pytest.approx(theirs.item(), rel=tol)
    np.testing.assert_allclose(net.named_gradients()["0.weight"], ref.weight.grad.numpy(), rtol=tol, atol=tol)


def test_one_hot_in_a_forward_takes_the_model_dtype_and_checks_its_range():
    class Net(tl.nn.Module):
        def forward(self, labels):
            return F.one_hot(labels, 4)

    out = Net().eval()(np.array([[0, 3], [2, 1]]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, TF.one_hot(torch.tensor([[0, 3], [2, 1]]), 4).numpy())
    with pytest.raises(ValueError, match=r"one_hot: class value 4 is out of range \[0, 4\)"):
        Net().eval()(np.array([1, 4]))

    class NoClasses(tl.nn.Module):
        def forward(self, labels):
            return F.one_hot(labels)

    with pytest.raises(ValueError, match="num_classes must be given"):
        NoClasses().eval()(np.array([1, 2]))

