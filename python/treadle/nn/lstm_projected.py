"""LSTM with torch's proj_size > 0 (LSTMP): h_t = W_hr (o_t * tanh(c_t)), the hidden state projected to
proj_size, composed from verified ops step by step as torch's recurrence (gates i, f, g, o; each layer
and direction its own weight_ih_l{k}, weight_hh_l{k} (4H, P), bias_ih/bias_hh and weight_hr_l{k} (P, H),
with the `_reverse` twins). tl.nn.LSTM builds this module when proj_size > 0; the plain case is the
native fused layer. The time loop is unrolled into the graph once per input signature, so long
sequences make large plans: the fused layer stays the fast path.
"""
import math

import numpy as np

from .. import functional as F
from .. import tensors
from .module import Module, _int_args
from .init import uniform_
from .parameter import Parameter

__all__ = []


class ProjectedLSTM(Module):
    """torch.nn.LSTM(..., proj_size=P) with P > 0: forward(x, hx=None, lengths=None) returns
    (output (T, N, D * P), (h_n (L * D, N, P), c_n (L * D, N, H))), batch_first and unbatched inputs
    as torch; `lengths` (int64, (N,)) stops each sample at its own length, as the native layer's."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, dtype=None):
        super().__init__()
        input_size, hidden_size, num_layers, proj_size = _int_args(
            self, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, proj_size=proj_size)
        if not 0 < proj_size < hidden_size:
            raise ValueError(f"LSTM: proj_size must be between 1 and hidden_size - 1 ({hidden_size - 1}), got {proj_size}")
        if input_size <= 0 or num_layers <= 0:
            raise ValueError(f"LSTM: input_size and num_layers must be positive, got {input_size}, {num_layers}")
        if not 0.0 <= float(dropout) <= 1.0:
            raise ValueError(f"LSTM: dropout must be in [0, 1], got {dropout}")
        self.input_size, self.hidden_size, self.num_layers, self.proj_size = input_size, hidden_size, num_layers, proj_size
        self.bias, self.batch_first, self.dropout = bool(bias), bool(batch_first), float(dropout)
        self.bidirectional = bool(bidirectional)
        directions = 2 if bidirectional else 1
        bound = 1.0 / math.sqrt(hidden_size)  # torch: every weight and bias ~ U(-1/sqrt(H), 1/sqrt(H))
        dtype = dtype or "float32"
        for layer in range(num_layers):
            width = input_size if layer == 0 else proj_size * directions
            for d in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if d else "")
                shapes = [("weight_ih", (4 * hidden_size, width)), ("weight_hh", (4 * hidden_size, proj_size))]
                if bias:
                    shapes += [("bias_ih", (4 * hidden_size,)), ("bias_hh", (4 * hidden_size,))]
                shapes.append(("weight_hr", (proj_size, hidden_size)))
                for name, shape in shapes:
                    p = Parameter(np.zeros(shape), dtype=dtype)
                    uniform_(p, -bound, bound)
                    setattr(self, name + suffix, p)

    def config(self):
        return {"input_size": self.input_size, "hidden_size": self.hidden_size, "num_layers": self.num_layers,
                "bias": self.bias, "batch_first": self.batch_first, "dropout": self.dropout,
                "bidirectional": self.bidirectional, "proj_size": self.proj_size}

    def extra_repr(self):
        extra = "" if self.num_layers == 1 else f", num_layers={self.num_layers}"
        extra += "" if self.bias else ", bias=False"
        extra += ", batch_first=True" if self.batch_first else ""
        extra += f", dropout={self.dropout:g}" if self.dropout else ""
        extra += ", bidirectional=True" if self.bidirectional else ""
        return f"{self.input_size}, {self.hidden_size}{extra}, proj_size={self.proj_size}"

    def forward(self, input, hx=None, lengths=None):  # noqa: A002 (torch's keyword)
        x = input
        if x.ndim == 2:  # unbatched (T, H_in): a batch of one, as torch
            if lengths is not None:
                raise ValueError("LSTM: lengths needs batched input (N samples, N lengths)")
            states = None if hx is None else tuple(F.unsqueeze(h, 1) for h in hx)
            out, (h_n, c_n) = self.forward(F.unsqueeze(x, 0 if self.batch_first else 1), states)
            return F.squeeze(out, 0 if self.batch_first else 1), (F.squeeze(h_n, 1), F.squeeze(c_n, 1))
        if x.ndim != 3 or x.shape[-1] != self.input_size:
            layout = "N, T" if self.batch_first else "T, N"
            raise ValueError(f"LSTM: expected input of shape ({layout}, {self.input_size}), got {tuple(x.shape)}")
        seq = F.transpose(x, 0, 1) if self.batch_first else x
        steps, batch = seq.shape[0], seq.shape[1]
        directions = 2 if self.bidirectional else 1
        h0, c0 = self._initial_states(hx, batch, directions)
        masks = None if lengths is None else _step_masks(lengths, steps, batch)
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(directions):
                k = layer * directions + d
                out, h, c = self._direction(seq, layer, d, h0[k], c0[k], masks)
                outs.append(out)
                h_n.append(h)
                c_n.append(c)
            seq = outs[0] if directions == 1 else F.cat(outs, 2)
            if self.dropout and layer + 1 < self.num_layers:
                seq = F.dropout(seq, self.dropout)  # between layers, training only (as torch)
        output = F.transpose(seq, 0, 1) if self.batch_first else seq
        return output, (_stack(h_n), _stack(c_n))

    def _initial_states(self, hx, batch, directions):
        count = self.num_layers * directions
        if hx is None:
            h = [tensors.zeros(batch, self.proj_size) for _ in range(count)]
            return h, [tensors.zeros(batch, self.hidden_size) for _ in range(count)]
        h0, c0 = hx
        for state, width, name in ((h0, self.proj_size, "h_0"), (c0, self.hidden_size, "c_0")):
            if tuple(state.shape) != (count, batch, width):
                raise ValueError(f"LSTM: expected {name} of shape {(count, batch, width)}, got {tuple(state.shape)}")
        return [h0[k] for k in range(count)], [c0[k] for k in range(count)]

    def _direction(self, seq, layer, d, h, c, masks):
        """One layer in one direction: (outputs (T, N, P), final h, final c)."""
        suffix = f"_l{layer}" + ("_reverse" if d else "")
        w_ih, w_hh, w_hr = (getattr(self, n + suffix) for n in ("weight_ih", "weight_hh", "weight_hr"))
        b_ih, b_hh = (getattr(self, n + suffix) for n in ("bias_ih", "bias_hh")) if self.bias else (None, None)
        steps, batch = seq.shape[0], seq.shape[1]
        # The input's share of the gates for every step at once: one product of (T * N, width).
        gates_x = F.reshape(F.linear(F.reshape(seq, [steps * batch, seq.shape[2]]), w_ih, b_ih),
                            [steps, batch, 4 * self.hidden_size])
        outs = [None] * steps
        for t in (reversed(range(steps)) if d else range(steps)):
            gates = F.add(F.reshape(F.slice(gates_x, 0, t, t + 1), [batch, 4 * self.hidden_size]),
                          F.linear(h, w_hh, b_hh))
            i, f, g, o = F.chunk(gates, 4, 1)
            c_new = F.add(F.mul(F.sigmoid(f), c), F.mul(F.sigmoid(i), F.tanh(g)))
            h_new = F.linear(F.mul(F.sigmoid(o), F.tanh(c_new)), w_hr)
            if masks is None:
                h, c, outs[t] = h_new, c_new, h_new
            else:  # past a sample's length: its state stays, its output is zero
                m = masks[t]
                h, c = F.where(m, h_new, h), F.where(m, c_new, c)
                outs[t] = F.where(m, h_new, F.zeros_like(h_new))
        return F.cat([F.unsqueeze(o, 0) for o in outs], 0), h, c


def _stack(states):
    return F.cat([F.unsqueeze(s, 0) for s in states], 0)


def _step_masks(lengths, steps, batch):
    """Per step t, (N, 1) of 1 where t < lengths[n], else 0, in the model's float dtype."""
    if tuple(lengths.shape) != (batch,):
        raise ValueError(f"LSTM: lengths must have shape ({batch},), got {tuple(lengths.shape)}")
    ones, zeros = tensors.ones(batch), tensors.zeros(batch)
    return [F.reshape(F.where(F.gt(lengths, t), ones, zeros), [batch, 1]) for t in range(steps)]
