"""The catalog `python -m treadle verify` checks: small cases, one or more per forward op of the Eigen
backend (every op it lists whose name does not end in "_backward"), and one per gradient op that is
differentiable itself (the second derivatives a loss built from gradients takes).

Each case makes fresh random inputs from a generator it is given, tiny (at most 40 elements per
floating input) because the finite-difference check perturbs every element twice. Inputs are
shaped so that central differences (h = 1e-6) never straddle a kink or a branch change: values are
kept away from relu's 0, softplus's threshold, the loss kinks, and max-pool windows hold distinct
values. Cases whose op has no differentiable input (constant, causal_mask, random, conv_backward_bias) have
wrt=() and grad_outputs=(): only their outputs are compared between backends.

`check_catalog()` runs every case on Eigen in float64 (gradients against central differences) and
on oneDNN in float32 where oneDNN lists the op, and checks that the catalog covers every forward op.
"""
from __future__ import annotations  # "tuple | None" on Python 3.9

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Case:
    op: str                    # the op name as run_op takes it
    name: str                  # unique, op name first
    make_inputs: Callable      # f(rng) -> list of float64 arrays (indices as int64)
    attrs: dict                # attributes as run_op takes them
    wrt: tuple                 # inputs whose gradient is checked
    training: bool = True
    grad_outputs: tuple | None = None  # outputs given an upstream gradient; None: output 0 only


# ---- input makers (each takes the generator) ----------------------------------------------------
def normal(r, shape, scale=1.0, shift=0.0):
    return np.asarray(shift + scale * r.standard_normal(shape), dtype=np.float64)


def away(r, shape, kinks=(0.0,), scale=1.0, gap=0.05):
    """Normal values moved at least `gap` away from each kink (central differences stay on one side)."""
    x = normal(r, shape, scale)
    for k in kinks:
        near = np.abs(x - k) < gap
        x[near] = k + np.where(x[near] >= k, 1.0, -1.0) * (gap + 0.1 * r.random(int(near.sum())))
    return x


def distinct(r, shape, step=0.05):
    """A shuffled ramp: every value distinct and `step` apart, so no max-pool window has a tie."""
    n = int(np.prod(shape))
    return (r.permutation(n) - n / 2).reshape(shape) * step


def positive(r, shape, low=0.5, high=1.5):
    return r.uniform(low, high, shape)


def indices(r, shape, n):
    return np.asarray(r.integers(0, n, size=shape), dtype=np.int64)


def floats(*shapes, scale=1.0, shift=0.0):
    """make_inputs giving independent normal arrays of the given shapes."""
    return lambda r: [normal(r, s, scale, shift) for s in shapes]


CASES = []


def case(op, name, make_inputs, attrs=None, wrt=None, **kw):
    """Adds a case; wrt defaults to every input."""
    if wrt is None:
        wrt = tuple(range(len(make_inputs(np.random.default_rng(0)))))
    CASES.append(Case(op, f"{op} {name}".strip(), make_inputs, dict(attrs or {}), tuple(wrt), **kw))


# ---- products -----------------------------------------------------------------------------------
case("linear", "bias", floats((2, 3), (4, 3), (4,)))
case("linear", "3-d input, no bias", floats((2, 2, 3), (4, 3)))
case("linear", "fused tanh", floats((2, 3), (4, 3), (4,)), {"activation": "tanh"})
# A fused relu is only smooth away from a zero pre-activation: the product's inputs are drawn from a
# grid where x @ w.T + b lands on multiples of 1/4 offset by 1/16, never within 1/16 of 0.
case("linear", "fused relu",
     lambda r: [r.integers(-2, 3, (2, 3)) / 2.0, r.integers(-2, 3, (4, 3)) / 2.0, r.integers(-4, 4, 4) / 4 + 1 / 16],
     {"activation": "relu"})
for ta in (0, 1):
    for tb in (0, 1):
        a, b = (3, 2) if ta else (2, 3), (4, 3) if tb else (3, 4)
        case("matmul", f"trans_a={ta} trans_b={tb}", floats(a, b), {"trans_a": ta, "trans_b": tb})
        a, b = (2, 3, 2) if ta else (2, 2, 3), (2, 4, 3) if tb else (2, 3, 4)
        case("bmm", f"trans_a={ta} trans_b={tb}", floats(a, b), {"trans_a": ta, "trans_b": tb})

