// The catalog treadle::verify checks: small cases, one or more per forward op of the Eigen backend
// (every op it lists whose name does not end in "_backward"), and one per gradient op that is
// differentiable itself (the second derivatives a loss built from gradients takes).
//
// Inputs are tiny (at most 40 elements per floating input: the finite-difference check perturbs every
// element twice) and kept away from relu's 0, softplus's threshold, the loss kinks; max-pool windows
// hold distinct values. Cases whose op has no differentiable input (constant, causal_mask, random,
// conv_backward_bias, the comparisons, one_hot) have no wrt and no grad_outputs: only their outputs
// are compared between backends.
#include <cmath>

#include "verify/verify_inputs.hpp"

namespace treadle::verify_detail {
namespace {

using V = std::vector<int64_t>;
using Maker = std::function<Inputs(Rng&)>;

struct Options {
  std::optional<Ints> wrt = std::nullopt;  // default: every input
  bool training = true;
  std::optional<Ints> grad_outputs = std::nullopt;
};

class Catalog {
 public:
  void add(const std::string& op, const std::string& name, Maker make, Attrs attrs = {}, Options o = {}) {
    Ints wrt;
    if (o.wrt) {
      wrt = *o.wrt;
    } else {
      Rng scratch(0, 0);
      for (int i = 0; i < static_cast<int>(make(scratch).size()); ++i) wrt.push_back(i);
    }
    cases.push_back({op, name.empty() ? op : op + " " + name, std::move(make), std::move(attrs), wrt, o.training,
                     o.grad_outputs});
  }
  std::vector<Case> cases;
};

const Shape ACT_MATH{3, 4}, ACT{3, 5};

void products(Catalog& c) {
  c.add("linear", "bias", floats({{2, 3}, {4, 3}, {4}}));
  c.add("linear", "3-d input, no bias", floats({{2, 2, 3}, {4, 3}}));
  c.add("linear", "fused tanh", floats({{2, 3}, {4, 3}, {4}}), {{"activation", "tanh"}});
  // A fused relu is only smooth away from a zero pre-activation: the inputs lie on a grid where
  // x @ w.T + b lands on multiples of 1/4 offset by 1/16, never within 1/16 of 0.
  c.add("linear", "fused relu",
        [](Rng& r) { return Inputs{grid(r, {2, 3}, -2, 3, 2.0), grid(r, {4, 3}, -2, 3, 2.0), grid(r, {4}, -4, 4, 4.0, 1.0 / 16)}; },
        {{"activation", "relu"}});
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1}) {
      const std::string name = "trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb);
      const Attrs attrs{{"trans_a", ta}, {"trans_b", tb}};
      c.add("matmul", name, floats({ta ? Shape{3, 2} : Shape{2, 3}, tb ? Shape{4, 3} : Shape{3, 4}}), attrs);
      c.add("bmm", name, floats({ta ? Shape{2, 3, 2} : Shape{2, 2, 3}, tb ? Shape{2, 4, 3} : Shape{2, 3, 4}}), attrs);
    }
  c.add("matmul", "narrow weight gradient (A^T B, 2 columns, inner 9)", floats({{9, 3}, {9, 2}}),
        {{"trans_a", int64_t{1}}, {"trans_b", int64_t{0}}});
  c.add("matmul", "narrow weight gradient (A^T B^T, 2 columns, inner 7)", floats({{7, 3}, {2, 7}}),
        {{"trans_a", int64_t{1}}, {"trans_b", int64_t{1}}});
}

