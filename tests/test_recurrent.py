"""Recurrent layers: RNN (tanh, relu), GRU and LSTM.

- The fused layer ops (rnn_layer, gru_layer, lstm_layer) against float64 central differences and
  against torch.nn in float32 and float64: outputs, final states and every gradient (input, initial
  states, weights, biases) over batch_first, reverse direction, bias and variable lengths.
- Two layer ops chained by hand against a 2-layer torch module (gradients through the stack).
- The modules: outputs and final states through `predict` with initial states and lengths as model
  inputs, and every gradient through the trainer's host-driven backward, for 1 and 2 layers,
  batch_first, initial states, bidirectional; dropout between layers; bias=False.
- A 2-layer LSTM regression (last hidden state -> Linear) trained 100 steps against PyTorch.
- Errors for bad input name the layer and the expected and given shapes.
"""
import itertools

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import treadle as tl
from opcheck import BACKENDS, numeric_grads, run, tol

F = tl.functional

# cell -> (gates, op, torch class, torch kwargs, op attributes)
CELLS = {
    "rnn_tanh": (1, "rnn_layer", torch.nn.RNN, {"nonlinearity": "tanh"}, {"nonlinearity": "tanh"}),
    "rnn_relu": (1, "rnn_layer", torch.nn.RNN, {"nonlinearity": "relu"}, {"nonlinearity": "relu"}),
    "gru": (3, "gru_layer", torch.nn.GRU, {}, {}),
    "lstm": (4, "lstm_layer", torch.nn.LSTM, {}, {}),
}
WEIGHT_NAMES = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}
# Lengths per sample for T = 5: None, a mix reaching T (with a tie), and one whose longest is < T.
LENGTHS = {"none": None, "mixed": [3, 5, 1, 3], "short": [2, 4, 1, 4]}
T, N, I, H = 5, 4, 3, 6


