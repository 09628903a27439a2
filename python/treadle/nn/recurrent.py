"""Recurrent layers with torch.nn.RNN / GRU / LSTM semantics (arguments, parameter names, gate order,
initialisation), run as one fused op per layer and direction.

forward(x, hx=None, lengths=None) returns (output, h_n) for RNN and GRU and (output, (h_n, c_n))
for LSTM, as symbolic values. `lengths` is an optional int64 model input of shape (N,): samples
stop at their own length (outputs past it are zeros, h_n/c_n are taken at each sample's last
step), like a pack_padded_sequence / pad_packed_sequence round trip in PyTorch.

A typical regression model keeps the last layer's final state:

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = tl.nn.LSTM(16, 64, num_layers=2, batch_first=True)
            self.fc = tl.nn.Linear(64, 1)

        def forward(self, x):
            out, (h, c) = self.lstm(x)
            return self.fc(h[-1])
"""
from .. import _core
from .. import functional as F
from .cells import GRUCell, LSTMCell, RNNCell  # noqa: F401 (one step per call)
from .module import _NativeModule, _int_args

__all__ = ["RNN", "GRU", "LSTM", "RNNCell", "LSTMCell", "GRUCell"]


class _Recurrent(_NativeModule):
    _is_lstm = False

    def __init__(self, native):
        super().__init__(native)

    def forward(self, input, hx=None, lengths=None):  # noqa: A002 (torch's keyword)
        x = input
        if x.ndim == 2:  # unbatched (L, H_in), as torch: a batch of one
            return self._unbatched(x, hx, lengths)
        if self._is_lstm:
            h0, c0 = (None, None) if hx is None else hx
            out, h_n, c_n = self._native.forward_all(x, h0, c0, lengths)
            return out, (h_n, c_n)
        out, h_n, _ = self._native.forward_all(x, hx, None, lengths)
        return out, h_n

    def _unbatched(self, x, hx, lengths):
        if lengths is not None:
            raise ValueError(f"{type(self).__name__}: lengths needs batched input (N samples, N lengths)")
        at = 0 if self.batch_first else 1
        if x.shape[-1] != self.input_size:
            layout = "N, T" if self.batch_first else "T, N"
            raise ValueError(f"{type(self).__name__}: expected input of shape ({layout}, {self.input_size}), got "
                             f"{tuple(x.shape)} (or (T, {self.input_size}) unbatched)")

        def each(state, fn):
            return None if state is None else tuple(fn(h) for h in state) if isinstance(state, tuple) else fn(state)

        out, state = self.forward(F.unsqueeze(x, at), each(hx, lambda h: F.unsqueeze(h, 1)))
        return F.squeeze(out, at), each(state, lambda h: F.squeeze(h, 1))

    def __getattr__(self, name):
        # weight_ih_l0, bias_hh_l1_reverse, ...: writable numpy views, as torch exposes them.
        if name.startswith(("weight_", "bias_")):
            native = self.__dict__.get("_native")
            params = dict(native.named_parameters()) if native is not None else {}
            if name in params:
                return params[name].data
        return super().__getattr__(name)

    def config(self):
        """The constructor arguments (tl.save writes them; tl.load rebuilds the layer from them). The
        dtype is the file's own."""
        n = self._native
        cfg = {"input_size": n.input_size, "hidden_size": n.hidden_size, "num_layers": n.num_layers, "bias": n.bias,
               "batch_first": n.batch_first, "dropout": n.dropout, "bidirectional": n.bidirectional}
        if n.cell.startswith("rnn_"):
            cfg["nonlinearity"] = n.cell[len("rnn_"):]
        return cfg

    @property
    def input_size(self):
        return self._native.input_size

    @property
    def hidden_size(self):
        return self._native.hidden_size

    @property
    def num_layers(self):
        return self._native.num_layers

    @property
    def batch_first(self):
        return self._native.batch_first

    @property
    def bidirectional(self):
        return self._native.bidirectional

    @property
    def dropout(self):
        return self._native.dropout

    @property
    def bias(self):
        return self._native.bias

    def extra_repr(self):
        n = self._native
        s = f"{n.input_size}, {n.hidden_size}"
        if n.num_layers != 1:
            s += f", num_layers={n.num_layers}"
        if n.cell == "rnn_relu":
            s += ", nonlinearity='relu'"
        if not n.bias:
            s += ", bias=False"
        if n.batch_first:
            s += ", batch_first=True"
        if n.dropout:
            s += f", dropout={n.dropout:g}"
        if n.bidirectional:
            s += ", bidirectional=True"
        return s


