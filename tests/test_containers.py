"""ModuleList, ModuleDict and the submodule iterators, as torch.nn has them: a model written with
them ports by renaming the import, with torch's state_dict keys, outputs and gradients."""
import numpy as np
import pytest
import torch

import treadle as tl


def _build(self, nn):
    """The same tower in either framework: `nn` is torch.nn or tl.nn."""
    self.blocks = nn.ModuleList([nn.Linear(4, 8), nn.Linear(8, 8)])
    self.blocks.append(nn.Linear(8, 8))
    self.heads = nn.ModuleDict({"mean": nn.Linear(8, 2), "scale": nn.Linear(8, 2)})
    self.act = nn.Tanh()


def _forward(self, x):
    for block in self.blocks:
        x = self.act(block(x))
    return self.heads["mean"](x) + self.heads["scale"](x)


class TorchTower(torch.nn.Module):
    forward = _forward

    def __init__(self):
        super().__init__()
        _build(self, torch.nn)


class TreadleTower(tl.nn.Module):
    forward = _forward

    def __init__(self):
        super().__init__()
        _build(self, tl.nn)


def _pair():
    torch.manual_seed(0)
    ref = TorchTower().double()
    net = TreadleTower()
    net.to("float64")
    tl.io.from_torch(ref, net)
    return net, ref


def test_containers_have_torchs_keys_outputs_and_gradients():
    net, ref = _pair()
    assert list(net.state_dict()) == list(ref.state_dict())
    x = np.random.default_rng(0).standard_normal((5, 4))
    y = np.random.default_rng(1).standard_normal((5, 2))
    np.testing.assert_allclose(net.predict(x), ref(torch.tensor(x)).detach().numpy(), rtol=1e-12, atol=1e-13)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    trainer.compute_gradients(x, y)
    torch.nn.functional.mse_loss(ref(torch.tensor(x)), torch.tensor(y)).backward()
    grads = net.named_gradients()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


def test_module_list_behaves_like_a_list():
    layers = tl.nn.ModuleList([tl.nn.Linear(2, 3), tl.nn.Tanh()])
    assert len(layers) == 2 and isinstance(layers[-1], tl.nn.Tanh)
    layers.insert(0, tl.nn.ReLU())
    assert [type(m).__name__ for m in layers] == ["ReLU", "Linear", "Tanh"]
    assert [type(m).__name__ for m in layers[1:]] == ["Linear", "Tanh"]
    layers[0] = tl.nn.SiLU()
    assert isinstance(layers[0], tl.nn.SiLU)
    with pytest.raises(IndexError, match="out of range"):
        layers[3]
    with pytest.raises(TypeError, match="not a treadle Module"):
        layers.append(torch.nn.Linear(2, 2))
    with pytest.raises(NotImplementedError, match="container"):
        layers.forward(None)


def test_module_dict_behaves_like_a_dict():
    heads = tl.nn.ModuleDict({"a": tl.nn.Linear(2, 3)})
    heads["b"] = tl.nn.Linear(2, 1)
    assert heads.keys() == ["a", "b"] and "b" in heads and len(heads) == 2 and list(heads) == ["a", "b"]
    with pytest.raises(KeyError, match="without '.'"):
        heads["a.b"] = tl.nn.Tanh()


def test_submodule_iterators_match_torch():
    net, ref = _pair()
    assert [n for n, _ in net.named_modules()] == [n for n, _ in ref.named_modules()]
    assert [n for n, _ in net.named_children()] == [n for n, _ in ref.named_children()]
    assert len(list(net.modules())) == len(list(ref.modules()))
    visited = []
    assert net.apply(lambda m: visited.append(type(m).__name__)) is net
    torch_visited = []
    ref.apply(lambda m: torch_visited.append(type(m).__name__.replace("Torch", "Treadle")))
    assert visited == torch_visited


def test_a_layer_kept_in_a_plain_list_is_named_in_the_error():
    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [tl.nn.Linear(3, 4), tl.nn.Linear(4, 1)]  # not registered

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    with pytest.raises(ValueError, match=r"Linear is used in the forward but is not registered .*ModuleList"):
        Net().predict(np.ones((2, 3), np.float32))


def test_calling_a_module_on_arrays_runs_inference_in_eval_mode():
    """model(x) used to end in a pybind11 dump of the whole array. In eval mode it is predict (torch's
    model.eval(); model(x)); in train mode (the default, as in torch) it says what to do instead of
    silently giving the eval-mode answer of a model with dropout or batch norm."""
    net = tl.nn.Sequential(tl.nn.Linear(3, 2), tl.nn.Dropout(0.5), tl.nn.BatchNorm1d(2))
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    assert net.training and net[1].training
    with pytest.raises(TypeError, match=r"\(x\) on a numpy array runs inference: call \.eval\(\) first"):
        net(x)
    assert net.eval() is net and not net.training and not net[2].training
    np.testing.assert_array_equal(net(x), net.predict(x))
    with pytest.raises(ValueError, match="already belongs to another model"):  # a submodule alone: refused
        net[0](x)
    net.train()
    assert all(m.training for m in net.modules())


def test_a_module_with_two_inputs_takes_them_positionally_when_called():
    class Two(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = tl.nn.Linear(3, 2), tl.nn.Linear(5, 2)

        def forward(self, u, v):
            return self.a(u) + self.b(v)

    net = Two().eval()
    u, v = np.ones((2, 3), np.float32), np.ones((2, 5), np.float32)
    np.testing.assert_array_equal(net(u, v), net.predict([u, v]))


def test_named_parameters_iterates_pairs_like_torch_and_indexes_like_a_dict():
    net, ref = _pair()
    pairs = [(name, p.shape) for name, p in net.named_parameters()]
    assert pairs == [(name, tuple(p.shape)) for name, p in ref.named_parameters()]
    params = net.named_parameters()
    assert params["blocks.0.weight"].shape == (8, 4) and dict(params).keys() == params.keys()
    assert [p.shape for p in net.parameters()] == [tuple(p.shape) for p in ref.parameters()]
    net.parameters()[0][...] = 0.5  # writable views into the model's flat buffer
    assert np.all(net.state_dict()["blocks.0.weight"] == 0.5)


def test_module_zero_grad_clears_what_a_backward_accumulated():
    net, _ = _pair()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    trainer.compute_gradients(np.ones((3, 4)), np.zeros((3, 2)))
    assert np.any(net.flat_gradients() != 0)
    net.zero_grad()
    assert not np.any(net.flat_gradients())