void elementwise(Catalog& c) {
  for (const char* op : {"add", "sub", "mul"}) {
    c.add(op, "same shape", floats({{3, 4}, {3, 4}}));
    c.add(op, "broadcast both sides", floats({{3, 1, 4}, {2, 1}}));
  }
  c.add("add", "0-d operand", floats({{}, {2, 3}}));
  c.add("scale", "alpha -2.5", floats({{3, 4}}), {{"alpha", -2.5}});
  c.add("mul3", "alpha -2", floats({{3, 4}, {3, 4}, {3, 4}}), {{"alpha", -2.0}});
  c.add("sum_to", "columns", floats({{4, 5}}), {{"shape", V{5}}});
  c.add("sum_to", "middle and leading dims", floats({{2, 3, 4}}), {{"shape", V{3, 1}}});
  c.add("sum_to", "to a scalar", floats({{3, 4}}), {{"shape", V{}}});
  c.add("div", "same shape", [](Rng& r) { return Inputs{normal(r, {3, 4}), positive(r, {3, 4})}; });
  c.add("div", "broadcast both sides",
        [](Rng& r) { return Inputs{normal(r, {3, 1, 4}), map(positive(r, {2, 1}), [](double v) { return -v; })}; });
  c.add("exp", "", floats({ACT_MATH}, 1.5));
  c.add("log", "", [](Rng& r) { return Inputs{positive(r, ACT_MATH, 0.3, 3.0)}; });
  c.add("log1p", "", [](Rng& r) { return Inputs{positive(r, ACT_MATH, -0.7, 3.0)}; });
  c.add("sqrt", "", [](Rng& r) { return Inputs{positive(r, ACT_MATH, 0.3, 3.0)}; });
  c.add("abs", "", [](Rng& r) { return Inputs{away(r, ACT_MATH, {0.0}, 2.0)}; });
  c.add("pow", "exponent 3", floats({ACT_MATH}), {{"exponent", 3.0}});
  c.add("pow", "exponent -1.5", [](Rng& r) { return Inputs{positive(r, ACT_MATH, 0.5, 2.0)}; }, {{"exponent", -1.5}});
  c.add("clamp", "min and max", [](Rng& r) { return Inputs{away(r, ACT_MATH, {-0.5, 0.75}, 2.0)}; },
        {{"min", -0.5}, {"max", 0.75}});
  c.add("clamp", "min only", [](Rng& r) { return Inputs{away(r, ACT_MATH, {0.25}, 2.0)}; }, {{"min", 0.25}});
}

void activations(Catalog& c) {
  const Maker kinked = [](Rng& r) { return Inputs{away(r, ACT, {0.0}, 2.0)}; };
  c.add("relu", "", kinked);
  c.add("leaky_relu", "default slope", kinked);
  c.add("leaky_relu", "slope 0.2", kinked, {{"negative_slope", 0.2}});
  c.add("elu", "default alpha", kinked);
  c.add("elu", "alpha 0.5", kinked, {{"alpha", 0.5}});
  c.add("gelu", "default", floats({ACT}, 2.0));
  c.add("gelu", "approximate none", floats({ACT}, 2.0), {{"approximate", "none"}});
  c.add("gelu", "approximate tanh", floats({ACT}, 2.0), {{"approximate", "tanh"}});
  c.add("silu", "", floats({ACT}, 2.0));
  c.add("sigmoid", "", floats({ACT}, 2.0));
  c.add("tanh", "", floats({ACT}, 2.0));
  c.add("softplus", "default", floats({ACT}, 3.0));
  // beta * x > threshold switches to the identity (a jump of ~0.003 at x = 2.5): values on both sides.
  c.add("softplus", "beta 2 threshold 5", [](Rng& r) { return Inputs{away(r, ACT, {2.5}, 3.0)}; },
        {{"beta", 2.0}, {"threshold", 5.0}});
  c.add("softmax", "last axis", floats({{3, 4}}, 2.0), {{"axis", int64_t{-1}}});
  c.add("softmax", "middle axis of 3-d", floats({{2, 3, 4}}, 2.0), {{"axis", int64_t{1}}});
  c.add("log_softmax", "last axis", floats({{3, 4}}, 2.0), {{"axis", int64_t{-1}}});
  c.add("log_softmax", "first axis of 3-d", floats({{2, 3, 4}}, 2.0), {{"axis", int64_t{0}}});
  // dropout's mask is fixed by the runner's seed, so the op is linear in x at every evaluation.
  c.add("dropout", "p 0.4", floats({{3, 5}}), {{"p", 0.4}});
  c.add("dropout", "p 0.5 stream 3", floats({{2, 3, 4}}), {{"p", 0.5}, {"stream", int64_t{3}}});
}

Maker conv_inputs(Shape x, Shape w, bool bias = true) {
  return [=](Rng& r) {
    Inputs in{normal(r, x), normal(r, w, 0.5)};
    if (bias) in.push_back(normal(r, {w[0]}, 0.5));
    return in;
  };
}

