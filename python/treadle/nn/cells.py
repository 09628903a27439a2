"""Recurrent cells with torch.nn.RNNCell / LSTMCell / GRUCell semantics: one time step per call, so a
traced forward loops over time in Python (``for t in range(T): h = cell(x[t], h)``), unrolled into the
plan once per input signature.

Parameter names, shapes, gate order (LSTM: i, f, g, o; GRU: r, z, n) and initialisation
(U(-1/sqrt(hidden_size), +)) are torch's, so state_dicts load both ways. Each step is a composition of
verified ops (linear, sigmoid, tanh, mul, add), differentiated by the same autodiff as every other op.
"""
import math

import numpy as np

from .. import functional as F
from .module import Module, _int_args
from .init import uniform_
from .parameter import Parameter

__all__ = ["RNNCell", "LSTMCell", "GRUCell"]


class _Cell(Module):
    _gates = 1

    def __init__(self, input_size, hidden_size, bias=True, dtype=None):
        super().__init__()
        self.input_size, self.hidden_size = _int_args(self, input_size=input_size, hidden_size=hidden_size)
        if self.input_size <= 0 or self.hidden_size <= 0:
            raise ValueError(f"{type(self).__name__}: input_size and hidden_size must be positive, "
                             f"got ({input_size}, {hidden_size})")
        self.bias = bool(bias)
        bound = 1.0 / math.sqrt(self.hidden_size)
        rows = self._gates * self.hidden_size

        def param(*shape):
            return Parameter(uniform_(np.empty(shape), -bound, bound), dtype=dtype or "float32")

        self.weight_ih = param(rows, self.input_size)
        self.weight_hh = param(rows, self.hidden_size)
        self.bias_ih = param(rows) if self.bias else None
        self.bias_hh = param(rows) if self.bias else None

    def __setattr__(self, name, value):
        if value is None and name in ("bias_ih", "bias_hh"):  # bias=False: torch registers None
            self.__dict__["_parameters"][name] = None
            return
        super().__setattr__(name, value)

    def _batched(self, x, hx):
        """(x, hx, unbatched): an unbatched (input_size,) step is run as a batch of one."""
        name = type(self).__name__
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ValueError(f"{name}: expected input of shape (batch, {self.input_size}) or ({self.input_size},), "
                             f"got {tuple(x.shape)}")
        unbatched = x.ndim == 1
        if unbatched:
            x = F.unsqueeze(x, 0)
            hx = None if hx is None else _map(hx, lambda h: F.unsqueeze(h, 0))
        expected = (x.shape[0], self.hidden_size)
        for h in [] if hx is None else (hx if isinstance(hx, (tuple, list)) else [hx]):
            if tuple(h.shape) != expected:
                raise ValueError(f"{name}: expected hidden state of shape {expected}, got {tuple(h.shape)}")
        return x, hx, unbatched

    def _input_part(self, x):
        return F.linear(x, self.weight_ih, self.bias_ih)

    def _hidden_part(self, h):
        """W_hh h + b_hh; with no state (h = 0, torch's default) just b_hh."""
        if h is not None:
            return F.linear(h, self.weight_hh, self.bias_hh)
        return self.bias_hh

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


def _map(hx, fn):
    return tuple(fn(h) for h in hx) if isinstance(hx, (tuple, list)) else fn(hx)


def _plus(a, b):
    return a if b is None else a + b


class RNNCell(_Cell):
    """h' = tanh(W_ih x + b_ih + W_hh h + b_hh) (or relu). forward(input, hx=None) -> h'."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: unknown nonlinearity {nonlinearity!r} (tanh or relu)")
        super().__init__(input_size, hidden_size, bias, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):  # noqa: A002 (torch's argument name)
        x, h, unbatched = self._batched(input, hx)
        pre = _plus(self._input_part(x), self._hidden_part(h))
        out = F.tanh(pre) if self.nonlinearity == "tanh" else F.relu(pre)
        return F.squeeze(out, 0) if unbatched else out


class LSTMCell(_Cell):
    """torch.nn.LSTMCell: forward(input, hx=None) with hx = (h, c) -> (h', c')."""

    _gates = 4

    def forward(self, input, hx=None):  # noqa: A002 (torch's argument name)
        x, state, unbatched = self._batched(input, hx)
        h, c = (None, None) if state is None else state
        i, f, g, o = F.chunk(_plus(self._input_part(x), self._hidden_part(h)), 4, -1)
        i, f, g, o = F.sigmoid(i), F.sigmoid(f), F.tanh(g), F.sigmoid(o)
        c_new = i * g if c is None else f * c + i * g
        h_new = o * F.tanh(c_new)
        return _map((h_new, c_new), lambda t: F.squeeze(t, 0)) if unbatched else (h_new, c_new)


class GRUCell(_Cell):
    """torch.nn.GRUCell: r, z gates; n = tanh(W_in x + b_in + r * (W_hn h + b_hn)); h' = (1 - z) n + z h."""

    _gates = 3

    def forward(self, input, hx=None):  # noqa: A002 (torch's argument name)
        x, h, unbatched = self._batched(input, hx)
        xr, xz, xn = F.chunk(self._input_part(x), 3, -1)
        hidden = self._hidden_part(h)
        hr, hz, hn = (None, None, None) if hidden is None else F.chunk(hidden, 3, -1)
        r, z = F.sigmoid(_plus(xr, hr)), F.sigmoid(_plus(xz, hz))
        n = F.tanh(xn if hn is None else xn + r * hn)
        h_new = n - z * n if h is None else n + z * (h - n)
        return F.squeeze(h_new, 0) if unbatched else h_new