case("matmul", "narrow weight gradient (A^T B, 2 columns, inner 9)", floats((9, 3), (9, 2)), {"trans_a": 1, "trans_b": 0})
case("matmul", "narrow weight gradient (A^T B^T, 2 columns, inner 7)", floats((7, 3), (2, 7)), {"trans_a": 1, "trans_b": 1})

# ---- elementwise --------------------------------------------------------------------------------
for op in ("add", "sub", "mul"):
    case(op, "same shape", floats((3, 4), (3, 4)))
    case(op, "broadcast both sides", floats((3, 1, 4), (2, 1)))
case("add", "0-d operand", floats((), (2, 3)))
case("scale", "alpha -2.5", floats((3, 4)), {"alpha": -2.5})
case("sum_to", "columns", floats((4, 5)), {"shape": [5]})
case("sum_to", "middle and leading dims", floats((2, 3, 4)), {"shape": [3, 1]})
case("sum_to", "to a scalar", floats((3, 4)), {"shape": []})
case("div", "same shape", lambda r: [normal(r, (3, 4)), positive(r, (3, 4))])
case("div", "broadcast both sides", lambda r: [normal(r, (3, 1, 4)), -positive(r, (2, 1))])

# ---- elementwise math ---------------------------------------------------------------------------
ACT_MATH = (3, 4)
case("exp", "", floats(ACT_MATH, scale=1.5))
case("log", "", lambda r: [positive(r, ACT_MATH, 0.3, 3.0)])
case("log1p", "", lambda r: [positive(r, ACT_MATH, -0.7, 3.0)])
case("sqrt", "", lambda r: [positive(r, ACT_MATH, 0.3, 3.0)])
case("abs", "", lambda r: [away(r, ACT_MATH, scale=2.0)])
case("pow", "exponent 3", floats(ACT_MATH), {"exponent": 3.0})
case("pow", "exponent -1.5", lambda r: [positive(r, ACT_MATH, 0.5, 2.0)], {"exponent": -1.5})
case("clamp", "min and max", lambda r: [away(r, ACT_MATH, kinks=(-0.5, 0.75), scale=2.0)], {"min": -0.5, "max": 0.75})
case("clamp", "min only", lambda r: [away(r, ACT_MATH, kinks=(0.25,), scale=2.0)], {"min": 0.25})

# ---- activations --------------------------------------------------------------------------------
ACT = (3, 5)
case("relu", "", lambda r: [away(r, ACT, scale=2.0)])
case("leaky_relu", "default slope", lambda r: [away(r, ACT, scale=2.0)])
case("leaky_relu", "slope 0.2", lambda r: [away(r, ACT, scale=2.0)], {"negative_slope": 0.2})
case("elu", "default alpha", lambda r: [away(r, ACT, scale=2.0)])
case("elu", "alpha 0.5", lambda r: [away(r, ACT, scale=2.0)], {"alpha": 0.5})
case("gelu", "default", floats(ACT, scale=2.0))
case("gelu", "approximate none", floats(ACT, scale=2.0), {"approximate": "none"})
case("gelu", "approximate tanh", floats(ACT, scale=2.0), {"approximate": "tanh"})
case("silu", "", floats(ACT, scale=2.0))
case("sigmoid", "", floats(ACT, scale=2.0))
case("tanh", "", floats(ACT, scale=2.0))
case("softplus", "default", floats(ACT, scale=3.0))
# beta * x > threshold switches to the identity (a jump of ~0.003 at x = 2.5): values on both sides.
case("softplus", "beta 2 threshold 5", lambda r: [away(r, ACT, kinks=(2.5,), scale=3.0)],
     {"beta": 2.0, "threshold": 5.0})