void convolutions(Catalog& c) {
  c.add("conv", "1d", conv_inputs({2, 2, 5}, {3, 2, 3}));
  c.add("conv", "1d stride 2 padding 2 dilation 2", conv_inputs({2, 2, 7}, {2, 2, 3}),
        {{"stride", V{2}}, {"padding", V{2}}, {"dilation", V{2}}});
  c.add("conv", "1d groups 2", conv_inputs({2, 4, 4}, {4, 2, 3}), {{"groups", int64_t{2}}, {"padding", V{1}}});
  c.add("conv", "2d padding 1", conv_inputs({2, 1, 4, 4}, {2, 1, 3, 3}), {{"padding", V{1}}});
  c.add("conv", "2d stride 2", conv_inputs({1, 2, 4, 5}, {2, 2, 3, 3}), {{"stride", V{2}}, {"padding", V{1}}});
  c.add("conv", "2d asymmetric stride, no bias", conv_inputs({2, 1, 5, 4}, {2, 1, 3, 2}, false),
        {{"stride", V{2, 1}}});
  c.add("conv", "2d dilation", conv_inputs({1, 1, 5, 5}, {2, 1, 2, 2}), {{"dilation", V{2, 1}}, {"padding", V{1, 0}}});
  c.add("conv", "2d depthwise", conv_inputs({1, 2, 4, 4}, {2, 1, 3, 3}), {{"groups", int64_t{2}}});
  // padding='same' with an even kernel: one more padding row/column at the end than at the start.
  c.add("conv", "2d same padding even kernel", conv_inputs({1, 2, 4, 3}, {2, 2, 2, 2}),
        {{"padding", V{0, 0}}, {"padding_end", V{1, 1}}});
  c.add("conv", "2d fused sigmoid", conv_inputs({1, 2, 3, 3}, {2, 2, 2, 2}), {{"activation", "sigmoid"}});
  c.add("conv", "3d", conv_inputs({1, 1, 3, 4, 3}, {2, 1, 2, 2, 2}), {{"stride", V{1, 2, 1}}, {"padding", V{0, 1, 0}}});
  // A transposed convolution is conv_backward_data run forward: x (N, C_in, ...), w (C_in, C_out / groups, ...).
  c.add("conv_backward_data", "transposed 1d stride 2 output_padding 1",
        [](Rng& r) { return Inputs{normal(r, {2, 2, 4}), normal(r, {2, 3, 3}, 0.5), normal(r, {3}, 0.5)}; },
        {{"stride", V{2}}, {"padding", V{1}}, {"padding_end", V{0}}, {"dilation", V{1}}, {"groups", int64_t{1}},
         {"input_size", V{8}}});
  c.add("conv_backward_data", "transposed 2d groups 2 stride 2",
        [](Rng& r) { return Inputs{normal(r, {1, 4, 3, 3}), normal(r, {4, 1, 2, 2}, 0.5), normal(r, {2}, 0.5)}; },
        {{"stride", V{2}}, {"padding", V{0}}, {"padding_end", V{0}}, {"dilation", V{1}}, {"groups", int64_t{2}},
         {"input_size", V{6, 6}}});
  // The weight gradient of a 1-d conv (kernel 3, stride 2) as an op: inputs x and the output gradient dy.
  c.add("conv_backward_weight", "1d stride 2", floats({{2, 2, 7}, {2, 3, 3}}),
        {{"stride", V{2}}, {"padding", V{0}}, {"dilation", V{1}}, {"groups", int64_t{1}}, {"kernel_size", V{3}}});
  c.add("conv_backward_bias", "forward only", floats({{2, 3, 4}}), {}, {.wrt = Ints{}, .grad_outputs = Ints{}});
}