@pytest.fixture(autouse=True, scope="module")
def torch_single_thread():
    """The references are tiny: torch's thread pool only adds overhead on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def torch_dtype(dtype):
    return torch.float64 if np.dtype(dtype) == np.float64 else torch.float32


def grad_tol(dtype):
    """Gradients sum over steps and samples: float32 rounding grows with the sum (~1e-5 relative)."""
    return tol(dtype) if np.dtype(dtype) == np.float64 else dict(rtol=1e-5, atol=1e-5)


def layer_arrays(cell, dtype, batch_first, bias=True, seed=0, sizes=(T, N, I, H)):
    """Random inputs of one layer op by name: x, h0, (c0), w_ih, w_hh, (b_ih, b_hh)."""
    t, n, i, h = sizes
    g = CELLS[cell][0]
    rng = np.random.default_rng(seed)
    k = 1.0 / np.sqrt(h)
    a = {"x": rng.standard_normal((n, t, i) if batch_first else (t, n, i)), "h0": 0.5 * rng.standard_normal((n, h))}
    if cell == "lstm":
        a["c0"] = 0.5 * rng.standard_normal((n, h))
    a["w_ih"] = rng.uniform(-k, k, (g * h, i))
    a["w_hh"] = rng.uniform(-k, k, (g * h, h))
    if bias:
        a["b_ih"] = rng.uniform(-k, k, g * h)
        a["b_hh"] = rng.uniform(-k, k, g * h)
    return {key: v.astype(dtype) for key, v in a.items()}


def op_inputs(a, lengths):
    keys = [k for k in ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh") if k in a]
    ins = [a[k] for k in keys]
    if lengths is not None:
        ins.append(np.asarray(lengths, dtype=np.int64))
    return keys, ins


def op_attrs(cell, batch_first, reverse):
    return {"batch_first": batch_first, "reverse": reverse, **CELLS[cell][4]}


def num_states(cell):
    return 2 if cell == "lstm" else 1


def treadle_layer(cell, a, batch_first, reverse, lengths, seeds, backend):
    """One layer op: (y, h_n[, c_n]) and the gradients by input name. `seeds` holds one upstream
    gradient per public output; the saved buffer gets none."""
    keys, ins = op_inputs(a, lengths)
    grads_out = list(seeds) + ([None] if cell in ("gru", "lstm") else [])
    outs, grads = run(CELLS[cell][1], ins, op_attrs(cell, batch_first, reverse), grads_out, backend)
    return outs[:len(seeds)], dict(zip(keys, grads))


def pack(x, lengths, batch_first):
    if lengths is None:
        return x
    return pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False)


def unpack(y, lengths, batch_first, total):
    if lengths is None:
        return y
    return pad_packed_sequence(y, batch_first=batch_first, total_length=total)[0]


def torch_layer(cell, a, batch_first, reverse, lengths, seeds):
    """The same layer with torch.nn (the reverse direction is the second half of a bidirectional
    layer): outputs and gradients by name. Variable lengths go through pack/pad_packed_sequence."""
    _, _, cls, kw, _ = CELLS[cell]
    i, h = a["w_ih"].shape[1], a["w_hh"].shape[1]
    m = cls(i, h, bias="b_ih" in a, batch_first=batch_first, bidirectional=reverse, **kw).to(torch_dtype(a["x"].dtype))
    suffix = "_l0_reverse" if reverse else "_l0"
    with torch.no_grad():
        for key, name in WEIGHT_NAMES.items():
            if key in a:
                getattr(m, name + suffix).copy_(torch.from_numpy(a[key]))
    t = {k: torch.tensor(a[k], requires_grad=True) for k in ("x", "h0", "c0") if k in a}

    def state(k):
        s = t[k][None]
        return torch.cat([torch.zeros_like(s), s]) if reverse else s

    hx = (state("h0"), state("c0")) if cell == "lstm" else state("h0")
    y, hn = m(pack(t["x"], lengths, batch_first), hx)
    y = unpack(y, lengths, batch_first, a["x"].shape[1 if batch_first else 0])
    states = list(hn) if cell == "lstm" else [hn]
    d = 1 if reverse else 0
    outs = [y[..., h:] if reverse else y] + [s[d] for s in states]
    torch.autograd.backward(outs, [torch.from_numpy(g) for g in seeds])
    grads = {k: v.grad.numpy() for k, v in t.items()}
    grads.update({k: getattr(m, n + suffix).grad.numpy() for k, n in WEIGHT_NAMES.items() if k in a})
    return [o.detach().numpy() for o in outs], grads


def random_seeds(shapes, dtype, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def assert_close(ours, ref, dtype, what):
    np.testing.assert_allclose(ours, ref, **tol(dtype), err_msg=what)


def assert_layer_matches_torch(cell, a, batch_first, reverse, lengths, seeds, backend, dtype):
    """Outputs, final states and every gradient of one layer op against torch.nn."""
    outs, grads = treadle_layer(cell, a, batch_first, reverse, lengths, seeds, backend)
    ref_outs, ref_grads = torch_layer(cell, a, batch_first, reverse, lengths, seeds)
    for name, o, r in zip(["output", "h_n", "c_n"], outs, ref_outs):
        assert_close(o, r, dtype, f"{cell} {name}")
    for k, r in ref_grads.items():
        np.testing.assert_allclose(grads[k], r, **grad_tol(dtype), err_msg=f"{cell}: gradient of {k}")


# ---- layer ops against PyTorch -----------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=list(LENGTHS))
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tnf", "ntf"])
@pytest.mark.parametrize("cell", list(CELLS))
def test_layer_op_vs_torch(backend, cell, batch_first, reverse, lengths, dtype):
    a = layer_arrays(cell, dtype, batch_first)
    lens = LENGTHS[lengths]
    y_shape = (N, T, H) if batch_first else (T, N, H)
    seeds = random_seeds([y_shape] + [(N, H)] * num_states(cell), dtype)
    assert_layer_matches_torch(cell, a, batch_first, reverse, lens, seeds, backend, dtype)


# Sizes past the blocking of the step products (backends/eigen/small_gemm.hpp): N = 13 fills two
# 6-row blocks and leaves one row, H = 70 leaves a partial packet at the right edge, 4H = 280 and
# T*N = 312 exceed the 256-long K blocks; the lengths make the active batch shrink step by step.
BLOCKED_SIZES = (24, 13, 5, 70)
BLOCKED_LENGTHS = [24, 7, 24, 1, 13, 20, 24, 2, 9, 24, 16, 5, 11]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("lengths", [None, BLOCKED_LENGTHS], ids=["full", "mixed"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_layer_op_blocked_sizes_vs_torch(backend, cell, lengths, dtype):
    t, n, _, h = BLOCKED_SIZES
    a = layer_arrays(cell, dtype, True, seed=5, sizes=BLOCKED_SIZES)
    seeds = random_seeds([(n, t, h)] + [(n, h)] * num_states(cell), dtype)
    assert_layer_matches_torch(cell, a, True, False, lengths, seeds, backend, dtype)


@pytest.mark.parametrize("cell", list(CELLS))
def test_eigen_time_loop_pieces_are_bitwise_the_serial_run(cell):
    """The Eigen kernels run the time loops in pieces of samples, one per worker (up to 5 here):
    outputs and every gradient are bitwise those of one worker, with variable lengths."""
    t, n, h = 24, 40, 70
    a = layer_arrays(cell, np.float32, True, seed=9, sizes=(t, n, 5, h))
    lengths = np.random.default_rng(9).integers(1, t + 1, n)
    lengths[:3] = t
    keys, ins = op_inputs(a, lengths)
    seeds = random_seeds([(n, t, h)] + [(n, h)] * num_states(cell), np.float32)
    grads_out = seeds + ([None] if cell in ("gru", "lstm") else [])
    op, attrs = CELLS[cell][1], op_attrs(cell, True, False)
    serial = tl._core.run_op(op, ins, attrs, grads_out, "eigen", True, 0, 1)
    for workers in (2, 3, 7):
        outs, grads = tl._core.run_op(op, ins, attrs, grads_out, "eigen", True, 0, workers)
        for got, want in zip(outs + grads, serial[0] + serial[1]):
            if want is not None:
                np.testing.assert_array_equal(got, want, err_msg=f"{cell}, {workers} workers")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", list(CELLS))
def test_layer_op_without_bias(backend, cell):
    a = layer_arrays(cell, np.float64, False, bias=False)
    seeds = random_seeds([(T, N, H)] + [(N, H)] * num_states(cell), np.float64)
    outs, grads = treadle_layer(cell, a, False, False, LENGTHS["mixed"], seeds, backend)
    ref_outs, ref_grads = torch_layer(cell, a, False, False, LENGTHS["mixed"], seeds)
    for o, r in zip(outs, ref_outs):
        assert_close(o, r, np.float64, cell)
    for k, r in ref_grads.items():
        assert_close(grads[k], r, np.float64, f"{cell}: gradient of {k}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", list(CELLS))
def test_layer_op_outputs_past_length_are_zero(backend, cell):
    a = layer_arrays(cell, np.float64, True)
    lens = LENGTHS["short"]
    _, ins = op_inputs(a, lens)
    y = run(CELLS[cell][1], ins, op_attrs(cell, True, False))[0][0]
    for n, L in enumerate(lens):
        assert np.all(y[n, L:] == 0) and np.all(np.abs(y[n, :L]).sum(axis=-1) > 0)


# ---- finite differences --------------------------------------------------------------------------

def fd_check(op, ins, attrs, num_outputs, backend, seed=0):
    """Analytic gradients of every floating input vs central differences (float64). The saved
    buffer (an internal output) gets no upstream gradient."""
    outs, _ = run(op, ins, attrs, None, backend)
    gos = random_seeds([o.shape for o in outs[:num_outputs]], np.float64, seed) + [None] * (len(outs) - num_outputs)
    _, analytic = run(op, ins, attrs, gos, backend)
    wrt = [i for i, x in enumerate(ins) if x.dtype.kind == "f"]
    numeric = numeric_grads(op, [np.array(x, copy=True) for x in ins], attrs, gos, wrt, backend=backend)
    # Rounding noise of the central differences grows with the magnitude of the summed outputs.
    magnitude = sum(float(np.sum(np.abs(g * o))) for g, o in zip(gos, outs) if g is not None)
    for i in wrt:
        np.testing.assert_allclose(analytic[i], numeric[i], rtol=1e-7, atol=max(1e-8, 1e-9 * magnitude),
                                   err_msg=f"{op}: gradient of input {i} disagrees with finite differences")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("use_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tnf", "ntf"])
@pytest.mark.parametrize("cell", list(CELLS))
def test_layer_op_gradcheck(backend, cell, batch_first, reverse, use_lengths):
    a = layer_arrays(cell, np.float64, batch_first, seed=3, sizes=(3, 3, 2, 2))
    # Larger recurrent weights than the default init, so the recurrence matters to the gradients.
    a["w_hh"] *= 2.0
    _, ins = op_inputs(a, [2, 3, 1] if use_lengths else None)
    fd_check(CELLS[cell][1], ins, op_attrs(cell, batch_first, reverse), 1 + num_states(cell), backend)


# ---- two layer ops chained, against a 2-layer torch module -----------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("lengths", ["none", "mixed"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tnf", "ntf"])
@pytest.mark.parametrize("cell", list(CELLS))
def test_two_layer_chain_vs_torch(backend, cell, batch_first, lengths, dtype):
    lens = LENGTHS[lengths]
    a0 = layer_arrays(cell, dtype, batch_first, seed=10)
    a1 = layer_arrays(cell, dtype, batch_first, seed=11, sizes=(T, N, H, H))
    op, attrs = CELLS[cell][1], op_attrs(cell, batch_first, False)
    k0, ins0 = op_inputs(a0, lens)
    y0 = run(op, ins0, attrs)[0][0]
    a1["x"] = y0
    k1, ins1 = op_inputs(a1, lens)
    outs1 = run(op, ins1, attrs)[0]
    y_shape = (N, T, H) if batch_first else (T, N, H)
    ns = num_states(cell)
    seeds = random_seeds([y_shape] + [(2, N, H)] * ns, dtype)  # states stacked (layer, N, H) as torch
    extra = [None] if cell in ("gru", "lstm") else []
    _, g1 = run(op, ins1, attrs, [seeds[0]] + [s[1] for s in seeds[1:]] + extra, backend)
    _, g0 = run(op, ins0, attrs, [g1[0]] + [s[0] for s in seeds[1:]] + extra, backend)
    g0, g1 = dict(zip(k0, g0)), dict(zip(k1, g1))

    _, _, cls, kw, _ = CELLS[cell]
    m = cls(I, H, num_layers=2, batch_first=batch_first, **kw).to(torch_dtype(dtype))
    with torch.no_grad():
        for layer, a in enumerate((a0, a1)):
            for key, name in WEIGHT_NAMES.items():
                getattr(m, f"{name}_l{layer}").copy_(torch.from_numpy(a[key]))
    x = torch.tensor(a0["x"], requires_grad=True)
    h0 = torch.tensor(np.stack([a0["h0"], a1["h0"]]), requires_grad=True)
    c0 = torch.tensor(np.stack([a0["c0"], a1["c0"]]), requires_grad=True) if cell == "lstm" else None
    y, hn = m(pack(x, lens, batch_first), (h0, c0) if cell == "lstm" else h0)
    y = unpack(y, lens, batch_first, T)
    states = list(hn) if cell == "lstm" else [hn]
    torch.autograd.backward([y] + states, [torch.from_numpy(s) for s in seeds])

    assert_close(outs1[0], y.detach().numpy(), dtype, "output")
    for j, s in enumerate(states):
        assert_close(outs1[1 + j], s[1].detach().numpy(), dtype, "final state of layer 1")
    gt = grad_tol(dtype)
    np.testing.assert_allclose(g0["x"], x.grad.numpy(), **gt, err_msg="input gradient")
    np.testing.assert_allclose(np.stack([g0["h0"], g1["h0"]]), h0.grad.numpy(), **gt, err_msg="h0 gradient")
    if cell == "lstm":
        np.testing.assert_allclose(np.stack([g0["c0"], g1["c0"]]), c0.grad.numpy(), **gt, err_msg="c0 gradient")
    for layer, g in enumerate((g0, g1)):
        for key, name in WEIGHT_NAMES.items():
            np.testing.assert_allclose(g[key], getattr(m, f"{name}_l{layer}").grad.numpy(), **gt,
                                       err_msg=f"{name}_l{layer} gradient")


# ---- modules ----------------------------------------------------------------------------------------

MODULES = {"RNN": (tl.nn.RNN, torch.nn.RNN), "GRU": (tl.nn.GRU, torch.nn.GRU), "LSTM": (tl.nn.LSTM, torch.nn.LSTM)}


def module_pair(kind, dtype, seed=0, **kw):
    """A treadle module and a torch module with the same weights (copied from torch's init)."""
    torch.manual_seed(seed)
    ref = MODULES[kind][1](I, H, **kw).to(torch_dtype(dtype))
    ours = MODULES[kind][0](I, H, **kw)
    return ours, ref


def load_from(module, ref, prefix=""):
    if np.dtype(module.dtype) != np.dtype(ref.weight_ih_l0.detach().numpy().dtype):
        module.to(str(ref.weight_ih_l0.detach().numpy().dtype))
    module.load_state_dict({prefix + k: v.detach().numpy() for k, v in ref.state_dict().items()})


class Wrap(tl.nn.Module):
    """x [, h0 (, c0)] [, lengths] as model inputs -> output, h_n (, c_n) as model outputs."""

    def __init__(self, rnn, has_state, has_lengths):
        super().__init__()
        self.rnn = rnn
        self.has_state, self.has_lengths = has_state, has_lengths
        self.lstm = isinstance(rnn, tl.nn.LSTM)

    def forward(self, x, *rest):
        rest = list(rest)
        hx = None
        if self.has_state:
            hx = (rest.pop(0), rest.pop(0)) if self.lstm else rest.pop(0)
        lengths = rest.pop(0) if self.has_lengths else None
        out, h = self.rnn(x, hx, lengths)
        return (out,) + (tuple(h) if self.lstm else (h,))


def module_inputs(kind, dtype, batch_first, num_layers, dirs, has_state, lengths, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, T, I) if batch_first else (T, N, I)).astype(dtype)
    states = []
    if has_state:
        states = [(0.5 * rng.standard_normal((num_layers * dirs, N, H))).astype(dtype)
                  for _ in range(2 if kind == "LSTM" else 1)]
    lens = [] if lengths is None else [np.asarray(lengths, dtype=np.int64)]
    return x, states, lens


