"""The benchmark workloads, each defined once for treadle and once for PyTorch.

A workload builds the same architecture in both frameworks with the same parameter names
(PyTorch's state_dict keys), so the harness copies PyTorch's initial weights into treadle and both
start from identical parameters. Builders take the imported modules (`tl`, `torch`) as arguments:
this file imports neither, so it can be listed and checked without them.

A treadle builder that needs a layer or op the package does not have yet raises AttributeError
(or NotImplementedError) on construction or tracing; the harness reports that workload as
"missing" with the message, rather than skipping it.
"""
from dataclasses import dataclass, field, replace
from typing import Callable, Optional


@dataclass
class Workload:
    name: str                      # "W1", "W1-b1", ...
    title: str                     # one line for the table
    batch: int
    sample_shape: tuple            # shape of one input sample
    loss: str                      # "mse" (float target of shape (N, out)), "cross_entropy" (int64 labels) or
                                   # "custom" (float target of shape (N, out); the function is custom_loss)
    out_features: int              # output width (MSE target width, or number of classes)
    build_torch: Callable          # build_torch(torch) -> torch.nn.Module
    build_treadle: Callable        # build_treadle(tl) -> treadle Module (same state_dict keys)
    forward_flops: int = 0         # multiply-add FLOPs (x2) of one sample's forward, GEMM-like layers only
    train: bool = True             # False: inference-only (the batch-1 latency cases)
    treadle_layers: Optional[Callable] = None  # treadle_layers(tl) -> fresh layer list (Sequential models; profiling)
    target_train: Optional[float] = None       # goals, ratio PyTorch time / treadle time
    target_infer: Optional[float] = None
    notes: list = field(default_factory=list)
    # custom_loss(F, grad, ones_like) -> fn(output, target, input): the same loss for both frameworks,
    # F being tl.functional or torch, grad and ones_like their derivative and constant functions.
    custom_loss: Optional[Callable] = None
    input_grad: bool = False       # PyTorch's input needs requires_grad (the loss differentiates with respect to it)
    stochastic: bool = False       # noise in the forward: the two frameworks' training losses differ by design


# -- MLPs -----------------------------------------------------------------------------------------
def _mlp_spec(widths, act):
    """[(kind, args)] for Linear/activation alternation; no activation after the last Linear."""
    spec = []
    for i in range(len(widths) - 1):
        spec.append(("linear", (widths[i], widths[i + 1])))
        if i < len(widths) - 2:
            spec.append((act, ()))
    return spec


def _torch_layers(torch, spec):
    nn = torch.nn
    make = {"linear": nn.Linear, "relu": nn.ReLU, "tanh": nn.Tanh, "flatten": nn.Flatten,
            "conv3x3": lambda cin, cout: nn.Conv2d(cin, cout, 3, padding=1), "maxpool2": lambda: nn.MaxPool2d(2)}
    return [make[kind](*args) for kind, args in spec]


def _treadle_layers(tl, spec):
    nn = tl.nn
    # Looked up lazily: a layer the package lacks raises AttributeError only when it is needed.
    make = {"linear": lambda: nn.Linear, "relu": lambda: nn.ReLU, "tanh": lambda: nn.Tanh,
            "flatten": lambda: nn.Flatten, "conv3x3": lambda: (lambda cin, cout: nn.Conv2d(cin, cout, 3, padding=1)),
            "maxpool2": lambda: (lambda: nn.MaxPool2d(2))}
    return [make[kind]()(*args) for kind, args in spec]


def _sequential(spec, name, title, batch, sample_shape, loss, out_features, flops, **kw):
    return Workload(
        name=name, title=title, batch=batch, sample_shape=sample_shape, loss=loss, out_features=out_features,
        build_torch=lambda torch: torch.nn.Sequential(*_torch_layers(torch, spec)),
        build_treadle=lambda tl: tl.nn.Sequential(*_treadle_layers(tl, spec)),
        treadle_layers=lambda tl: _treadle_layers(tl, spec), forward_flops=flops, **kw)


def _mlp_flops(widths):
    return sum(2 * widths[i] * widths[i + 1] for i in range(len(widths) - 1))


W1_WIDTHS, W2_WIDTHS, W3_WIDTHS = [8, 32, 32, 1], [64, 128, 128, 10], [1024, 1024, 1024, 1024, 10]


