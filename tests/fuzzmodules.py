"""Shared pieces of the module fuzz suites (test_fuzz_modules.py, test_fuzz_sequence.py).

A fuzzed call either succeeds with torch's result (the same weights copied in; float32 ~1e-5,
float64 ~1e-10 relative, NaN/Inf positions as torch's where the inputs are not huge) or raises
ValueError/TypeError whose message names the module or op and carries the offending value. After
a refused training step the trainable weights, the optimizer state and both step counts are as
they were.
"""
import os
import re

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import treadle as tl

# CI runs fixed cases within ~30 s for both suites. A longer hunt: FUZZ_EXAMPLES=1000; other cases
# than CI's: FUZZ_RANDOM=1 with pytest's --hypothesis-seed=N.
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 150)), deadline=None, database=None,
                suppress_health_check=list(HealthCheck), derandomize=not os.environ.get("FUZZ_RANDOM"))
DOCUMENTED = (ValueError, TypeError)
SPECIALS = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e38, -1e38, 1e-45, 1e-310, 5e-324]
FLOATS = ["float32", "float64"]
TOL = {"float32": 1e-5, "float64": 1e-10}
# Words that may open a message about a model input (the model checks dtypes and empty batches
# before any layer sees the data).
ENTRY = ("predict", "model", "Trainer", "step", "forward(", "backward(", "evaluate")

# The mutations `near` applies to a valid input: most draws keep it, the rest probe one edge each.
MUTATIONS = ["keep"] * 10 + ["batch1", "zero", "resize", "rank", "dtype"]
LAYOUTS = ["c"] * 9 + ["readonly", "strided", "fortran"]


def fill(r, shape, dtype, scale=1.0, specials=()):
    """Normal values times `scale` with `specials` at random positions, cast to `dtype`."""
    a = np.asarray(r.standard_normal(shape) * scale)  # 0-d stays an array
    flat = a.reshape(-1)
    for v in specials if flat.size else ():
        flat[r.integers(0, flat.size)] = v
    with np.errstate(all="ignore"):
        return np.asarray(a.astype(dtype))


def layout(a, kind):
    """The same values as a read-only, strided (every other element) or Fortran-ordered array."""
    if kind == "readonly":
        a = a.copy()
        a.flags.writeable = False
    elif kind == "strided" and a.ndim:
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        a = big[..., ::2]
    elif kind == "fortran":
        a = np.asfortranarray(a)
    return a


@st.composite
def near(draw, shape, dtype, special=True, lo=0):
    """An input close to a valid `shape` and `dtype`: usually exactly that, sometimes batch 1, a
    zero-size axis, one axis resized, one axis more or less, another dtype; sometimes a read-only,
    non-contiguous or Fortran layout; values at three scales with NaN/Inf/huge/denormal entries.
    `lo` > 0 draws integers in [lo - 1, ...) instead of normal values (for indices)."""
    shape = list(shape)
    what = draw(st.sampled_from(MUTATIONS))
    if what == "batch1" and shape:
        shape[0] = 1
    elif what == "zero" and shape:
        shape[draw(st.integers(0, len(shape) - 1))] = 0
    elif what == "resize" and shape:
        axis = draw(st.integers(0, len(shape) - 1))
        shape[axis] = max(0, shape[axis] + draw(st.sampled_from([-1, 1, 2])))
    elif what == "rank":
        shape = shape[:-1] if shape and draw(st.booleans()) else shape + [draw(st.integers(1, 3))]
    elif what == "dtype":
        dtype = draw(st.sampled_from(["float32", "float64", "int32", "int64", "bool", "float16"]))
    r = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if lo:
        a = r.integers(-1, lo + 1, size=shape).astype(dtype)
    else:
        specials = draw(st.lists(st.sampled_from(SPECIALS), max_size=2)) if special and draw(st.booleans()) else ()
        a = fill(r, shape, dtype, draw(st.sampled_from([1.0, 1.0, 1e-3, 1e3])), specials)
    return layout(a, draw(st.sampled_from(LAYOUTS)))


def expect_documented(err, names):
    """The message names the module, the op or the model entry point, and carries a value."""
    msg = str(err)
    assert any(n.lower() in msg.lower() for n in tuple(names) + ENTRY), f"message names none of {names}: {msg}"
    # The value is a number, shape or dtype, or (for an array the binding cannot wrap) its layout.
    assert re.search(r"\d|float|int|bool|complex|nan|inf|'|contiguous|read-only", msg), f"no value in: {msg}"


def to_torch(a):
    return torch.from_numpy(np.array(a, copy=True))


def torch_pair(ref, net, dtype, prefix=""):
    """Gives torch's parameters non-trivial values and copies them (and its buffers) into `net`."""
    ref.to(getattr(torch, dtype))
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("bias") or name.endswith("bias_ih_l0") or p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    state = {prefix + k: v for k, v in ref.state_dict().items() if v.dim() > 0}
    net.to(dtype).load_state_dict(state, strict=False)  # .to: parameter-free models default to float32
    return ref, net


def _floats(arrays):
    return [np.asarray(a) for a in arrays if np.asarray(a).dtype.kind == "f"]