case("softmax", "last axis", floats((3, 4), scale=2.0), {"axis": -1})
case("softmax", "middle axis of 3-d", floats((2, 3, 4), scale=2.0), {"axis": 1})
case("log_softmax", "last axis", floats((3, 4), scale=2.0), {"axis": -1})
case("log_softmax", "first axis of 3-d", floats((2, 3, 4), scale=2.0), {"axis": 0})
# dropout's mask is fixed by the runner's seed, so the op is linear in x at every evaluation.
case("dropout", "p 0.4", floats((3, 5)), {"p": 0.4})
case("dropout", "p 0.5 stream 3", floats((2, 3, 4)), {"p": 0.5, "stream": 3})

# ---- convolutions -------------------------------------------------------------------------------
def conv(x, w, bias=True):
    return lambda r: [normal(r, x), normal(r, w, 0.5)] + ([normal(r, (w[0],), 0.5)] if bias else [])


case("conv", "1d", conv((2, 2, 5), (3, 2, 3)))
case("conv", "1d stride 2 padding 2 dilation 2", conv((2, 2, 7), (2, 2, 3)),
     {"stride": [2], "padding": [2], "dilation": [2]})
case("conv", "1d groups 2", conv((2, 4, 4), (4, 2, 3)), {"groups": 2, "padding": [1]})
case("conv", "2d padding 1", conv((2, 1, 4, 4), (2, 1, 3, 3)), {"padding": [1]})
case("conv", "2d stride 2", conv((1, 2, 4, 5), (2, 2, 3, 3)), {"stride": [2], "padding": [1]})
case("conv", "2d asymmetric stride, no bias", conv((2, 1, 5, 4), (2, 1, 3, 2), bias=False), {"stride": [2, 1]})
case("conv", "2d dilation", conv((1, 1, 5, 5), (2, 1, 2, 2)), {"dilation": [2, 1], "padding": [1, 0]})
case("conv", "2d depthwise", conv((1, 2, 4, 4), (2, 1, 3, 3)), {"groups": 2})
# padding='same' with an even kernel: one more padding row/column at the end than at the start.
case("conv", "2d same padding even kernel", conv((1, 2, 4, 3), (2, 2, 2, 2)),
     {"padding": [0, 0], "padding_end": [1, 1]})
case("conv", "2d fused sigmoid", conv((1, 2, 3, 3), (2, 2, 2, 2)), {"activation": "sigmoid"})
case("conv", "3d", conv((1, 1, 3, 4, 3), (2, 1, 2, 2, 2)), {"stride": [1, 2, 1], "padding": [0, 1, 0]})
# A transposed convolution is conv_backward_data run forward: x (N, C_in, ...), w (C_in, C_out / groups, ...).
case("conv_backward_data", "transposed 1d stride 2 output_padding 1",
     lambda r: [normal(r, (2, 2, 4)), normal(r, (2, 3, 3), 0.5), normal(r, (3,), 0.5)],
     {"stride": [2], "padding": [1], "padding_end": [0], "dilation": [1], "groups": 1, "input_size": [8]})
case("conv_backward_data", "transposed 2d groups 2 stride 2",
     lambda r: [normal(r, (1, 4, 3, 3)), normal(r, (4, 1, 2, 2), 0.5), normal(r, (2,), 0.5)],
     {"stride": [2], "padding": [0], "padding_end": [0], "dilation": [1], "groups": 2, "input_size": [6, 6]})
# The weight gradient of a 1-d conv (kernel 3, stride 2) as an op: inputs x and the output gradient dy.
case("conv_backward_weight", "1d stride 2", floats((2, 2, 7), (2, 3, 3)),
     {"stride": [2], "padding": [0], "dilation": [1], "groups": 1, "kernel_size": [3]})
case("conv_backward_bias", "forward only", floats((2, 3, 4)), wrt=(), grad_outputs=())

# ---- pooling and resampling ---------------------------------------------------------------------
# Outputs (y, indices): only y gets an upstream gradient (the default).
case("max_pool", "2d kernel 2", lambda r: [distinct(r, (2, 1, 4, 4))], {"kernel_size": [2]})
case("max_pool", "2d kernel 3 stride 2 padding 1 ceil", lambda r: [distinct(r, (1, 2, 5, 4))],
     {"kernel_size": [3], "stride": [2], "padding": [1], "ceil_mode": True})