def _mlp(name, title, widths, act, batch, loss, **kw):
    return _sequential(_mlp_spec(widths, act), name, title, batch, (widths[0],), loss, widths[-1],
                       _mlp_flops(widths), **kw)


# -- CNN ------------------------------------------------------------------------------------------
CNN_SPEC = [("conv3x3", (1, 32)), ("relu", ()), ("maxpool2", ()), ("conv3x3", (32, 64)), ("relu", ()),
            ("maxpool2", ()), ("flatten", ()), ("linear", (3136, 128)), ("relu", ()), ("linear", (128, 10))]
CNN_FLOPS = 2 * (28 * 28 * 32 * 1 * 9 + 14 * 14 * 64 * 32 * 9 + 3136 * 128 + 128 * 10)


# -- LSTM: seq 32, input 16, hidden 64, last hidden -> 1 ------------------------------------------
SEQ, LSTM_IN, LSTM_HIDDEN = 32, 16, 64


def _torch_lstm(torch):
    class LSTMRegressor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(LSTM_IN, LSTM_HIDDEN, batch_first=True)
            self.head = torch.nn.Linear(LSTM_HIDDEN, 1)

        def forward(self, x):
            out, _ = self.lstm(x)
            return self.head(out[:, -1])  # the last hidden state of the single layer

    return LSTMRegressor()


def _treadle_lstm(tl):
    F = tl.functional

    class LSTMRegressor(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = tl.nn.LSTM(LSTM_IN, LSTM_HIDDEN, batch_first=True)
            self.head = tl.nn.Linear(LSTM_HIDDEN, 1)

        def forward(self, x):
            out = self.lstm(x)
            if isinstance(out, (tuple, list)):  # torch-like (output, (h, c))
                out = out[0]
            n, t, h = out.shape
            return self.head(F.reshape(F.slice(out, 1, t - 1, t), [n, h]))

    return LSTMRegressor()


LSTM_FLOPS = SEQ * 2 * 4 * LSTM_HIDDEN * (LSTM_IN + LSTM_HIDDEN) + 2 * LSTM_HIDDEN


# -- Transformer encoder block: d_model 128, 4 heads, FFN 512, seq 64, mean-pool -> 10 -------------
D_MODEL, HEADS, FFN, TSEQ = 128, 4, 512, 64


def _torch_encoder(torch):
    class EncoderClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # dropout 0: both frameworks must compute the same function for the loss check
            self.encoder = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True)
            self.head = torch.nn.Linear(D_MODEL, 10)

        def forward(self, x):
            return self.head(self.encoder(x).mean(dim=1))

    return EncoderClassifier()


def _treadle_encoder(tl):
    F = tl.functional

    class EncoderClassifier(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = tl.nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True)
            self.head = tl.nn.Linear(D_MODEL, 10)

        def forward(self, x):
            return self.head(F.mean(self.encoder(x), 1))

    return EncoderClassifier()


ENCODER_FLOPS = (2 * TSEQ * D_MODEL * 4 * D_MODEL      # q, k, v, out projections
                 + 2 * 2 * TSEQ * TSEQ * D_MODEL        # scores and weighted sum
                 + 2 * 2 * TSEQ * D_MODEL * FFN          # feed-forward
                 + 2 * D_MODEL * 10)


# -- VAE: 16 -> 64 tanh -> (mu, logvar) 2 -> noise -> 64 tanh -> 16, negative ELBO ----------------
VAE_OBS, VAE_LATENT, VAE_WIDTH = 16, 2, 64


