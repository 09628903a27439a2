"""torch.nn's Transformer containers (TransformerDecoderLayer, TransformerEncoder, TransformerDecoder,
Transformer) ported by renaming the import: state_dict keys, outputs, gradients and an Adam trajectory
against torch in float64, with a causal mask held in a buffer and key padding masks as inputs."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F

D, H, FF, N, S, T = 16, 2, 32, 3, 5, 4  # d_model, heads, feed-forward, batch, source and target lengths

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's notes on nested tensors


def _activation(nn, name):
    """"relu"/"gelu" as given; "F.gelu" and "GELU()" as each framework's gelu function and module."""
    if name == "F.gelu":
        return torch.nn.functional.gelu if nn is torch.nn else F.gelu
    return nn.GELU() if name == "GELU()" else name


def _build(self, nn, kind, batch_first, norm_first=False, activation="relu", final_norm=True):
    """One model of each kind in either framework (nn: torch.nn or tl.nn)."""
    self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(T))
    self.kind, self.batch_first = kind, batch_first
    act = _activation(nn, activation)
    if kind == "transformer":
        self.model = nn.Transformer(D, H, 2, 2, FF, dropout=0.0, activation=act, batch_first=batch_first,
                                    norm_first=norm_first)
    elif kind == "encoder":
        layer = nn.TransformerEncoderLayer(D, H, FF, 0.0, act, batch_first=batch_first, norm_first=norm_first)
        self.model = nn.TransformerEncoder(layer, 2, nn.LayerNorm(D) if final_norm else None)
    else:
        layer = nn.TransformerDecoderLayer(D, H, FF, 0.0, act, batch_first=batch_first, norm_first=norm_first)
        self.model = layer if kind == "decoder_layer" else nn.TransformerDecoder(layer, 2, nn.LayerNorm(D))