case("max_pool", "1d dilation 2", lambda r: [distinct(r, (2, 2, 7))],
     {"kernel_size": [3], "stride": [2], "padding": [1], "dilation": [2]})
case("max_pool", "3d", lambda r: [distinct(r, (1, 1, 4, 3, 3))], {"kernel_size": [2], "stride": [1, 2, 2]})
case("avg_pool", "2d kernel 2", floats((2, 1, 4, 4)), {"kernel_size": [2]})
case("avg_pool", "2d padding excluded, ceil", floats((1, 2, 5, 4)),
     {"kernel_size": [3], "stride": [2], "padding": [1], "ceil_mode": True, "count_include_pad": False})
case("avg_pool", "2d divisor_override", floats((1, 2, 5, 4)),
     {"kernel_size": [3], "stride": [2], "padding": [1], "divisor_override": 5})
case("avg_pool", "1d padding included", floats((2, 2, 7)), {"kernel_size": [3], "stride": [2], "padding": [1]})
case("avg_pool", "3d", floats((1, 1, 4, 3, 3)), {"kernel_size": [2, 2, 1], "stride": [2, 1, 1]})
case("adaptive_avg_pool", "1d", floats((2, 2, 5)), {"output_size": [3]})
case("adaptive_avg_pool", "2d uneven", floats((1, 2, 5, 4)), {"output_size": [3, 3]})
case("adaptive_avg_pool", "2d global", floats((2, 3, 2, 3)), {"output_size": [1, 1]})
case("adaptive_avg_pool", "3d", floats((1, 1, 3, 4, 3)), {"output_size": [2, 2, 2]})
case("upsample2d", "nearest x2", floats((1, 2, 2, 3)),
     {"size": [4, 6], "mode": "nearest", "align_corners": False, "scale_h": 2.0, "scale_w": 2.0})
case("upsample2d", "nearest to a size, down", floats((1, 1, 5, 6)),
     {"size": [2, 3], "mode": "nearest", "align_corners": False})
case("upsample2d", "bilinear x1.5", floats((1, 1, 4, 5)),
     {"size": [6, 7], "mode": "bilinear", "align_corners": False, "scale_h": 1.5, "scale_w": 1.5})
case("upsample2d", "bilinear align_corners", floats((1, 2, 2, 3)),
     {"size": [3, 5], "mode": "bilinear", "align_corners": True})

# ---- normalisation ------------------------------------------------------------------------------
# Statistics outputs (mean, rstd) are differentiable: they get upstream gradients too.
def with_affine(x, p, weight=True, bias=True, scale=2.0, shift=0.5):
    return lambda r: ([normal(r, x, scale, shift)] + ([normal(r, p, 0.5, 1.0)] if weight else [])
                      + ([normal(r, p, 0.5)] if bias else []))


case("batch_norm", "2-d affine", with_affine((4, 3), (3,)), {"eps": 1e-5}, grad_outputs=(0, 1, 2))
case("batch_norm", "4-d affine", with_affine((2, 2, 3, 3), (2,)), {"eps": 1e-5}, grad_outputs=(0, 1, 2))
case("batch_norm", "3-d plain", with_affine((2, 3, 4), (3,), False, False), {"eps": 1e-5}, grad_outputs=(0, 1, 2))
# Inputs x, running_mean, running_var, weight, bias; the running statistics are state, not differentiable.
case("batch_norm_eval", "3-d affine",
     lambda r: [normal(r, (2, 3, 4), 2.0, 0.5), normal(r, (3,), 0.3), positive(r, (3,)),
                normal(r, (3,), 0.5, 1.0), normal(r, (3,), 0.5)],
     {"eps": 1e-4}, wrt=(0, 3, 4), training=False)
case("batch_norm_eval", "2-d plain", lambda r: [normal(r, (4, 3), 2.0), normal(r, (3,), 0.3), positive(r, (3,))],
     {"eps": 1e-4}, wrt=(0,), training=False)
case("layer_norm", "last dim affine", with_affine((3, 4), (4,)), {"normalized_ndim": 1, "eps": 1e-5},
     grad_outputs=(0, 1, 2))