void pooling(Catalog& c) {
  // Outputs (y, indices): only y gets an upstream gradient (the default).
  c.add("max_pool", "2d kernel 2", [](Rng& r) { return Inputs{distinct(r, {2, 1, 4, 4})}; }, {{"kernel_size", V{2}}});
  c.add("max_pool", "2d kernel 3 stride 2 padding 1 ceil", [](Rng& r) { return Inputs{distinct(r, {1, 2, 5, 4})}; },
        {{"kernel_size", V{3}}, {"stride", V{2}}, {"padding", V{1}}, {"ceil_mode", int64_t{1}}});
  c.add("max_pool", "1d dilation 2", [](Rng& r) { return Inputs{distinct(r, {2, 2, 7})}; },
        {{"kernel_size", V{3}}, {"stride", V{2}}, {"padding", V{1}}, {"dilation", V{2}}});
  c.add("max_pool", "3d", [](Rng& r) { return Inputs{distinct(r, {1, 1, 4, 3, 3})}; },
        {{"kernel_size", V{2}}, {"stride", V{1, 2, 2}}});
  c.add("avg_pool", "2d kernel 2", floats({{2, 1, 4, 4}}), {{"kernel_size", V{2}}});
  c.add("avg_pool", "2d padding excluded, ceil", floats({{1, 2, 5, 4}}),
        {{"kernel_size", V{3}}, {"stride", V{2}}, {"padding", V{1}}, {"ceil_mode", int64_t{1}},
         {"count_include_pad", int64_t{0}}});
  c.add("avg_pool", "2d divisor_override", floats({{1, 2, 5, 4}}),
        {{"kernel_size", V{3}}, {"stride", V{2}}, {"padding", V{1}}, {"divisor_override", int64_t{5}}});
  c.add("avg_pool", "1d padding included", floats({{2, 2, 7}}), {{"kernel_size", V{3}}, {"stride", V{2}}, {"padding", V{1}}});
  c.add("avg_pool", "3d", floats({{1, 1, 4, 3, 3}}), {{"kernel_size", V{2, 2, 1}}, {"stride", V{2, 1, 1}}});
  c.add("adaptive_avg_pool", "1d", floats({{2, 2, 5}}), {{"output_size", V{3}}});
  c.add("adaptive_avg_pool", "2d uneven", floats({{1, 2, 5, 4}}), {{"output_size", V{3, 3}}});
  c.add("adaptive_avg_pool", "2d global", floats({{2, 3, 2, 3}}), {{"output_size", V{1, 1}}});
  c.add("adaptive_avg_pool", "3d", floats({{1, 1, 3, 4, 3}}), {{"output_size", V{2, 2, 2}}});
  c.add("upsample2d", "nearest x2", floats({{1, 2, 2, 3}}),
        {{"size", V{4, 6}}, {"mode", "nearest"}, {"align_corners", int64_t{0}}, {"scale_h", 2.0}, {"scale_w", 2.0}});
  c.add("upsample2d", "nearest to a size, down", floats({{1, 1, 5, 6}}),
        {{"size", V{2, 3}}, {"mode", "nearest"}, {"align_corners", int64_t{0}}});
  c.add("upsample2d", "bilinear x1.5", floats({{1, 1, 4, 5}}),
        {{"size", V{6, 7}}, {"mode", "bilinear"}, {"align_corners", int64_t{0}}, {"scale_h", 1.5}, {"scale_w", 1.5}});
  c.add("upsample2d", "bilinear align_corners", floats({{1, 2, 2, 3}}),
        {{"size", V{3, 5}}, {"mode", "bilinear"}, {"align_corners", int64_t{1}}});
  c.add("upsample2d", "nearest-exact x1.5", floats({{1, 2, 3, 4}}),
        {{"size", V{4, 6}}, {"mode", "nearest-exact"}, {"align_corners", int64_t{0}}, {"scale_h", 1.5}, {"scale_w", 1.5}});
  c.add("upsample2d", "bicubic to a size", floats({{1, 1, 3, 4}}), {{"size", V{5, 6}}, {"mode", "bicubic"}});
  c.add("upsample2d", "bicubic align_corners down", floats({{1, 2, 4, 5}}),
        {{"size", V{3, 3}}, {"mode", "bicubic"}, {"align_corners", int64_t{1}}});
}

// x, then the affine weight (around 1) and bias, each optional.
Maker with_affine(Shape x, Shape p, bool weight = true, bool bias = true) {
  return [=](Rng& r) {
    Inputs in{normal(r, x, 2.0, 0.5)};
    if (weight) in.push_back(normal(r, p, 0.5, 1.0));
    if (bias) in.push_back(normal(r, p, 0.5));
    return in;
  };
}