class RNN(_Recurrent):
    """Elman RNN: h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu)."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, dtype="float32"):
        input_size, hidden_size, num_layers = _int_args(self, input_size=input_size, hidden_size=hidden_size,
                                                        num_layers=num_layers)
        super().__init__(_core.RNN(input_size, hidden_size, num_layers, str(nonlinearity), bool(bias),
                                   bool(batch_first), float(dropout), bool(bidirectional), dtype))


class GRU(_Recurrent):
    """Gated recurrent unit; gates (r, z, n) with n = tanh(W_in x + b_in + r * (W_hn h + b_hn))."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, dtype="float32"):
        input_size, hidden_size, num_layers = _int_args(self, input_size=input_size, hidden_size=hidden_size,
                                                        num_layers=num_layers)
        super().__init__(_core.GRU(input_size, hidden_size, num_layers, bool(bias), bool(batch_first),
                                   float(dropout), bool(bidirectional), dtype))


class LSTM(_Recurrent):
    """Long short-term memory; gates (i, f, g, o). forward returns (output, (h_n, c_n)). With
    proj_size > 0 the layer is torch's LSTMP, composed step by step (lstm_projected.py)."""

    _is_lstm = True

    def __new__(cls, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                bidirectional=False, proj_size=0, device=None, dtype="float32"):
        if cls is LSTM and proj_size:
            from .lstm_projected import ProjectedLSTM
            return ProjectedLSTM(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                                 proj_size, device=device, dtype=dtype)
        return super().__new__(cls)

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, dtype="float32"):
        if proj_size:
            raise ValueError(f"{type(self).__name__}: proj_size is built by tl.nn.LSTM itself (a composed layer)")
        input_size, hidden_size, num_layers = _int_args(self, input_size=input_size, hidden_size=hidden_size,
                                                        num_layers=num_layers)
        super().__init__(_core.LSTM(input_size, hidden_size, num_layers, bool(bias), bool(batch_first),
                                    float(dropout), bool(bidirectional), dtype))


def _symbol_getitem(self, index):
    """Basic indexing of a symbolic value: integers and step-1 slices per leading axis (h_n[-1],
    out[:, -1]); integer indices drop their axis, as in numpy."""
    f = _core.functional
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) > self.ndim:
        raise IndexError(f"too many indices ({len(index)}) for a symbol of shape {self.shape}")
    shape, keep, x = self.shape, [], self
    for axis, ix in enumerate(index):
        size = shape[axis]
        if isinstance(ix, slice):
            start, stop, step = ix.indices(size)
            if step != 1:
                raise IndexError(f"symbol slicing supports step 1 only, got step {ix.step}")
            if (start, stop) != (0, size):
                x = f.slice(x, axis, start, max(start, stop))
            keep.append(max(0, stop - start))
        elif isinstance(ix, int) and not isinstance(ix, bool):
            if not -size <= ix < size:
                raise IndexError(f"index {ix} is out of range for axis {axis} of size {size}")
            ix %= size
            x = f.slice(x, axis, ix, ix + 1)
        else:
            raise TypeError(f"symbols are indexed by integers and slices, got {type(ix).__name__}")
    new_shape = keep + list(shape[len(index):])
    return x if list(x.shape) == new_shape else f.reshape(x, new_shape)


if not hasattr(_core.Symbol, "__getitem__"):  # until the core binds indexing itself
    _core.Symbol.__getitem__ = _symbol_getitem