case("layer_norm", "last 2 dims weight only", with_affine((2, 3, 4), (3, 4), bias=False),
     {"normalized_ndim": 2, "eps": 1e-3}, grad_outputs=(0, 1, 2))
case("layer_norm", "plain", with_affine((2, 5), (5,), False, False), {"normalized_ndim": 1, "eps": 1e-5},
     grad_outputs=(0, 1, 2))
case("rms_norm", "weight", with_affine((3, 4), (4,), bias=False), {"normalized_ndim": 1, "eps": 1e-6},
     grad_outputs=(0, 1))
case("rms_norm", "last 2 dims plain, default eps", with_affine((2, 2, 3), (2, 3), False, False),
     {"normalized_ndim": 2}, grad_outputs=(0, 1))
case("group_norm", "2 groups affine", with_affine((2, 4, 3), (4,)), {"num_groups": 2, "eps": 1e-5},
     grad_outputs=(0, 1, 2))
case("group_norm", "4-d one group plain", with_affine((2, 4, 2, 2), (4,), False, False),
     {"num_groups": 1, "eps": 1e-3}, grad_outputs=(0, 1, 2))

# ---- embedding ----------------------------------------------------------------------------------
case("embedding", "2-d indices", lambda r: [normal(r, (5, 3)), indices(r, (2, 3), 5)], wrt=(0,))
case("embedding", "1-d indices with repeats", lambda r: [normal(r, (4, 2)), indices(r, (6,), 3)], wrt=(0,))

# ---- recurrent layers ---------------------------------------------------------------------------
# Inputs x, h0, (c0), w_ih, w_hh, (b_ih, b_hh), (lengths); outputs y, h_n, (c_n), then (gru, lstm) a saved
# buffer that gets no upstream gradient. T=3 steps, N=2 samples, I=2 features, H=2 hidden units.
def recurrent(op, name, attrs, gates, states=1, batch_first=False, bias=True, lengths=None):
    def make(r):
        x = normal(r, (2, 3, 2) if batch_first else (3, 2, 2))
        initial = [normal(r, (2, 2), 0.5) for _ in range(states)]
        # Recurrent weights larger than the default init, so the recurrence matters to the gradients.
        weights = [r.uniform(-0.7, 0.7, (gates * 2, 2)), r.uniform(-1.4, 1.4, (gates * 2, 2))]
        biases = [r.uniform(-0.7, 0.7, gates * 2) for _ in range(2 if bias else 0)]
        return [x] + initial + weights + biases + ([np.array(lengths, np.int64)] if lengths else [])

    n = 1 + states + 2 + (2 if bias else 0)  # every input but the lengths
    case(op, name, make, dict(attrs, batch_first=batch_first), wrt=tuple(range(n)),
         grad_outputs=tuple(range(1 + states)))


recurrent("lstm_layer", "time-major", {}, 4, states=2)
recurrent("lstm_layer", "batch_first reverse lengths", {"reverse": True}, 4, states=2, batch_first=True,
          lengths=[2, 3])
recurrent("gru_layer", "time-major", {}, 3)
recurrent("gru_layer", "batch_first lengths", {}, 3, batch_first=True, lengths=[3, 1])
recurrent("rnn_layer", "tanh", {"nonlinearity": "tanh"}, 1)
recurrent("rnn_layer", "tanh reverse, no bias", {"nonlinearity": "tanh", "reverse": True}, 1, bias=False)
# relu in the recurrence: a pre-activation within ~1e-6 of 0 would break finite differences; random
# inputs make that a one-in-a-million event.
recurrent("rnn_layer", "relu", {"nonlinearity": "relu"}, 1)

# ---- losses -------------------------------------------------------------------------------------
def pred_target(shape, kinks=(0.0,), gap=0.05):
    """Prediction and target whose differences keep `gap` away from the loss's kinks (+-k)."""
    def make(r):
        t = normal(r, shape)
        return [t + away(r, shape, tuple(kinks) + tuple(-k for k in kinks if k), gap=gap), t]
    return make