void normalisation(Catalog& c) {
  // Statistics outputs (mean, rstd) are differentiable: they get upstream gradients too.
  const Options stats{.grad_outputs = Ints{0, 1, 2}};
  c.add("batch_norm", "2-d affine", with_affine({4, 3}, {3}), {{"eps", 1e-5}}, stats);
  c.add("batch_norm", "4-d affine", with_affine({2, 2, 3, 3}, {2}), {{"eps", 1e-5}}, stats);
  c.add("batch_norm", "3-d plain", with_affine({2, 3, 4}, {3}, false, false), {{"eps", 1e-5}}, stats);
  // Inputs x, running_mean, running_var, weight, bias; the running statistics are state, not differentiable.
  c.add("batch_norm_eval", "3-d affine",
        [](Rng& r) {
          return Inputs{normal(r, {2, 3, 4}, 2.0, 0.5), normal(r, {3}, 0.3), positive(r, {3}), normal(r, {3}, 0.5, 1.0),
                        normal(r, {3}, 0.5)};
        },
        {{"eps", 1e-4}}, {.wrt = Ints{0, 3, 4}, .training = false});
  c.add("batch_norm_eval", "2-d plain",
        [](Rng& r) { return Inputs{normal(r, {4, 3}, 2.0), normal(r, {3}, 0.3), positive(r, {3})}; }, {{"eps", 1e-4}},
        {.wrt = Ints{0}, .training = false});
  c.add("layer_norm", "last dim affine", with_affine({3, 4}, {4}), {{"normalized_ndim", int64_t{1}}, {"eps", 1e-5}}, stats);
  c.add("layer_norm", "last 2 dims weight only", with_affine({2, 3, 4}, {3, 4}, true, false),
        {{"normalized_ndim", int64_t{2}}, {"eps", 1e-3}}, stats);
  c.add("layer_norm", "plain", with_affine({2, 5}, {5}, false, false), {{"normalized_ndim", int64_t{1}}, {"eps", 1e-5}},
        stats);
  const Options rms{.grad_outputs = Ints{0, 1}};
  c.add("rms_norm", "weight", with_affine({3, 4}, {4}, true, false), {{"normalized_ndim", int64_t{1}}, {"eps", 1e-6}}, rms);
  c.add("rms_norm", "last 2 dims plain, default eps", with_affine({2, 2, 3}, {2, 3}, false, false),
        {{"normalized_ndim", int64_t{2}}}, rms);
  c.add("group_norm", "2 groups affine", with_affine({2, 4, 3}, {4}), {{"num_groups", int64_t{2}}, {"eps", 1e-5}}, stats);
  c.add("group_norm", "4-d one group plain", with_affine({2, 4, 2, 2}, {4}, false, false),
        {{"num_groups", int64_t{1}}, {"eps", 1e-3}}, stats);
  c.add("embedding", "2-d indices", [](Rng& r) { return Inputs{normal(r, {5, 3}), indices(r, {2, 3}, 5)}; }, {},
        {.wrt = Ints{0}});
  c.add("embedding", "1-d indices with repeats", [](Rng& r) { return Inputs{normal(r, {4, 2}), indices(r, {6}, 3)}; },
        {}, {.wrt = Ints{0}});
  // (scale_grad_by_freq has no case: its gradient is torch's rescaled one, not the forward's derivative,
  // so central differences cannot check it; tests/test_embedding_options.py compares it with torch.)
  // Rows scaled to max_norm where their norm exceeds it (prediction plans; no gradient): norms near 1
  // against max_norm 1, both sides, in the 2-norm, the 1-norm and the largest magnitude.
  for (double p : {2.0, 1.0, double(INFINITY)})
    c.add("row_renorm", "norm_type " + std::string(std::isinf(p) ? "inf" : std::to_string(int(p))),
          floats({{4, 3}}, std::isinf(p) ? 0.9 : 0.6 / p), {{"max_norm", 1.0}, {"norm_type", p}},
          {.wrt = Ints{}, .grad_outputs = Ints{}});
}

// Inputs x, h0, (c0), w_ih, w_hh, (b_ih, b_hh), (lengths); outputs y, h_n, (c_n), then (gru, lstm) a
// saved buffer that gets no upstream gradient. T=3 steps, N=2 samples, I=2 features, H=2 hidden units.
struct Recurrent {
  int gates, states = 1;
  bool batch_first = false, bias = true;
  V lengths = {};
};

void recurrent(Catalog& c, const std::string& op, const std::string& name, Attrs attrs, Recurrent k) {
  Maker make = [k](Rng& r) {
    Inputs in{normal(r, k.batch_first ? Shape{2, 3, 2} : Shape{3, 2, 2})};
    for (int s = 0; s < k.states; ++s) in.push_back(normal(r, {2, 2}, 0.5));
    // Recurrent weights larger than the default init, so the recurrence matters to the gradients.
    in.push_back(positive(r, {k.gates * 2, 2}, -0.7, 0.7));
    in.push_back(positive(r, {k.gates * 2, 2}, -1.4, 1.4));
    for (int b = 0; b < (k.bias ? 2 : 0); ++b) in.push_back(positive(r, {k.gates * 2}, -0.7, 0.7));
    if (!k.lengths.empty()) in.push_back(int_values(k.lengths));
    return in;
  };
  const int n = 1 + k.states + 2 + (k.bias ? 2 : 0);  // every input but the lengths
  Ints wrt, seeded;
  for (int i = 0; i < n; ++i) wrt.push_back(i);
  for (int i = 0; i <= k.states; ++i) seeded.push_back(i);
  attrs.set("batch_first", int64_t{k.batch_first});
  c.add(op, name, make, attrs, {.wrt = wrt, .grad_outputs = seeded});
}

