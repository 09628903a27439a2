// dropout(x, p): in training, zeroes each element with probability p and scales the kept ones by
// 1 / (1 - p). The op has two outputs, y and the mask (0 or 1 / (1 - p), in x's dtype), so the
// gradient is simply dy * mask and backward needs no RNG.
//
// p is accepted in [0, 1]. p == 1 is allowed as in PyTorch: every element is dropped, y and the
// mask are all zeros (and so is the gradient). Outside training, or with p == 0, dropout is the
// identity and records no node.
//
// Randomness is counter-based: the kernel hashes (context seed, step counter, the node's "stream"
// attribute, element index), so a mask depends neither on how the executor chunks the work nor on
// which other nodes draw numbers. "stream" is set at record time to the number of nodes already in
// the graph, which makes it unique per dropout node of a graph.
#include <cmath>
#include <variant>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

void check_p(double p) {
  if (!(p >= 0.0 && p <= 1.0)) throw_value_error("dropout: p must be in [0, 1], got ", p);
}

// p may arrive from Python as an integer (p=0 or p=1): store it as a double for the kernels.
void normalize_attrs(Attrs& attrs) {
  double p = 0.5;
  int64_t stream = 0;
  for (const auto& [key, val] : attrs.items()) {
    if (key == "p") {
      if (const auto* d = std::get_if<double>(&val)) {
        p = *d;
      } else if (const auto* i = std::get_if<int64_t>(&val)) {
        p = static_cast<double>(*i);
      } else {
        throw_type_error("dropout: attribute 'p' must be a number");
      }
    } else if (key == "stream") {
      const auto* i = std::get_if<int64_t>(&val);
      if (!i) throw_type_error("dropout: attribute 'stream' must be an integer");
      stream = *i;
    }
  }
  check_p(p);
  attrs.set("p", p);
  attrs.set("stream", stream);
}

OpDef dropout_def() {
  OpDef d;
  d.name = "dropout";
  d.uses_rng = true;
  d.infer = [](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs("dropout", in, 1);
    check_floating("dropout", in[0]);
    normalize_attrs(attrs);
    return std::vector<TensorMeta>{same_as(in[0]), same_as(in[0])};  // y, mask
  };
  d.grad = [](const GradContext& ctx) -> std::vector<Value> {
    if (!ctx.needs_grad.at(0) || !ctx.grad_outputs.at(0).defined()) return {Value()};
    return {ops::mul(ctx.grad_outputs[0], ctx.outputs.at(1))};
  };
  return d;
}

}  // namespace

void register_dropout_ops(OpRegistry& r) { r.add(dropout_def()); }

namespace ops {

Value dropout(Value x, double p) {
  check_p(p);
  if (!x.defined()) throw_value_error("dropout: input is an undefined value");
  Graph& g = x.graph();
  if (!g.training() || p == 0.0) return x;
  const auto stream = static_cast<int64_t>(g.nodes().size());
  return g.apply1("dropout", {x}, {{"p", p}, {"stream", stream}});
}

}  // namespace ops
}  // namespace treadle