case("mse_loss", "mean", floats((3, 4), (3, 4)), {"reduction": "mean"})
case("mse_loss", "sum", floats((2, 3, 2), (2, 3, 2)), {"reduction": "sum"})
case("l1_loss", "mean", pred_target((3, 4)), {"reduction": "mean"})
case("l1_loss", "sum", pred_target((5,)), {"reduction": "sum"})
# huber's gradient is continuous, its second derivative jumps at +-delta: keep differences off those too.
case("huber_loss", "delta 1", pred_target((3, 4), (1.0,)), {"reduction": "mean", "delta": 1.0})
case("huber_loss", "delta 0.5 sum", pred_target((3, 4), (0.5,)), {"reduction": "sum", "delta": 0.5})
case("cross_entropy", "mean", lambda r: [normal(r, (3, 4)), indices(r, (3,), 4)], {"reduction": "mean"}, wrt=(0,))
case("cross_entropy", "sum over positions", lambda r: [normal(r, (2, 3, 2)), indices(r, (2, 2), 3)],
     {"reduction": "sum"}, wrt=(0,))
case("cross_entropy", "unbatched", lambda r: [normal(r, (5,)), indices(r, (), 5)], {"reduction": "mean"}, wrt=(0,))
case("bce_with_logits", "mean", lambda r: [normal(r, (3, 4), 2.0), r.uniform(0, 1, (3, 4))], {"reduction": "mean"})
case("bce_with_logits", "sum", lambda r: [normal(r, (6,), 2.0), r.uniform(0, 1, (6,))], {"reduction": "sum"})

# ---- shape ops ----------------------------------------------------------------------------------
case("concat", "axis 1 three parts", floats((2, 3), (2, 1), (2, 2)), {"axis": 1})
case("concat", "axis 0", floats((1, 2, 3), (2, 2, 3)), {"axis": 0})
case("slice", "axis 1", floats((3, 5)), {"axis": 1, "start": 1, "stop": 4})
case("slice", "negative start, last axis", floats((2, 3, 4)), {"axis": -1, "start": -3, "stop": -1})
case("permute", "3-d", floats((2, 3, 4)), {"dims": [2, 0, 1]})
case("permute", "swap middle dims of 4-d", floats((2, 2, 3, 2)), {"dims": [0, 2, 1, 3]})
case("reshape", "with -1", floats((2, 3, 4)), {"shape": [4, -1]})
case("reshape", "to 1-d", floats((3, 4)), {"shape": [12]})
case("flatten", "default", floats((2, 3, 4)))
case("flatten", "dims 0 to 1", floats((2, 3, 2, 2)), {"start_dim": 0, "end_dim": 1})


# ---- output_transform ---------------------------------------------------------------------------
# Inputs x (..., D), scale and shift (D or 1); activation codes 0 identity, 1 softplus, 2 sigmoid, 3 tanh.
def output_transform(shape, d):
    def make(r):
        x = away(r, shape, kinks=(20.0,), scale=3.0)  # softplus switches to the identity above 20
        x.reshape(-1)[:3] = [r.uniform(20.5, 24.0), r.uniform(16.0, 19.5), -r.uniform(2.0, 6.0)]
        return [x, normal(r, (d,), 1.0, 1.0), normal(r, (d,))]
    return make


case("output_transform", "one activation per output", output_transform((5, 4), 4), {"activations": [0, 1, 2, 3]})
case("output_transform", "shared scale, 3-d input", output_transform((2, 3, 4), 1), {"activations": [1, 2, 3, 0]})
case("output_transform", "softplus everywhere", output_transform((4, 3), 3), {"activations": [1]})

# ---- second derivatives: gradient ops that are differentiable themselves ----------------------
# (saved, dy) -> dx. relu/tanh/sigmoid save the forward output, the others its input; dx is linear
# in dy, and the piecewise-linear ones have no gradient with respect to what they saved.
def saved_and_dy(saved):
    return lambda r: [saved(r), normal(r, ACT)]


case("relu_backward", "", saved_and_dy(lambda r: np.maximum(away(r, ACT, scale=2.0), 0.0)), wrt=(1,))
case("leaky_relu_backward", "slope 0.2", saved_and_dy(lambda r: away(r, ACT, scale=2.0)), {"negative_slope": 0.2},
     wrt=(1,))