void recurrents(Catalog& c) {
  recurrent(c, "lstm_layer", "time-major", {}, {.gates = 4, .states = 2});
  recurrent(c, "lstm_layer", "batch_first reverse lengths", {{"reverse", int64_t{1}}},
            {.gates = 4, .states = 2, .batch_first = true, .lengths = {2, 3}});
  recurrent(c, "gru_layer", "time-major", {}, {.gates = 3});
  recurrent(c, "gru_layer", "batch_first lengths", {}, {.gates = 3, .batch_first = true, .lengths = {3, 1}});
  recurrent(c, "rnn_layer", "tanh", {{"nonlinearity", "tanh"}}, {.gates = 1});
  recurrent(c, "rnn_layer", "tanh reverse, no bias", {{"nonlinearity", "tanh"}, {"reverse", int64_t{1}}},
            {.gates = 1, .bias = false});
  // relu in the recurrence: a pre-activation within ~1e-6 of 0 would break finite differences; random
  // inputs make that a one-in-a-million event.
  recurrent(c, "rnn_layer", "relu", {{"nonlinearity", "relu"}}, {.gates = 1});
}

// Prediction and target whose differences keep away from the loss's kinks (0, or +-kink).
Maker pred_target(Shape shape, double kink = 0.0) {
  return [=](Rng& r) {
    Tensor t = normal(r, shape);
    Tensor d = away(r, shape, kink == 0.0 ? std::vector<double>{0.0} : std::vector<double>{kink, -kink});
    for (int64_t i = 0; i < d.numel(); ++i) d.data_as<double>()[i] += t.data_as<double>()[i];
    return Inputs{d, t};
  };
}

void losses(Catalog& c) {
  const Options logits_only{.wrt = Ints{0}};
  c.add("mse_loss", "mean", floats({{3, 4}, {3, 4}}), {{"reduction", "mean"}});
  c.add("mse_loss", "sum", floats({{2, 3, 2}, {2, 3, 2}}), {{"reduction", "sum"}});
  c.add("l1_loss", "mean", pred_target({3, 4}), {{"reduction", "mean"}});
  c.add("l1_loss", "sum", pred_target({5}), {{"reduction", "sum"}});
  // huber's gradient is continuous, its second derivative jumps at +-delta: keep differences off those too.
  c.add("huber_loss", "delta 1", pred_target({3, 4}, 1.0), {{"reduction", "mean"}, {"delta", 1.0}});
  c.add("huber_loss", "delta 0.5 sum", pred_target({3, 4}, 0.5), {{"reduction", "sum"}, {"delta", 0.5}});
  c.add("cross_entropy", "mean", [](Rng& r) { return Inputs{normal(r, {3, 4}), indices(r, {3}, 4)}; },
        {{"reduction", "mean"}}, logits_only);
  c.add("cross_entropy", "sum over positions", [](Rng& r) { return Inputs{normal(r, {2, 3, 2}), indices(r, {2, 2}, 3)}; },
        {{"reduction", "sum"}}, logits_only);
  c.add("cross_entropy", "unbatched", [](Rng& r) { return Inputs{normal(r, {5}), indices(r, {}, 5)}; },
        {{"reduction", "mean"}}, logits_only);
  c.add("bce_with_logits", "mean", [](Rng& r) { return Inputs{normal(r, {3, 4}, 2.0), positive(r, {3, 4}, 0.0, 1.0)}; },
        {{"reduction", "mean"}});
  c.add("bce_with_logits", "sum", [](Rng& r) { return Inputs{normal(r, {6}, 2.0), positive(r, {6}, 0.0, 1.0)}; },
        {{"reduction", "sum"}});
}