def _vae(lib):
    """The VAE module for lib (torch or treadle): noise drawn in the forward, mean decoded in eval."""
    randn_like = lib.randn_like if hasattr(lib, "randn_like") else lib.functional.randn_like
    tanh = lib.tanh if hasattr(lib, "tanh") else lib.functional.tanh

    class VAE(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = lib.nn.Linear(VAE_OBS, VAE_WIDTH)
            self.mu = lib.nn.Linear(VAE_WIDTH, VAE_LATENT)
            self.logvar = lib.nn.Linear(VAE_WIDTH, VAE_LATENT)
            self.dec1 = lib.nn.Linear(VAE_LATENT, VAE_WIDTH)
            self.dec2 = lib.nn.Linear(VAE_WIDTH, VAE_OBS)

        def forward(self, x):
            h = tanh(self.enc(x))
            mu, logvar = self.mu(h), self.logvar(h)
            training = x.training if hasattr(x, "training") else self.training  # a treadle symbol knows
            z = mu + (0.5 * logvar).exp() * randn_like(mu) if training else mu
            return self.dec2(tanh(self.dec1(z))), mu, logvar

    return VAE()


def _vae_loss(F, grad, ones_like):
    def loss(outputs, y, x):
        recon, mu, logvar = outputs
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum()
        return (((recon - y) ** 2).sum() * 200.0 + kl) / 128
    return loss


VAE_FLOPS = 2 * (VAE_OBS * VAE_WIDTH + 2 * VAE_WIDTH * VAE_LATENT + VAE_LATENT * VAE_WIDTH + VAE_WIDTH * VAE_OBS)


# -- PINN: u(x, t) = MLP 2 -> 64 tanh x3 -> 1; loss: heat residual u_t - 0.1 u_xx and a misfit --------
PINN_WIDTHS = [2, 64, 64, 64, 1]


def _pinn_loss(F, grad, ones_like):
    def loss(u, y, xt):
        (du,) = grad(u, xt, ones_like(u))
        (d2u,) = grad(du[:, 0:1], xt, ones_like(u))
        residual = du[:, 1:2] - 0.1 * d2u[:, 0:1]
        return (residual ** 2).mean() + ((u - y) ** 2).mean()
    return loss


def _pinn(name, title, widths, batch):
    # forward_flops 0: the step's derivative passes are not a fixed multiple of the forward.
    return replace(_mlp(name, title, widths, "tanh", batch, "custom", target_train=3.0, custom_loss=_pinn_loss,
                        input_grad=True), forward_flops=0)


def all_workloads():
    """The workloads, in table order."""
    return [
        _mlp("W1", "tiny MLP 8-32-32-1 tanh, MSE", W1_WIDTHS, "tanh", 32, "mse", target_train=10.0),
        _mlp("W2", "small MLP 64-128-128-10 relu, CE", W2_WIDTHS, "relu", 128, "cross_entropy", target_train=5.0),
        _mlp("W3", "wide MLP 1024-1024x3-10 relu, CE", W3_WIDTHS, "relu", 256, "cross_entropy", target_train=1.0),
        _sequential(CNN_SPEC, "W4", "small CNN 1x28x28 conv32-pool-conv64-pool-128-10, CE", 64, (1, 28, 28),
                    "cross_entropy", 10, CNN_FLOPS, target_train=1.0),
        Workload("W5", "LSTM seq32 in16 hid64 -> 1, MSE", 32, (SEQ, LSTM_IN), "mse", 1, _torch_lstm, _treadle_lstm,
                 LSTM_FLOPS, target_train=2.0),
        Workload("W6", "transformer encoder d128 h4 ffn512 seq64, mean-pool -> 10, CE", 16, (TSEQ, D_MODEL),
                 "cross_entropy", 10, _torch_encoder, _treadle_encoder, ENCODER_FLOPS, target_train=1.0),
        Workload("W7", "VAE 16-64-(2,2)-64-16 tanh, noise in the forward, ELBO", 128, (VAE_OBS,), "custom", VAE_OBS,
                 lambda torch: _vae(torch), lambda tl: _vae(tl), VAE_FLOPS, target_train=3.0,
                 custom_loss=_vae_loss, stochastic=True),
        _pinn("W8", "PINN heat residual (2nd derivatives) MLP 2-64x3-1 tanh", PINN_WIDTHS, 512),
        # the corners of the PINN goal (batch 256-1024 collocation points, width 32-64)
        _pinn("W8-b1024", "W8 with 1024 collocation points", PINN_WIDTHS, 1024),
        _pinn("W8-w32", "W8 at width 32, 256 points", [2, 32, 32, 32, 1], 256),
        _mlp("W1-b1", "W1 inference, batch 1 (policy evaluation)", W1_WIDTHS, "tanh", 1, "mse", train=False,
             target_infer=20.0),
        _mlp("W2-b1", "W2 inference, batch 1", W2_WIDTHS, "relu", 1, "cross_entropy", train=False,
             target_infer=20.0),
    ]