case("elu_backward", "alpha 0.5", saved_and_dy(lambda r: away(r, ACT, scale=2.0)), {"alpha": 0.5})
case("gelu_backward", "approximate none", saved_and_dy(lambda r: normal(r, ACT, 2.0)))
case("gelu_backward", "approximate tanh", saved_and_dy(lambda r: normal(r, ACT, 2.0)), {"approximate": "tanh"})
case("silu_backward", "", saved_and_dy(lambda r: normal(r, ACT, 2.0)))
case("tanh_backward", "", saved_and_dy(lambda r: np.tanh(normal(r, ACT, 2.0))))
case("sigmoid_backward", "", saved_and_dy(lambda r: 1 / (1 + np.exp(-normal(r, ACT, 2.0)))))
case("softplus_backward", "beta 2 threshold 3", saved_and_dy(lambda r: away(r, ACT, kinks=(1.5,), scale=2.0)),
     {"beta": 2.0, "threshold": 3.0})
case("abs_backward", "", saved_and_dy(lambda r: away(r, ACT, scale=2.0)), wrt=(1,))
case("clamp_backward", "min and max", saved_and_dy(lambda r: away(r, ACT, kinks=(-0.5, 0.75), scale=2.0)),
     {"min": -0.5, "max": 0.75}, wrt=(1,))


def softmax_output(log):
    def make(r):
        x = normal(r, ACT)
        z = np.exp(x - x.max(1, keepdims=True))
        p = z / z.sum(1, keepdims=True)
        return [np.log(p) if log else p, normal(r, ACT)]
    return make


case("softmax_backward", "axis 1", softmax_output(False), {"axis": 1})
case("log_softmax_backward", "axis 1", softmax_output(True), {"axis": 1})

# ---- selection ----------------------------------------------------------------------------------
for cmp in ("gt", "lt", "ge", "le", "eq", "ne"):  # 0/1 masks, no gradient; ties included for eq/ne
    case(cmp, "broadcast, with ties", lambda r: [np.round(normal(r, (3, 4))), np.round(normal(r, (4,)))],
         wrt=(), grad_outputs=())
case("where", "float condition", lambda r: [normal(r, (3, 4)), normal(r, (3, 4)), np.round(r.random((3, 4)))],
     wrt=(0, 1))
case("one_hot", "5 classes", lambda r: [indices(r, (3, 4), 5)], {"num_classes": 5, "dtype": "float64"}, wrt=(),
     grad_outputs=())
case("gather", "dim 1", lambda r: [normal(r, (3, 5)), indices(r, (3, 2), 5)], {"dim": 1}, wrt=(0,))
case("gather", "dim 0, repeated indices", lambda r: [normal(r, (4, 3)), indices(r, (6, 3), 4)], {"dim": 0}, wrt=(0,))
case("gather_backward", "dim 1 into (3, 5)", lambda r: [normal(r, (3, 2)), indices(r, (3, 2), 5)],
     {"dim": 1, "shape": [3, 5]}, wrt=(0,))

# ---- ops without differentiable inputs: outputs only --------------------------------------------
case("constant", "2x3", lambda r: [], {"shape": [2, 3], "value": 1.5, "dtype": "float64"}, wrt=(), grad_outputs=())
case("causal_mask", "3x4", lambda r: [], {"rows": 3, "cols": 4, "dtype": "float64"}, wrt=(), grad_outputs=())
for dist in ("uniform", "normal"):  # noise: the same draws for a seed on every backend and dtype
    case("random", dist, lambda r: [], {"shape": [3, 4], "dtype": "float64", "distribution": dist, "stream": 2},
         wrt=(), grad_outputs=())

FORWARD_OPS_WITHOUT_CASES = {
    "batch_norm_update_stats": "no outputs: it updates its running-statistics inputs in place (training "
                               "plans only), which run_op's copies of the inputs do not show",
}


# ---- self-check ---------------------------------------------------------------------------------
def _run(c, inputs, grad_outputs, backend):
    from . import _core

    return _core.run_op(c.op, list(inputs), dict(c.attrs), grad_outputs, backend, c.training, 0)


def _upstream(c, outputs, rng):
    chosen = (0,) if c.grad_outputs is None else c.grad_outputs
    return [rng.standard_normal(o.shape) if k in chosen else None for k, o in enumerate(outputs)]