void shapes(Catalog& c) {
  c.add("concat", "axis 1 three parts", floats({{2, 3}, {2, 1}, {2, 2}}), {{"axis", int64_t{1}}});
  c.add("concat", "axis 0", floats({{1, 2, 3}, {2, 2, 3}}), {{"axis", int64_t{0}}});
  c.add("slice", "axis 1", floats({{3, 5}}), {{"axis", int64_t{1}}, {"start", int64_t{1}}, {"stop", int64_t{4}}});
  c.add("slice", "negative start, last axis", floats({{2, 3, 4}}),
        {{"axis", int64_t{-1}}, {"start", int64_t{-3}}, {"stop", int64_t{-1}}});
  c.add("permute", "3-d", floats({{2, 3, 4}}), {{"dims", V{2, 0, 1}}});
  c.add("permute", "swap middle dims of 4-d", floats({{2, 2, 3, 2}}), {{"dims", V{0, 2, 1, 3}}});
  c.add("reshape", "with -1", floats({{2, 3, 4}}), {{"shape", V{4, -1}}});
  c.add("reshape", "to 1-d", floats({{3, 4}}), {{"shape", V{12}}});
  c.add("flatten", "default", floats({{2, 3, 4}}));
  c.add("flatten", "dims 0 to 1", floats({{2, 3, 2, 2}}), {{"start_dim", int64_t{0}}, {"end_dim", int64_t{1}}});
}

// Inputs x (..., D), scale and shift (D or 1); activation codes 0 identity, 1 softplus, 2 sigmoid, 3 tanh.
Maker output_transform(Shape shape, int64_t d) {
  return [=](Rng& r) {
    Tensor x = away(r, shape, {20.0}, 3.0);  // softplus switches to the identity above 20
    double* p = x.data_as<double>();
    p[0] = r.uniform(20.5, 24.0), p[1] = r.uniform(16.0, 19.5), p[2] = -r.uniform(2.0, 6.0);
    return Inputs{x, normal(r, {d}, 1.0, 1.0), normal(r, {d})};
  };
}

void transforms(Catalog& c) {
  c.add("output_transform", "one activation per output", output_transform({5, 4}, 4), {{"activations", V{0, 1, 2, 3}}});
  c.add("output_transform", "shared scale, 3-d input", output_transform({2, 3, 4}, 1), {{"activations", V{1, 2, 3, 0}}});
  c.add("output_transform", "softplus everywhere", output_transform({4, 3}, 3), {{"activations", V{1}}});
}

// (saved, dy) -> dx. relu/tanh/sigmoid save the forward output, the others its input; dx is linear in
// dy, and the piecewise-linear ones have no gradient with respect to what they saved.
Maker saved_and_dy(std::function<Tensor(Rng&)> saved) {
  return [=](Rng& r) {
    Tensor s = saved(r);
    return Inputs{s, normal(r, ACT)};
  };
}

void second_derivatives(Catalog& c) {
  const auto kinked = [](std::vector<double> kinks) { return [=](Rng& r) { return away(r, ACT, kinks, 2.0); }; };
  const auto smooth = [](std::function<double(double)> f) { return [=](Rng& r) { return map(normal(r, ACT, 2.0), f); }; };
  const auto same = [](double v) { return v; };
  const Options dy_only{.wrt = Ints{1}};
  c.add("relu_backward", "", saved_and_dy([](Rng& r) { return map(away(r, ACT, {0.0}, 2.0), [](double v) { return v > 0 ? v : 0.0; }); }),
        {}, dy_only);
  c.add("leaky_relu_backward", "slope 0.2", saved_and_dy(kinked({0.0})), {{"negative_slope", 0.2}}, dy_only);
  c.add("elu_backward", "alpha 0.5", saved_and_dy(kinked({0.0})), {{"alpha", 0.5}});
  c.add("gelu_backward", "approximate none", saved_and_dy(smooth(same)));
  c.add("gelu_backward", "approximate tanh", saved_and_dy(smooth(same)), {{"approximate", "tanh"}});
  c.add("silu_backward", "", saved_and_dy(smooth(same)));
  c.add("tanh_backward", "", saved_and_dy(smooth([](double v) { return std::tanh(v); })));
  c.add("sigmoid_backward", "", saved_and_dy(smooth([](double v) { return 1 / (1 + std::exp(-v)); })));
  c.add("softplus_backward", "beta 2 threshold 3", saved_and_dy(kinked({1.5})), {{"beta", 2.0}, {"threshold", 3.0}});
  c.add("abs_backward", "", saved_and_dy(kinked({0.0})), {}, dy_only);
  c.add("clamp_backward", "min and max", saved_and_dy(kinked({-0.5, 0.75})), {{"min", -0.5}, {"max", 0.75}}, dy_only);
  for (bool log : {false, true})
    c.add(log ? "log_softmax_backward" : "softmax_backward", "axis 1",
          saved_and_dy([log](Rng& r) { return softmax_rows(normal(r, ACT), log); }), {{"axis", int64_t{1}}});
}

