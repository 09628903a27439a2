"""Every tl.nn class that torch.nn also has takes torch's constructor arguments (by name) and torch's
forward arguments (by name, in torch's order; treadle may add trailing ones such as `lengths`), so a
model written against torch keeps working with its keyword and positional calls. Plus the forward
options that needed work of their own: ConvTranspose's output_size and MultiheadAttention's order."""
import inspect

import numpy as np
import pytest
import torch

import treadle as tl

SKIP = {"Module"}  # the base class: forward is the user's


def shared_classes():
    for name in sorted(dir(tl.nn)):
        ours, theirs = getattr(tl.nn, name), getattr(torch.nn, name, None)
        if isinstance(ours, type) and isinstance(theirs, type) and name not in SKIP:
            yield name, ours, theirs


def params(fn):
    return [p for p in inspect.signature(fn).parameters if p not in ("self", "args", "kwargs")]


@pytest.mark.parametrize("name,ours,theirs", list(shared_classes()), ids=lambda v: v if isinstance(v, str) else "")
def test_constructor_takes_torchs_arguments(name, ours, theirs):
    mine = set(params(ours.__init__)) | (set(params(ours.__new__)) if "__new__" in ours.__dict__ else set())
    takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(ours.__init__).parameters.values())
    missing = set(params(theirs.__init__)) - mine - {"device", "dtype"}  # every class takes those two
    assert takes_any or not missing, f"{name} lacks torch's {sorted(missing)}"


@pytest.mark.parametrize("name,ours,theirs", list(shared_classes()), ids=lambda v: v if isinstance(v, str) else "")
def test_forward_takes_torchs_arguments_in_order(name, ours, theirs):
    if name in ("Sequential", "ModuleList", "ModuleDict"):
        return  # containers: torch's forward(input) is Sequential's, the lists have none
    theirs_params = params(theirs.forward)
    assert params(ours.forward)[:len(theirs_params)] == theirs_params


def test_keyword_input_reaches_the_layer():
    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act = tl.nn.Linear(3, 2), tl.nn.Tanh()

        def forward(self, x):
            return self.act(input=self.fc(input=x))

    net = Net().eval()
    x = np.ones((4, 3), np.float32)
    np.testing.assert_allclose(net(x), np.tanh(x @ net.fc.weight.T + net.fc.bias), rtol=1e-6)


@pytest.mark.parametrize("nd,shape,kw,size", [
    (2, (2, 2, 4, 4), dict(kernel_size=3, stride=2, padding=1), (8, 8)),
    (2, (2, 2, 4, 4), dict(kernel_size=3, stride=2, padding=1), (2, 3, 7, 8)),
    (1, (2, 5), dict(kernel_size=2, stride=3, dilation=2), (16,)),  # unbatched (C, L): 14 to 16
    (3, (1, 2, 2, 3, 2), dict(kernel_size=2, stride=2, groups=2), (4, 7, 5)),
])
def test_conv_transpose_output_size_is_torchs(nd, shape, kw, size):
    torch.manual_seed(0)
    ref = getattr(torch.nn, f"ConvTranspose{nd}d")(2, 4 if kw.get("groups") else 3, **kw, dtype=torch.float64)

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = getattr(tl.nn, f"ConvTranspose{nd}d")(2, 4 if kw.get("groups") else 3, **kw)

        def forward(self, x):
            return self.up(x, output_size=size)

    net = Net().double()
    net.up.weight[...] = ref.weight.detach().numpy()
    net.up.bias[...] = ref.bias.detach().numpy()
    x = np.random.default_rng(0).standard_normal(shape)
    tx = torch.tensor(x, requires_grad=True)
    y = ref(tx, output_size=size)
    g = np.random.default_rng(1).standard_normal(y.shape)
    y.backward(torch.tensor(g))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    out = trainer.forward(x, input_grad=True)
    dx = trainer.backward(g, input_grad=True)
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_conv_transpose_bad_output_size_is_named():
    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = tl.nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1)

        def forward(self, x):
            return self.up(x, output_size=(9, 8))

    with pytest.raises(ValueError, match=r"requested an output size of \[9, 8\], but valid sizes range from \[7, 7\] "
                                         r"to \[8, 8\]"):
        Net().eval()(np.zeros((1, 2, 4, 4), np.float32))


def test_attention_positional_order_is_torchs():
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64)
    mha = tl.nn.MultiheadAttention(4, 2, batch_first=True, dtype="float64")

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, q):
            # torch's positional order: key_padding_mask, need_weights, attn_mask, average_attn_weights
            return self.mha(q, q, q, None, True, None, True)

    net = Net().double()
    state = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    net.mha.load_state_dict(state)
    q = np.random.default_rng(2).standard_normal((2, 3, 4))
    out, weights = net.eval()(q)
    ref_out, ref_weights = ref(*(torch.tensor(q),) * 3, None, True, None, True)
    np.testing.assert_allclose(out, ref_out.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights, ref_weights.detach().numpy(), rtol=1e-12, atol=1e-12)
