// Noise inside the graph: random(shape, dtype, distribution) draws uniform [0, 1) or standard normal
// numbers from the context's counter-based RNG, as dropout does (dropout.cpp): element i of a draw
// is a pure function of (context seed, step counter, the node's "stream", i), so a draw is
// reproducible for a seed, new at every step, and independent of how the executor chunks the work.
// The op has no inputs and no gradient (noise is a constant of the step: a reparameterised sample
// mu + sigma * eps differentiates through mu and sigma).
#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

OpDef random_def() {
  OpDef d;
  d.name = "random";
  d.uses_rng = true;
  d.infer = [](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs("random", in, 0);
    const std::string& dist = attrs.s("distribution");
    if (dist != "uniform" && dist != "normal")
      throw_value_error("random: distribution must be \"uniform\" or \"normal\", got \"", dist, "\"");
    if (!attrs.has("stream")) throw_value_error("random: missing attribute 'stream'");
    attrs.i("stream");
    TensorMeta m{attrs.ints("shape"), dtype_from_name(attrs.s("dtype"))};
    for (int64_t n : m.shape)
      if (n < 0) throw_value_error("random: negative dimension in shape ", shape_str(m.shape));
    check_floating("random", m);
    return std::vector<TensorMeta>{m};
  };
  return d;
}

Value random_like(const char* op, const Value& like, const char* distribution) {
  if (!like.defined()) throw_value_error(op, ": input is an undefined value");
  Graph& g = like.graph();
  const auto stream = static_cast<int64_t>(g.nodes().size());  // unique per node of this graph
  return g.apply1("random", {}, {{"shape", like.shape()}, {"dtype", std::string(dtype_name(like.dtype()))},
                                 {"distribution", std::string(distribution)}, {"stream", stream}});
}

}  // namespace

void register_random_ops(OpRegistry& r) { r.add(random_def()); }

namespace ops {
Value rand_like(Value like) { return random_like("rand_like", like, "uniform"); }
Value randn_like(Value like) { return random_like("randn_like", like, "normal"); }
}  // namespace ops

}  // namespace treadle