void selection(Catalog& c) {
  const Options outputs_only{.wrt = Ints{}, .grad_outputs = Ints{}};
  for (const char* cmp : {"gt", "lt", "ge", "le", "eq", "ne"})  // 0/1 masks, no gradient; ties included for eq/ne
    c.add(cmp, "broadcast, with ties", [](Rng& r) { return Inputs{grid(r, {3, 4}, -2, 3), grid(r, {4}, -2, 3)}; }, {},
          outputs_only);
  c.add("where", "float condition",
        [](Rng& r) { return Inputs{normal(r, {3, 4}), normal(r, {3, 4}), grid(r, {3, 4}, 0, 2)}; }, {},
        {.wrt = Ints{0, 1}});
  c.add("one_hot", "5 classes", [](Rng& r) { return Inputs{indices(r, {3, 4}, 5)}; },
        {{"num_classes", int64_t{5}}, {"dtype", "float64"}}, outputs_only);
  // max_unpool: a permutation's first 6 of 10 slots per plane (distinct, as non-overlapping pooling gives).
  c.add("max_unpool", "distinct indices into 10",
        [](Rng& r) {
          Tensor idx({2, 3, 6}, DType::i64);
          for (int64_t p = 0; p < 6; ++p) {
            const Tensor perm = distinct(r, {10}, 1.0);
            for (int64_t i = 0; i < 6; ++i) idx.data_as<int64_t>()[p * 6 + i] = static_cast<int64_t>(perm.data_as<double>()[i] + 5);
          }
          return Inputs{normal(r, {2, 3, 6}), idx};
        },
        {{"length", int64_t{10}}}, {.wrt = Ints{0}});
  const Options table_only{.wrt = Ints{0}};
  c.add("gather", "dim 1", [](Rng& r) { return Inputs{normal(r, {3, 5}), indices(r, {3, 2}, 5)}; },
        {{"dim", int64_t{1}}}, table_only);
  c.add("gather", "dim 0, repeated indices", [](Rng& r) { return Inputs{normal(r, {4, 3}), indices(r, {6, 3}, 4)}; },
        {{"dim", int64_t{0}}}, table_only);
  c.add("gather_backward", "dim 1 into (3, 5)", [](Rng& r) { return Inputs{normal(r, {3, 2}), indices(r, {3, 2}, 5)}; },
        {{"dim", int64_t{1}}, {"shape", V{3, 5}}}, table_only);
  // Ops without differentiable inputs: outputs only.
  const Maker none = [](Rng&) { return Inputs{}; };
  c.add("constant", "2x3", none, {{"shape", V{2, 3}}, {"value", 1.5}, {"dtype", "float64"}}, outputs_only);
  c.add("causal_mask", "3x4", none, {{"rows", int64_t{3}}, {"cols", int64_t{4}}, {"dtype", "float64"}}, outputs_only);
  for (const char* dist : {"uniform", "normal"})  // noise: the same draws for a seed on every backend and dtype
    c.add("random", dist, none,
          {{"shape", V{3, 4}}, {"dtype", "float64"}, {"distribution", dist}, {"stream", int64_t{2}}}, outputs_only);
}

}  // namespace

const std::vector<Case>& catalog() {
  static const std::vector<Case> cases = [] {
    Catalog c;
    for (auto part : {products, elementwise, activations, convolutions, pooling, normalisation, recurrents, losses,
                      shapes, transforms, second_derivatives, selection})
      part(c);
    return std::move(c.cases);
  }();
  return cases;
}

const std::vector<std::pair<std::string, std::string>>& uncovered_ops() {
  static const std::vector<std::pair<std::string, std::string>> ops{
      {"batch_norm_update_stats",
       "no outputs: it updates its running-statistics inputs in place (training plans only), which run_op's copies "
       "of the inputs do not show"},
      {"batch_norm_update_running",
       "no outputs: batch_norm_update_stats without the batch count (F.batch_norm's running statistics), "
       "updating its inputs in place (training plans only)"},
      {"embedding_renorm",
       "no outputs: it rescales the looked-up rows of its weight input in place (training plans only); "
       "row_renorm, its prediction-plan twin, has cases"}};
  return ops;
}

}  // namespace treadle::verify_detail