def torch_module_forward(ref, kind, x, states, lengths, batch_first):
    xt = torch.tensor(x, requires_grad=True)
    st = [torch.tensor(s, requires_grad=True) for s in states]
    hx = None if not st else (tuple(st) if kind == "LSTM" else st[0])
    y, hn = ref(pack(xt, lengths, batch_first), hx)
    y = unpack(y, lengths, batch_first, T)
    return xt, st, [y] + (list(hn) if kind == "LSTM" else [hn])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("lengths", ["none", "mixed"])
@pytest.mark.parametrize("has_state", [False, True], ids=["zero_state", "given_state"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tnf", "ntf"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("kind", list(MODULES))
def test_module_predict_vs_torch(kind, num_layers, batch_first, has_state, lengths, bidirectional, dtype):
    lens = LENGTHS[lengths]
    ours, ref = module_pair(kind, dtype, num_layers=num_layers, batch_first=batch_first, bidirectional=bidirectional)
    model = Wrap(ours, has_state, lens is not None)
    load_from(model, ref, "rnn.")
    x, states, lens_in = module_inputs(kind, dtype, batch_first, num_layers, 1 + bidirectional, has_state, lens)
    outs = model.predict([x] + states + lens_in)
    _, _, ref_outs = torch_module_forward(ref, kind, x, states, lens, batch_first)
    for name, o, r in zip(["output", "h_n", "c_n"], outs, ref_outs):
        assert o.shape == tuple(r.shape), name
        assert_close(o, r.detach().numpy(), dtype, f"{kind} {name}")


class Packed(tl.nn.Module):
    """One (1, K) input unpacked into x and initial states; (output, h_n[, c_n]) packed into one
    (1, M) output, so the trainer's host-driven backward returns every gradient of the module."""

    def __init__(self, rnn, x_shape, state_shapes):
        super().__init__()
        self.rnn, self.x_shape, self.state_shapes = rnn, x_shape, state_shapes
        self.lstm = isinstance(rnn, tl.nn.LSTM)

    def forward(self, z):
        parts, offset = [], 0
        for shape in [self.x_shape] + self.state_shapes:
            size = int(np.prod(shape))
            parts.append(F.reshape(F.slice(z, 1, offset, offset + size), list(shape)))
            offset += size
        x, states = parts[0], parts[1:]
        hx = None if not states else (tuple(states) if self.lstm else states[0])
        out, h = self.rnn(x, hx)
        outs = [out] + (list(h) if self.lstm else [h])
        return F.concat([F.reshape(o, [1, -1]) for o in outs], 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("has_state", [False, True], ids=["zero_state", "given_state"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tnf", "ntf"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("kind", list(MODULES))
def test_module_gradients_vs_torch(kind, num_layers, batch_first, has_state, bidirectional, dtype):
    ours, ref = module_pair(kind, dtype, seed=1, num_layers=num_layers, batch_first=batch_first,
                            bidirectional=bidirectional)
    x, states, _ = module_inputs(kind, dtype, batch_first, num_layers, 1 + bidirectional, has_state, None)
    model = Packed(ours, x.shape, [s.shape for s in states])
    load_from(model, ref, "rnn.")
    z = np.concatenate([a.reshape(1, -1) for a in [x] + states], axis=1)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    trainer.zero_grad()
    out = trainer.forward(z, input_grad=True)
    seed = random_seeds([out.shape], dtype)[0]
    dz = trainer.backward(seed, input_grad=True)

    xt, st, ref_outs = torch_module_forward(ref, kind, x, states, None, batch_first)
    ref_flat = torch.cat([o.reshape(1, -1) for o in ref_outs], 1)
    ref_flat.backward(torch.from_numpy(seed))
    assert_close(out, ref_flat.detach().numpy(), dtype, "outputs")
    gt = grad_tol(dtype)
    ref_dz = np.concatenate([t.grad.numpy().reshape(1, -1) for t in [xt] + st], axis=1)
    np.testing.assert_allclose(dz, ref_dz, **gt, err_msg="gradient of the input and initial states")
    grads = model.named_gradients()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads["rnn." + name], p.grad.numpy(), **gt, err_msg=f"gradient of {name}")


def test_module_parameters_follow_torch():
    for kind, (ours_cls, ref_cls) in MODULES.items():
        ours = ours_cls(3, 5, num_layers=2, bidirectional=True)
        ref = ref_cls(3, 5, num_layers=2, bidirectional=True)
        ours_sd = ours.state_dict()
        assert [n for n, _ in ours.named_parameter_objects()] == list(ref.state_dict()), kind  # buffer order
        for k, v in ref.state_dict().items():
            assert ours_sd[k].shape == tuple(v.shape), k
            assert ours_sd[k].dtype == np.float32
            # U(-1/sqrt(H), 1/sqrt(H)) as torch's reset_parameters
            assert np.abs(ours_sd[k]).max() <= 1 / np.sqrt(5) and np.abs(ours_sd[k]).max() > 0.3 / np.sqrt(5)
        assert ours.weight_ih_l1_reverse.shape == tuple(ref.weight_ih_l1_reverse.shape)
    assert tl.nn.GRU(3, 5, bias=False).state_dict().keys() == {"weight_ih_l0", "weight_hh_l0"}


def test_module_as_whole_model_and_rnn_relu():
    ours, ref = module_pair("RNN", np.float64, nonlinearity="relu", num_layers=2)
    load_from(ours, ref)
    x = np.random.default_rng(0).standard_normal((T, N, I))
    y, h = ours.predict(x)
    ry, rh = ref(torch.from_numpy(x))
    assert_close(y, ry.detach().numpy(), np.float64, "output")
    assert_close(h, rh.detach().numpy(), np.float64, "h_n")
    lstm, lref = module_pair("LSTM", np.float64, batch_first=True)
    load_from(lstm, lref)
    outs = lstm.predict(np.ascontiguousarray(x.transpose(1, 0, 2)))
    assert len(outs) == 3  # output, h_n, c_n: the nested (output, (h_n, c_n)) flattened


def test_module_without_bias():
    ours, ref = module_pair("LSTM", np.float64, bias=False, num_layers=2)
    load_from(ours, ref)
    x = np.random.default_rng(0).standard_normal((T, N, I))
    y, h, c = ours.predict(x)
    ry, (rh, rc) = ref(torch.from_numpy(x))
    for o, r in zip((y, h, c), (ry, rh, rc)):
        assert_close(o, r.detach().numpy(), np.float64, "no-bias LSTM")


def test_dropout_between_layers_training_only():
    ours, ref = module_pair("LSTM", np.float64, num_layers=3, dropout=0.5)
    model = Wrap(ours, False, False)
    load_from(model, ref, "rnn.")
    ref.eval()
    x = np.random.default_rng(0).standard_normal((T, N, I))
    y = model.predict([x])[0]  # eval: no dropout
    assert_close(y, ref(torch.from_numpy(x))[0].detach().numpy(), np.float64, "eval output")
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.0), seed=3)
    y_train = trainer.forward(x)[0]  # forward returns every output: (y, h, c)
    assert np.all(np.isfinite(y_train)) and not np.allclose(y_train, y)
    # Dropout with p = 1 zeroes the input of every layer after the first: layer 3 then sees zeros.
    ours1, ref1 = module_pair("GRU", np.float64, num_layers=2, dropout=1.0)
    m1 = Wrap(ours1, False, False)
    load_from(m1, ref1, "rnn.")
    y1 = tl.Trainer(m1, tl.loss.MSE(), tl.optim.SGD(lr=0.0)).forward(x)[0]
    ref1.train()
    np.testing.assert_allclose(y1, ref1(torch.from_numpy(x))[0].detach().numpy(), rtol=1e-11, atol=1e-12)


# ---- training ---------------------------------------------------------------------------------------

class Regressor(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = tl.nn.LSTM(4, 16, num_layers=2, batch_first=True)
        self.fc = tl.nn.Linear(16, 1)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.fc(h[-1])


class TorchRegressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 16, num_layers=2, batch_first=True)
        self.fc = torch.nn.Linear(16, 1)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.fc(h[-1])


@pytest.mark.parametrize("optimizer", ["Adam", "SGD"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_lstm_regression_trains_like_torch(dtype, optimizer):
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((64, 12, 4)).astype(dtype)
    ys = (np.sin(xs[:, :, 0].cumsum(axis=1)[:, -1:]) + 0.1 * xs[:, -1, 1:2]).astype(dtype)
    torch.manual_seed(0)
    ref = TorchRegressor().to(torch_dtype(dtype))
    ours = Regressor()
    if dtype == np.float64:
        ours.double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    opts = {"Adam": dict(lr=1e-2), "SGD": dict(lr=0.3, momentum=0.9)}[optimizer]
    trainer = tl.Trainer(ours, tl.loss.MSE(), getattr(tl.optim, optimizer)(**opts))
    ref_opt = getattr(torch.optim, optimizer)(ref.parameters(), **opts)
    ours_losses, ref_losses = [], []
    for step in range(100):
        idx = slice((step % 4) * 16, (step % 4 + 1) * 16)
        ours_losses.append(trainer.step(xs[idx], ys[idx]))
        ref_opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ref(torch.from_numpy(xs[idx])), torch.from_numpy(ys[idx]))
        loss.backward()
        ref_opt.step()
        ref_losses.append(loss.item())
    # The task is learnable, so the curves compared below mean something.
    assert np.mean(ref_losses[-4:]) < 0.7 * np.mean(ref_losses[:4])
    rtol = 1e-9 if dtype == np.float64 else 2e-3
    np.testing.assert_allclose(ours_losses, ref_losses, rtol=rtol, err_msg="loss curve differs from PyTorch")


# ---- errors -----------------------------------------------------------------------------------------

def test_module_errors_name_layer_and_shapes():
    lstm = tl.nn.LSTM(4, 3, num_layers=2)
    with pytest.raises(ValueError, match=r"LSTM: expected input of shape \(T, N, 4\), got \(5, 2, 6\)"):
        Wrap(lstm, False, False).predict([np.zeros((5, 2, 6), np.float32)])
    gru = tl.nn.GRU(4, 3, batch_first=True)
    with pytest.raises(ValueError, match=r"GRU: expected input of shape \(N, T, 4\), got \(2, 5\)"):
        Wrap(gru, False, False).predict([np.zeros((2, 5), np.float32)])
    lstm = tl.nn.LSTM(4, 3, num_layers=2)
    x = np.zeros((5, 2, 4), np.float32)
    with pytest.raises(ValueError, match=r"LSTM: expected h0 of shape \(2, 2, 3\), got \(1, 2, 3\)"):
        Wrap(lstm, True, False).predict([x, np.zeros((1, 2, 3), np.float32), np.zeros((2, 2, 3), np.float32)])
    rnn = tl.nn.RNN(4, 3)
    with pytest.raises(ValueError, match=r"RNN: expected lengths of shape \(2,\) and dtype int64, got \(3,\)"):
        Wrap(rnn, False, True).predict([x, np.ones(3, np.int64)])


@pytest.mark.parametrize("bad", [[6, 2], [0, 2], [3, -1]])
@pytest.mark.parametrize("kind", list(MODULES))
def test_lengths_out_of_range(kind, bad):
    model = Wrap(MODULES[kind][0](4, 3, num_layers=2), False, True)
    x = np.zeros((5, 2, 4), np.float32)
    n = 0 if bad[0] in (6, 0) else 1
    msg = rf"{kind} \(layer 0\): lengths must be in \[1, 5\] \(the sequence length\), got lengths\[{n}\] = {bad[n]}"
    with pytest.raises(ValueError, match=msg):
        model.predict([x, np.asarray(bad, np.int64)])
    assert model.predict([x, np.asarray([5, 1], np.int64)])[0].shape == (5, 2, 3)  # still usable


def test_constructor_errors():
    with pytest.raises(ValueError, match="RNN: nonlinearity must be 'tanh' or 'relu', got 'gelu'"):
        tl.nn.RNN(2, 3, nonlinearity="gelu")
    with pytest.raises(ValueError, match=r"LSTM: input_size and hidden_size must be positive, got \(0, 3\)"):
        tl.nn.LSTM(0, 3)
    with pytest.raises(ValueError, match="GRU: num_layers must be at least 1, got 0"):
        tl.nn.GRU(2, 3, num_layers=0)
    with pytest.raises(ValueError, match=r"LSTM: dropout must be in \[0, 1\], got 1.5"):
        tl.nn.LSTM(2, 3, dropout=1.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_op_errors(backend):
    a = layer_arrays("lstm", np.float64, False)
    _, ins = op_inputs(a, None)
    bad = list(ins)
    bad[0] = np.zeros((T, N, I + 1))
    with pytest.raises(ValueError, match=r"lstm_layer: expected input of shape \(T, N, 3\) with N, T >= 1, got "
                                         r"\(5, 4, 4\)"):
        run("lstm_layer", bad, {}, None, backend)
    bad = list(ins)
    bad[1] = np.zeros((N + 1, H))
    with pytest.raises(ValueError, match=r"lstm_layer: expected h0 of shape \(4, 6\), got \(5, 6\)"):
        run("lstm_layer", bad, {}, None, backend)
    bad = list(ins)
    bad[3] = np.zeros((3 * H, I))
    with pytest.raises(ValueError, match=r"lstm_layer: weight_ih must have shape \(24, input_size\), got \(18, 3\)"):
        run("lstm_layer", bad, {}, None, backend)
    with pytest.raises(TypeError, match="lstm_layer: lengths must be int64, got float64"):
        run("lstm_layer", ins + [np.full(N, 2.0)], {}, None, backend)
    with pytest.raises(TypeError, match="gru_layer: inputs must share one dtype"):
        g = layer_arrays("gru", np.float64, False)
        _, gins = op_inputs(g, None)
        gins[2] = gins[2].astype(np.float32)
        run("gru_layer", gins, {}, None, backend)
    with pytest.raises(ValueError, match="rnn_layer: nonlinearity must be 'tanh' or 'relu', got 'sigmoid'"):
        _, rins = op_inputs(layer_arrays("rnn_tanh", np.float64, False), None)
        run("rnn_layer", rins, {"nonlinearity": "sigmoid"}, None, backend)