def assert_matches(ours, ref, inputs, dtype, what, nan_positions=True):
    """ours == torch's `ref` to TOL[dtype], scaled by the magnitude of the data; NaN/Inf positions
    equal where no input is huge (huge values overflow in an order-dependent way)."""
    ref = ref.detach().numpy() if hasattr(ref, "detach") else np.asarray(ref)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape}, torch {ref.shape}"
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype}, torch {ref.dtype}"
    floats = _floats(inputs) + [ref]
    with np.errstate(all="ignore"):
        big = max([float(np.abs(a[np.isfinite(a)]).max(initial=0)) for a in floats] + [1.0])
    huge = big > (1e30 if dtype == "float32" else 1e300)
    both = np.isfinite(ours) & np.isfinite(ref)
    if not huge and nan_positions:
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref), err_msg=f"{what}: NaN positions")
        np.testing.assert_array_equal(np.isinf(ours), np.isinf(ref), err_msg=f"{what}: Inf positions")
        np.testing.assert_array_equal(ours[np.isinf(ours)], ref[np.isinf(ref)], err_msg=f"{what}: Inf signs")
    tol = TOL[dtype]
    np.testing.assert_allclose(ours[both], ref[both], rtol=tol, atol=10 * tol * big, err_msg=what)


def trainable(net):
    return {n: p.data.copy() for n, p in net.named_parameter_objects() if p.requires_grad}


def optimizer_snapshot(trainer):
    return ({k: np.copy(v) for k, v in trainer.optimizer.state().items()}, trainer.optimizer.step_count,
            trainer.steps)


def expect_unchanged(net, trainer, weights, opt):
    for name, value in trainable(net).items():
        np.testing.assert_array_equal(value, weights[name], err_msg=f"{name} changed by a refused step")
    state, count, steps = optimizer_snapshot(trainer)
    assert (count, steps) == opt[1:], "a refused step advanced the step count"
    for k, v in state.items():
        np.testing.assert_array_equal(v, opt[0][k], err_msg=f"optimizer state {k} changed by a refused step")


def moderate(arrays):
    """Every floating input finite and below 1e4 in magnitude (a well-conditioned training step)."""
    return all(np.isfinite(a).all() and np.abs(a).max(initial=0) < 1e4 for a in _floats(arrays))


def check_predict(net, ref, x, dtype, names, nan_positions=True, lenient=()):
    """predict(x) against torch's eval-mode forward; returns the output, or None after a documented error.
    `lenient`: parts of torch refusals that guard a defined result (not compared then)."""
    xs = x if isinstance(x, list) else [x]
    try:
        out = net.predict(x)
    except DOCUMENTED as e:
        expect_documented(e, names)
        return None
    ref.eval()
    try:
        with torch.no_grad():
            expected = ref(*[to_torch(a) for a in xs])
    except Exception as e:  # noqa: BLE001 (any torch refusal)
        outs = out if isinstance(out, tuple) else (out,)
        # Some torch kernels refuse empty tensors; an empty result for an empty input is defined.
        if any(text in str(e) for text in lenient) or all(o.size == 0 for o in outs):
            return out
        raise AssertionError(f"{names[0]} accepted inputs {[(a.shape, a.dtype) for a in xs]} that torch "
                             f"refuses: {type(e).__name__}: {e}") from None
    if isinstance(expected, tuple):  # several outputs (attention weights, final states)
        expected = [e for e in expected if e is not None]
        assert isinstance(out, tuple) and len(out) == len(expected), f"{names[0]}: {len(out)} outputs"
        for i, (o, e) in enumerate(zip(out, expected)):
            assert_matches(o, e, xs, dtype, f"{names[0]} output {i}", nan_positions)
    else:
        assert_matches(out, expected, xs, dtype, names[0], nan_positions)
    return out


def check_step(net, ref, x0, x, names, r, prefix="", compare=True):
    """A valid warm-up step on `x0` (so the optimizer holds state), then a step on the fuzzed `x`,
    in treadle and torch (SGD with momentum, MSE against random targets). A refused step leaves
    weights, optimizer state and step counts as they were; an accepted one on moderate data gives
    torch's loss and weights."""
    dtype = net.dtype
    if not any(p.requires_grad for p in ref.parameters()):
        return
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.05, momentum=0.9))
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    ref.train()
    try:
        y0 = fill(r, net.predict(x0).shape, dtype)
    except DOCUMENTED:  # refused for inference too (batch statistics of one value): nothing to train
        return
    try:
        y = fill(r, net.predict(x).shape, dtype)
    except DOCUMENTED:
        y = y0
    for step, (xi, yi) in enumerate(((x0, y0), (x, y))):
        weights, state = trainable(net), optimizer_snapshot(trainer)
        xs = xi if isinstance(xi, list) else [xi]
        try:
            loss = trainer.step(xi, yi)
        except DOCUMENTED as e:
            expect_documented(e, names)
            expect_unchanged(net, trainer, weights, state)
            if step == 0:  # only where torch refuses to train on it too (batch norm of one value)
                try:
                    ref(*[to_torch(a) for a in xs])
                except Exception:  # noqa: BLE001
                    return
                raise AssertionError(f"{names[0]}: a training step refused {[a.shape for a in xs]}: {e}") from None
            return
        if not (compare and moderate(xs)):
            return
        opt.zero_grad()
        tloss = torch.nn.functional.mse_loss(ref(*[to_torch(a) for a in xs]), to_torch(yi))
        tloss.backward()
        opt.step()
        expected = tloss.item()
        close = abs(loss - expected) <= 100 * TOL[dtype] * max(1.0, abs(expected))
        assert close or (np.isnan(loss) and np.isnan(expected)), f"{names[0]}: loss {loss}, torch {expected}"
    state = net.state_dict()
    for k, v in ref.state_dict().items():
        if prefix + k in state and v.dim() > 0:
            assert_matches(state[prefix + k].reshape(v.shape), v, [], dtype, f"{names[0]}: {k} after two steps")
