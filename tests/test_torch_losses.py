"""torch's loss classes and functions by their names and arguments: values (reduction none/mean/sum,
weights, beta, log_target, batchmean) and training gradients against torch in float64; the legacy
size_average/reduce flags map as torch maps them; what is not supported yet says so by name."""
import warnings

import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import param_grads

W3 = np.array([0.5, 2.0, 1.5])

# (id, class name, kwargs, input maker (rng, shape) -> input, target maker)
def _any(r, s):
    return r.standard_normal(s)


def _prob(r, s):
    return r.uniform(0.05, 0.95, s)


def _logprob(r, s):
    z = r.standard_normal(s)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


CASES = [
    ("mse_mean", "MSELoss", {}, _any, _any),
    ("mse_sum", "MSELoss", {"reduction": "sum"}, _any, _any),
    ("mse_none", "MSELoss", {"reduction": "none"}, _any, _any),
    ("l1_none", "L1Loss", {"reduction": "none"}, _any, _any),
    ("huber_order", "HuberLoss", {"reduction": "sum", "delta": 0.4}, _any, _any),
    ("huber_none", "HuberLoss", {"reduction": "none", "delta": 0.7}, _any, _any),
    ("smooth_l1", "SmoothL1Loss", {}, _any, _any),
    ("smooth_l1_beta", "SmoothL1Loss", {"beta": 0.3, "reduction": "sum"}, _any, _any),
    ("smooth_l1_beta0", "SmoothL1Loss", {"beta": 0.0}, _any, _any),
    ("smooth_l1_none", "SmoothL1Loss", {"beta": 2.0, "reduction": "none"}, _any, _any),
    ("bce", "BCELoss", {}, _prob, _prob),
    ("bce_weight_sum", "BCELoss", {"weight": W3, "reduction": "sum"}, _prob, _prob),
    ("bce_none", "BCELoss", {"reduction": "none"}, _prob, _prob),
    ("bce_logits", "BCEWithLogitsLoss", {}, lambda r, s: 3 * _any(r, s), _prob),
    ("bce_logits_pos_weight", "BCEWithLogitsLoss", {"pos_weight": W3}, lambda r, s: 3 * _any(r, s), _prob),
    ("bce_logits_weight_none", "BCEWithLogitsLoss", {"weight": W3, "reduction": "none"},
     lambda r, s: 3 * _any(r, s), _prob),
    ("kl_batchmean", "KLDivLoss", {"reduction": "batchmean"}, _logprob, lambda r, s: np.exp(_logprob(r, s))),
    ("kl_sum_zero_target", "KLDivLoss", {"reduction": "sum"}, _logprob,
     lambda r, s: np.where(r.random(s) < 0.3, 0.0, np.exp(_logprob(r, s)))),
    ("kl_log_target", "KLDivLoss", {"reduction": "batchmean", "log_target": True}, _logprob, _logprob),
    ("kl_none", "KLDivLoss", {"reduction": "none"}, _logprob, lambda r, s: np.exp(_logprob(r, s))),
]
IDS = [c[0] for c in CASES]