def gradcheck_case(c, seed=0, eps=1e-6, rtol=1e-6):
    """None if the case's Eigen float64 gradients match central differences, else the reason."""
    rng = np.random.default_rng(seed)
    inputs = c.make_inputs(rng)
    big = [i for i, x in enumerate(inputs) if x.dtype.kind == "f" and x.size > 40]
    if big:
        return f"inputs {big} have more than 40 elements"
    if any(x.dtype not in (np.float64, np.int64) for x in inputs):
        return "inputs must be float64 (indices int64)"
    outs, _ = _run(c, inputs, None, "eigen")
    gos = _upstream(c, outs, rng)
    outs, analytic = _run(c, inputs, gos, "eigen")
    if not c.wrt:
        return None
    objective = lambda: sum(float(np.sum(g * o)) for g, o in zip(gos, _run(c, inputs, None, "eigen")[0])  # noqa: E731
                            if g is not None)
    magnitude = sum(float(np.sum(np.abs(g * o))) for g, o in zip(gos, outs) if g is not None)
    atol = max(1e-9, 4e-10 * magnitude)
    for i in c.wrt:
        if analytic[i] is None:
            return f"no gradient for input {i}"
        flat, numeric = inputs[i].reshape(-1), np.zeros(inputs[i].size)
        for j in range(flat.size):
            orig, values = flat[j], []
            for h in (eps, -eps):
                flat[j] = orig + h
                values.append(objective())
            flat[j] = orig
            numeric[j] = (values[0] - values[1]) / (2 * eps)
        err = np.abs(analytic[i].reshape(-1) - numeric) - (atol + rtol * np.abs(numeric))
        if np.any(err > 0):
            j = int(np.argmax(err))
            return f"input {i} element {j}: analytic {analytic[i].reshape(-1)[j]:.12g} numeric {numeric[j]:.12g}"
    return None


def onednn_case(c, seed=0):
    """Runs the case forward and backward on oneDNN in float32; None if it runs (or is not listed there)."""
    from . import _core

    if "onednn" not in _core.backends() or "float32" not in _core.backend_ops("onednn").get(c.op, ()):
        return None
    rng = np.random.default_rng(seed)
    inputs = [x.astype(np.float32) if x.dtype.kind == "f" else x for x in c.make_inputs(rng)]
    outs, _ = _run(c, inputs, None, "onednn")
    gos = [None if g is None else g.astype(np.float32) for g in _upstream(c, outs, rng)]
    outs, grads = _run(c, inputs, gos, "onednn")
    if any(grads[i] is None for i in c.wrt):
        return "onednn float32: a gradient is missing"
    return None


def check_catalog(seeds=(0,)):
    """Prints "ok <name>" or "FAIL <name>: <reason>" per case, then the coverage and a summary."""
    from . import _core

    names = [c.name for c in CASES]
    dup = sorted({n for n in names if names.count(n) > 1})
    forward = {op for op in _core.backend_ops("eigen") if not op.endswith("_backward")}
    covered = {c.op for c in CASES}
    missing = sorted(forward - covered - set(FORWARD_OPS_WITHOUT_CASES))
    unknown = sorted(covered - set(_core.backend_ops("eigen")))
    ok = fail = 0
    for c in CASES:
        reason = None
        try:
            for seed in seeds:
                reason = gradcheck_case(c, seed) or onednn_case(c, seed)
                if reason:
                    reason = f"seed {seed}: {reason}"
                    break
        except Exception as e:  # a case the op refuses fails, named
            reason = f"{type(e).__name__}: {e}"
        if reason:
            fail += 1
            print(f"FAIL {c.name}: {reason}")
        else:
            ok += 1
            print(f"ok {c.name}")
    for what, items in (("duplicate names", dup), ("forward ops without a case", missing),
                        ("cases of ops Eigen does not list", unknown)):
        if items:
            fail += 1
            print(f"FAIL catalog: {what}: {items}")
    print(f"{ok} ok, {fail} FAIL ({len(CASES)} cases, {len(covered)} ops)")
    return fail == 0