def _forward(self, src, tgt, src_pad, tgt_pad):
    """src (S, N, D) or (N, S, D), tgt likewise with T; padding masks (N, S) and (N, T), additive."""
    if self.kind == "transformer":
        return self.model(src, tgt, tgt_mask=self.causal, src_key_padding_mask=src_pad,
                          tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
    if self.kind == "encoder":
        return self.model(src, src_key_padding_mask=src_pad)
    return self.model(tgt, src, tgt_mask=self.causal, tgt_key_padding_mask=tgt_pad,
                      memory_key_padding_mask=src_pad)


class TorchNet(torch.nn.Module):
    forward = _forward

    def __init__(self, *args, **kwargs):
        super().__init__()
        _build(self, torch.nn, *args, **kwargs)


class TreadleNet(tl.nn.Module):
    forward = _forward

    def __init__(self, *args, **kwargs):
        super().__init__()
        _build(self, tl.nn, *args, **kwargs)


def _pair(*args, **kwargs):
    torch.manual_seed(0)
    ref = TorchNet(*args, **kwargs).double()
    with torch.no_grad():  # non-trivial norms and biases, so that every parameter matters
        for name, p in ref.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    net = TreadleNet(*args, **kwargs).double()
    tl.io.from_torch(ref, net)
    return net, ref


def _data(batch_first, seed=0):
    rng = np.random.default_rng(seed)
    shape = (lambda n, length: (n, length, D)) if batch_first else (lambda n, length: (length, n, D))
    src, tgt = rng.standard_normal(shape(N, S)), rng.standard_normal(shape(N, T))
    src_pad, tgt_pad = np.zeros((N, S)), np.zeros((N, T))
    src_pad[0, 3:] = -np.inf  # sample 0 has 3 source positions, sample 1 has 3 target positions
    tgt_pad[1, 3:] = -np.inf
    return [src, tgt, src_pad, tgt_pad], rng.standard_normal(shape(N, T))


def _target(kind, batch_first, y, seed=1):
    """The regression target: the model's output shape (S for the encoder, T otherwise)."""
    if kind != "encoder":
        return y
    shape = (N, S, D) if batch_first else (S, N, D)
    return np.random.default_rng(seed).standard_normal(shape)


def _torch_loss(ref, x, y):
    out = ref(*[torch.tensor(a) for a in x])
    return torch.nn.functional.mse_loss(out, torch.tensor(y)), out


def _loss(out, y):
    return F.mse_loss(out, y)


CASES = [
    ("decoder_layer", True, False, "relu", True),
    ("decoder_layer", False, True, "relu", True),
    ("decoder_layer", True, False, "gelu", True),
    ("decoder_layer", False, True, "F.gelu", True),
    ("decoder_layer", True, True, "GELU()", True),
    ("decoder", True, False, "F.gelu", True),
    ("encoder", True, False, "relu", True),
    ("encoder", False, True, "gelu", False),
    ("decoder", True, False, "relu", True),
    ("decoder", False, True, "gelu", True),
    ("transformer", True, False, "relu", True),
    ("transformer", False, False, "relu", True),
    ("transformer", True, True, "gelu", True),
]


def _case_pair(case):
    kind, batch_first, norm_first, activation, final_norm = case
    return _pair(kind, batch_first, norm_first, activation, final_norm)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_state_dict_outputs_and_gradients_match_torch(case):
    kind, batch_first = case[0], case[1]
    net, ref = _case_pair(case)
    assert list(net.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in net.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x, y = _data(batch_first)
    y = _target(kind, batch_first, y)
    loss, out = _torch_loss(ref, x, y)
    loss.backward()
    expected = out.detach().numpy()
    assert np.all(np.isfinite(expected))
    net.eval()
    np.testing.assert_allclose(net.predict(x), expected, rtol=1e-10, atol=1e-12)
    trainer = tl.Trainer(net, _loss, tl.optim.SGD(lr=0.0))
    assert trainer.compute_gradients(x, y) == pytest.approx(loss.item(), rel=1e-10)
    grads = net.named_gradients()
    assert set(grads) == {n for n, _ in ref.named_parameters()}
    for name, p in ref.named_parameters():
        assert np.any(p.grad.numpy() != 0), name
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("batch_first", [True, False])
def test_adam_trajectory_of_a_small_transformer_follows_torch(batch_first):
    net, ref = _pair("transformer", batch_first)
    x, y = _data(batch_first, seed=2)
    trainer = tl.Trainer(net, _loss, tl.optim.Adam(lr=1e-2))
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        ours = trainer.step(x, y)
        opt.zero_grad()
        loss, _ = _torch_loss(ref, x, y)
        loss.backward()
        opt.step()
        assert ours == pytest.approx(loss.item(), rel=1e-8)
        losses.append(ours)
    assert losses[-1] < 0.9 * losses[0]
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(net.named_parameters()[name], p.detach().numpy(), rtol=1e-7, atol=1e-9,
                                   err_msg=name)


def test_dropout_acts_in_training_only():
    tl.manual_seed(6)
    torch.manual_seed(6)
    ref = torch.nn.TransformerDecoderLayer(D, H, FF, dropout=0.5, batch_first=True).double().eval()
    layer = tl.nn.TransformerDecoderLayer(D, H, FF, dropout=0.5, batch_first=True)

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, tgt, memory):
            return self.layer(tgt, memory)

    net = Net().double()
    tl.io.from_torch({"layer." + k: v for k, v in ref.state_dict().items()}, net)
    (src, tgt, _, _), _ = _data(True)
    with torch.no_grad():
        expected = ref(torch.tensor(tgt), torch.tensor(src)).numpy()
    np.testing.assert_allclose(net.predict([tgt, src]), expected, rtol=1e-10, atol=1e-12)
    trainer = tl.Trainer(net, _loss, tl.optim.SGD(lr=0.0))
    first, second = trainer.forward([tgt, src]), trainer.forward([tgt, src])
    assert np.all(np.isfinite(first)) and np.any(first != expected) and np.any(first != second)


class Causal(tl.nn.Module):
    """A decoder whose causal mask is a buffer (flag False) or only the tgt_is_causal flag."""

    def __init__(self, flag):
        super().__init__()
        tl.manual_seed(7)
        self.decoder = tl.nn.TransformerDecoder(tl.nn.TransformerDecoderLayer(D, H, FF, 0.0, batch_first=True), 2)
        self.register_buffer("causal", tl.nn.Transformer.generate_square_subsequent_mask(T))
        self.flag = flag

    def forward(self, tgt, memory):
        if self.flag:
            return self.decoder(tgt, memory, tgt_is_causal=True)
        return self.decoder(tgt, memory, tgt_mask=self.causal, tgt_is_causal=None)


def test_causal_flag_equals_the_causal_mask():
    (src, tgt, _, _), _ = _data(True)
    src, tgt = src.astype(np.float32), tgt.astype(np.float32)
    masked, flagged, free = Causal(False).eval(), Causal(True).eval(), Causal(False).eval()
    free.causal = np.zeros((T, T), np.float32)
    np.testing.assert_allclose(flagged.predict([tgt, src]), masked.predict([tgt, src]), rtol=1e-6, atol=1e-6)
    assert np.abs(free.predict([tgt, src]) - masked.predict([tgt, src])).max() > 1e-3


def _layer_values(net, index):
    prefix = f"model.layers.{index}."
    return {k[len(prefix):]: v for k, v in net.state_dict().items() if k.startswith(prefix)}


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_copies_start_from_the_layer_and_train_independently(kind):
    tl.manual_seed(3)
    cls = tl.nn.TransformerEncoderLayer if kind == "encoder" else tl.nn.TransformerDecoderLayer
    layer = cls(D, H, FF, dropout=0.0, batch_first=True)
    dict(layer.named_parameter_objects())["norm1.weight"].data[...] = np.linspace(0.5, 1.5, D)  # not the default
    original = {n: p.data.copy() for n, p in layer.named_parameter_objects()}
    net = TreadleNet(kind, True)
    net.model = (tl.nn.TransformerEncoder(layer, 3) if kind == "encoder"
                 else tl.nn.TransformerDecoder(layer, 3))
    net.double()
    assert len(net.model.layers) == 3 and net.model.norm is None
    for i in range(3):
        values = _layer_values(net, i)
        assert list(values) == list(original)
        for name, v in original.items():
            np.testing.assert_array_equal(values[name], v, err_msg=name)
    x, _ = _data(True)
    y = _target(kind, True, _data(True)[1])
    trainer = tl.Trainer(net, _loss, tl.optim.Adam(lr=1e-2))
    for _ in range(3):
        trainer.step(x, y)
    first, second = _layer_values(net, 0), _layer_values(net, 1)
    weights = net.named_parameters()
    assert not np.shares_memory(weights["model.layers.0.linear1.weight"], weights["model.layers.1.linear1.weight"])
    for name in original:
        assert np.any(first[name] != original[name]), name
        assert np.any(first[name] != second[name]), name
    for name, p in layer.named_parameter_objects():  # the given layer is not part of the model
        np.testing.assert_array_equal(p.data, original[name], err_msg=name)


def test_copies_keep_dtype_and_frozen_parameters():
    layer = tl.nn.TransformerDecoderLayer(8, 2, 16, dtype=np.float64)
    layer.norm3.requires_grad_(False)
    decoder = tl.nn.TransformerDecoder(layer, 2)
    objects = dict(decoder.named_parameter_objects())
    assert objects["layers.1.linear1.weight"].data.dtype == np.float64
    assert not objects["layers.1.norm3.weight"].requires_grad and objects["layers.1.norm2.weight"].requires_grad
    assert decoder.layers[0].config() == layer.config()


class Plain(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = tl.nn.Linear(4, 4)

    def forward(self, x, **masks):
        return self.fc(x)


def test_a_layer_that_cannot_be_copied_is_refused():
    with pytest.raises(TypeError, match="TransformerEncoder: cannot copy the Plain.*config"):
        tl.nn.TransformerEncoder(Plain(), 2)
    with pytest.raises(TypeError, match="TransformerDecoder: cannot copy the TransformerDecoderLayer"):
        tl.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(8, 2, 16), 2)
    prelu_like = tl.nn.Linear(16, 16)
    shared = tl.nn.TransformerDecoderLayer(16, 2, 32, activation=prelu_like)
    with pytest.raises(TypeError, match="share"):
        tl.nn.TransformerDecoder(shared, 2)


def test_bad_arguments_are_refused():
    layer = tl.nn.TransformerEncoderLayer(8, 2, 16)
    with pytest.raises(ValueError, match="num_layers must be at least 1, got 0"):
        tl.nn.TransformerEncoder(layer, 0)
    with pytest.raises(ValueError, match="num_layers must be at least 1, got -1"):
        tl.nn.TransformerDecoder(tl.nn.TransformerDecoderLayer(8, 2, 16), -1)
    with pytest.raises(ValueError, match="copies of the layer need at least"):
        tl.nn.TransformerEncoder(layer, 2 ** 50)
    with pytest.raises(TypeError, match="num_layers must be an int"):
        tl.nn.TransformerEncoder(layer, 2.0)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        tl.nn.TransformerDecoderLayer(10, 3)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        tl.nn.Transformer(d_model=10, nhead=3, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=8)
    with pytest.raises(ValueError, match="activation must be 'relu', 'gelu' or a callable, got 'tanh'"):
        tl.nn.TransformerDecoderLayer(8, 2, activation="tanh")
    with pytest.raises(ValueError, match="activation must be 'relu', 'gelu' or a callable, got 'swish'"):
        tl.nn.Transformer(8, 2, 1, 1, 16, activation="swish")
    with pytest.raises(ValueError, match="custom_encoder"):
        tl.nn.Transformer(8, 2, 1, 1, 16, activation=F.tanh)
    with pytest.raises(ValueError, match="dim_feedforward must be positive"):
        tl.nn.TransformerDecoderLayer(8, 2, 0)
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        tl.nn.TransformerDecoderLayer(8, 2, dtype="int32")
    with pytest.raises(TypeError, match="norm must be a treadle Module"):
        tl.nn.TransformerEncoder(layer, 1, norm=torch.nn.LayerNorm(8))


def test_bad_inputs_are_refused():
    net = TreadleNet("transformer", True).double()
    x, _ = _data(True)
    with pytest.raises(ValueError, match="batch number of src and tgt"):
        net.predict([x[0], x[1][:2], x[2], x[3][:2]])
    with pytest.raises(ValueError, match="feature number of src and tgt must be equal to d_model"):
        net.predict([x[0][..., :8], x[1], x[2], x[3]])


@pytest.mark.parametrize("dtype", [None, np.float32, np.float64, "float64", torch.float64])
def test_generate_square_subsequent_mask_is_torchs(dtype):
    ours = tl.nn.Transformer.generate_square_subsequent_mask(5, dtype=dtype)
    torch_dtype = torch.float64 if dtype is not None and "64" in str(dtype) else torch.float32
    theirs = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch_dtype).numpy()
    assert isinstance(ours, np.ndarray) and ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)
    with pytest.raises(ValueError, match="non-negative int"):
        tl.nn.Transformer.generate_square_subsequent_mask(2.5)