def _torch_kwargs(kwargs):
    return {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_values_match_torch(case, rng):
    _, name, kwargs, make_input, make_target = case
    x, t = make_input(rng, (5, 3)), make_target(rng, (5, 3))
    ours = getattr(tl.nn, name)(**kwargs)(x, t)
    theirs = getattr(torch.nn, name)(**_torch_kwargs(kwargs))(torch.tensor(x), torch.tensor(t)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14)
    assert getattr(tl.loss, name) is getattr(tl.nn, name)


class Head(tl.nn.Module):
    """A linear layer followed by a fixed transform that puts its output in the loss's domain."""

    def __init__(self, squash):
        super().__init__()
        self.fc = tl.nn.Linear(4, 3)
        self.squash = squash

    def forward(self, x):
        y = self.fc(x)
        return {"prob": lambda v: F.sigmoid(v), "logprob": lambda v: F.log_softmax(v, -1)}.get(self.squash,
                                                                                             lambda v: v)(y)


def _squash_of(make_input):
    return {_prob: "prob", _logprob: "logprob"}.get(make_input, "")


@pytest.mark.parametrize("case", [c for c in CASES if c[2].get("reduction") != "none"],
                         ids=[c[0] for c in CASES if c[2].get("reduction") != "none"])
def test_training_gradients_match_torch(case, rng):
    _, name, kwargs, make_input, make_target = case
    squash = _squash_of(make_input)
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 3).double()
    net = Head(squash).double()
    net.load_state_dict({"fc." + k: v for k, v in ref.state_dict().items()})
    x, t = rng.standard_normal((6, 4)), make_target(rng, (6, 3))
    trainer = tl.Trainer(net, getattr(tl.nn, name)(**kwargs), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    loss = trainer.compute_gradients(x, t)
    y = ref(torch.tensor(x))
    y = {"prob": torch.sigmoid, "logprob": lambda v: torch.log_softmax(v, -1)}.get(squash, lambda v: v)(y)
    tloss = getattr(torch.nn, name)(**_torch_kwargs(kwargs))(y, torch.tensor(t))
    tloss.backward()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-12)
    grads = param_grads(net)
    np.testing.assert_allclose(grads["fc.weight"], ref.weight.grad.numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(grads["fc.bias"], ref.bias.grad.numpy(), rtol=1e-10, atol=1e-13)


def test_a_per_element_loss_in_a_trainer_says_to_reduce_it(rng):
    net = tl.nn.Sequential(tl.nn.Linear(4, 3)).double()
    trainer = tl.Trainer(net, tl.nn.MSELoss(reduction="none"), tl.optim.SGD(lr=0.1))
    with pytest.raises(ValueError, match=r"must return a 0-d \(scalar\) symbol.*reduce it"):
        trainer.step(rng.standard_normal((2, 4)), rng.standard_normal((2, 3)))


def test_functional_forms_inside_a_custom_loss(rng):
    """F.* with reduction='none' reduced by hand, as torch code often does."""
    torch.manual_seed(1)
    ref = torch.nn.Linear(4, 3).double()
    net = Head("").double()
    net.load_state_dict({"fc." + k: v for k, v in ref.state_dict().items()})
    x, t, w = rng.standard_normal((6, 4)), rng.standard_normal((6, 3)), rng.uniform(0.5, 2, (6, 1))

    def loss(out, y, lib, weights):
        per = lib.smooth_l1_loss(out, y, reduction="none", beta=0.5) + lib.huber_loss(out, y, reduction="none")
        return (per * weights).mean()

    trainer = tl.Trainer(net, lambda out, y: loss(out, y, F, 1.0) + F.mse_loss(out, y), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    value = trainer.compute_gradients(x, t)
    y = ref(torch.tensor(x))
    tvalue = loss(y, torch.tensor(t), torch.nn.functional, 1.0) + torch.nn.functional.mse_loss(y, torch.tensor(t))
    tvalue.backward()
    np.testing.assert_allclose(value, tvalue.item(), rtol=1e-12)
    np.testing.assert_allclose(param_grads(net)["fc.weight"], ref.weight.grad.numpy(), rtol=1e-10)


@pytest.mark.parametrize("size_average,reduce,expected", [(None, False, "none"), (False, None, "sum"),
                                                          (True, True, "mean"), (False, False, "none")])
def test_legacy_flags_map_as_torch(size_average, reduce, expected):
    with pytest.warns(UserWarning, match="deprecated"):
        ours = tl.nn.MSELoss(size_average=size_average, reduce=reduce)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.nn.MSELoss(size_average=size_average, reduce=reduce)
    assert ours.reduction == theirs.reduction == expected


W4 = np.array([1.0, 2.0, 0.5, 3.0])
# (id, class name, kwargs, target kind): "labels" with some equal to ignore_index, "probs" class probabilities
CLASS_CASES = [
    ("ce_plain", "CrossEntropyLoss", {}, "labels"),
    ("ce_weight", "CrossEntropyLoss", {"weight": W4}, "labels"),
    ("ce_ignore", "CrossEntropyLoss", {"ignore_index": 1}, "labels"),
    ("ce_ignore_default_none", "CrossEntropyLoss", {"reduction": "none"}, "labels_with_ignored"),
    ("ce_smoothing", "CrossEntropyLoss", {"label_smoothing": 0.2}, "labels"),
    ("ce_all", "CrossEntropyLoss", {"weight": W4, "ignore_index": 2, "label_smoothing": 0.1}, "labels"),
    ("ce_all_sum", "CrossEntropyLoss", {"weight": W4, "label_smoothing": 0.3, "reduction": "sum"},
     "labels_with_ignored"),
    ("ce_probs", "CrossEntropyLoss", {}, "probs"),
    ("ce_probs_weight_smoothing", "CrossEntropyLoss", {"weight": W4, "label_smoothing": 0.1}, "probs"),
    ("nll", "NLLLoss", {}, "labels"),
    ("nll_weight_ignore", "NLLLoss", {"weight": W4, "ignore_index": 0}, "labels"),
    ("nll_none", "NLLLoss", {"reduction": "none"}, "labels_with_ignored"),
]


def class_targets(kind, rng, shape):
    if kind == "probs":
        z = rng.standard_normal(shape)
        return np.exp(z) / np.exp(z).sum(1, keepdims=True)
    labels = rng.integers(0, shape[1], (shape[0],) + shape[2:])
    if kind == "labels_with_ignored":
        labels.reshape(-1)[::3] = -100
    return labels


@pytest.mark.parametrize("shape", [(6, 4), (3, 4, 2)], ids=["NC", "NCd"])
@pytest.mark.parametrize("case", CLASS_CASES, ids=[c[0] for c in CLASS_CASES])
def test_class_losses_match_torch(case, shape, rng):
    _, name, kwargs, kind = case
    x = rng.standard_normal(shape)
    if name == "NLLLoss":
        x = x - np.log(np.exp(x).sum(1, keepdims=True))
    t = class_targets(kind, rng, shape)
    ours = getattr(tl.nn, name)(**kwargs)(x, t)
    theirs = getattr(torch.nn, name)(**_torch_kwargs(kwargs))(torch.tensor(x), torch.tensor(t)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", [c for c in CLASS_CASES if c[2].get("reduction") != "none"],
                         ids=[c[0] for c in CLASS_CASES if c[2].get("reduction") != "none"])
def test_class_losses_train_like_torch(case, rng):
    _, name, kwargs, kind = case
    torch.manual_seed(3)
    ref = torch.nn.Linear(5, 4).double()
    model = _ClassHead(name == "NLLLoss").double()
    model.load_state_dict({"fc." + k: v for k, v in ref.state_dict().items()})
    x, t = rng.standard_normal((8, 5)), class_targets(kind, rng, (8, 4))
    trainer = tl.Trainer(model, getattr(tl.nn, name)(**kwargs), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    loss = trainer.compute_gradients(x, t)
    y = ref(torch.tensor(x))
    if name == "NLLLoss":
        y = torch.log_softmax(y, -1)
    tloss = getattr(torch.nn, name)(**_torch_kwargs(kwargs))(y, torch.tensor(t))
    tloss.backward()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-12)
    np.testing.assert_allclose(param_grads(model)["fc.weight"], ref.weight.grad.numpy(), rtol=1e-10, atol=1e-13)


class _ClassHead(tl.nn.Module):
    def __init__(self, log_probabilities):
        super().__init__()
        self.fc = tl.nn.Linear(5, 4)
        self.log_probabilities = log_probabilities

    def forward(self, x):
        y = self.fc(x)
        return F.log_softmax(y, -1) if self.log_probabilities else y


def test_cross_entropy_by_its_torch_name(rng):
    logits, labels = rng.standard_normal((5, 4)), rng.integers(0, 4, 5)
    np.testing.assert_allclose(tl.nn.CrossEntropyLoss()(logits[0], np.array(labels[0])),
                               torch.nn.CrossEntropyLoss()(torch.tensor(logits[0]), torch.tensor(labels[0])).item(),
                               rtol=1e-12)  # unbatched: (C,) logits and a 0-d label
    with pytest.raises(ValueError, match="index 7 is out of range"):
        tl.nn.CrossEntropyLoss(weight=W4)(logits, np.array([0, 1, 7, 2, 3]))


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="reduction must be one of"):
        tl.nn.KLDivLoss(reduction="average")(np.zeros((2, 2)), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="beta must be non-negative"):
        tl.nn.SmoothL1Loss(beta=-1.0)(np.zeros(2), np.zeros(2))