def test_transformer_initialisation_is_xavier_uniform():
    tl.manual_seed(4)
    net = tl.nn.Transformer(32, 4, 1, 1, 64, dropout=0.0)
    state = net.state_dict()
    for name, value in state.items():
        if value.ndim > 1:
            bound = np.sqrt(6.0 / sum(value.shape))
            assert np.abs(value).max() <= bound and np.abs(value).max() > 0.9 * bound, name
        elif name.endswith("norm1.weight") or name.endswith("norm.weight"):
            assert np.all(value == 1), name
    assert np.all(state["encoder.layers.0.self_attn.in_proj_bias"] == 0)


def test_transformer_saves_and_loads(tmp_path):
    tl.manual_seed(5)
    net = tl.nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, activation=F.gelu, batch_first=True).double()
    x, _ = _data(True)
    net.eval()
    path = tmp_path / "transformer.safetensors"
    tl.save(net, path)
    loaded = tl.load(path).eval()
    assert loaded.config() == {**net.config(), "activation": "gelu"}
    np.testing.assert_array_equal(loaded.predict(x[:2]), net.predict(x[:2]))


def test_encoder_container_saves_weights_only(tmp_path):
    net = tl.nn.TransformerEncoder(tl.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2)
    path = tmp_path / "encoder.safetensors"
    tl.save(net, path)
    with pytest.raises(ValueError, match="tl.load\\(path, model=net\\)"):
        tl.load(path)
    fresh = tl.nn.TransformerEncoder(tl.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2)
    tl.load(path, model=fresh)
    for (name, a), (_, b) in zip(fresh.state_dict().items(), net.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=name)
