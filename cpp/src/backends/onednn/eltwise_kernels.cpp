// Activations on oneDNN's eltwise primitives, where oneDNN computes the op's definition at the
// reference's float32 accuracy (1e-5 relative, 1e-6 absolute) and is measurably faster:
//   elu, silu (swish with alpha = 1)   forward and backward (both take the input, as the op does),
//                                      from 256 elements
// What stays on Eigen, and why (docs/onednn.md has the measurements):
//   - relu and leaky_relu, forward and backward, and the tanh/sigmoid backward ops: Eigen runs them
//     vectorised at memory speed, so oneDNN only adds its call overhead;
//   - tanh and sigmoid: oneDNN's tanh ran 5-7 ns per element on AVX2 (AMD EPYC, Zen 3) against ~1.2
//     for Eigen's vectorised float tanh; on AVX-512 it was 1.25x faster than Eigen's tanh before that
//     was vectorised whole (2x faster since, on AVX2). Kept on Eigen on every CPU: one tanh, the
//     same bits on every backend;
//   - gelu and softplus: oneDNN computes 0.5 x (1 + erf(.)) and log(1 + exp(.)), which cancel in
//     the negative tail (errors up to ~1e-6 absolute on small results, measured);
//   - small tensors, where the ~0.5 us per oneDNN call outweighs the faster arithmetic.
// Elements are split into fixed chunks over the host's executor.
#include <cstring>

#include "backends/onednn/onednn_common.hpp"

namespace treadle::onednn {
namespace {

using dnnl::algorithm;

constexpr int64_t kElementGrain = int64_t{1} << 16;

struct EltwiseAlg {
  algorithm alg = algorithm::undef;
  float alpha = 0.f;
  int64_t min_elements = 0;  // below, Eigen is faster (measured)
};

// The oneDNN algorithm for activation `name` (forward op name) and its attributes.
std::optional<EltwiseAlg> eltwise_alg(const std::string& name, const Attrs& attrs) {
  if (name == "elu") return EltwiseAlg{algorithm::eltwise_elu, static_cast<float>(attrs.f("alpha")), 256};
  if (name == "silu") return EltwiseAlg{algorithm::eltwise_swish, 1.f, 256};
  return std::nullopt;
}

dnnl::eltwise_forward::primitive_desc forward_pd(const EltwiseAlg& e, int64_t n) {
  const MemDesc md = f32_dense({n});
  return dnnl::eltwise_forward::primitive_desc(cpu_engine(), dnnl::prop_kind::forward_training, e.alg, md, md,
                                               e.alpha, 0.f, default_attr());
}

// The elements of the node's first input, when the node is float32 and big enough to pay.
std::optional<int64_t> elements_if_worth_it(const Graph& g, const Node& node, const EltwiseAlg& e) {
  if (!all_f32(g, node)) return std::nullopt;
  const int64_t numel = shape_numel(in_shape(g, node, 0));
  if (numel < e.min_elements && size_thresholds_apply()) return std::nullopt;
  return numel;
}

std::optional<ChunkPlan> plan_forward(const Graph& g, const Node& node) {
  const std::optional<EltwiseAlg> e = eltwise_alg(op_name(node), node.attrs);
  const std::optional<int64_t> numel = e ? elements_if_worth_it(g, node, *e) : std::nullopt;
  if (!numel) return std::nullopt;
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, sizeof(float)}, {DNNL_ARG_DST, true, 0, sizeof(float)}};
  return plan_chunks(args, *numel, kElementGrain, [&](int64_t n) {
    return try_pd([&]() -> dnnl::primitive_desc { return forward_pd(*e, n); });
  });
}

// (x, dy) -> dx, for the activations whose backward op takes the forward input.
std::optional<ChunkPlan> plan_backward(const Graph& g, const Node& node) {
  std::string name = op_name(node);
  name.resize(name.size() - std::strlen("_backward"));
  const std::optional<EltwiseAlg> e = eltwise_alg(name, node.attrs);
  const std::optional<int64_t> numel = e ? elements_if_worth_it(g, node, *e) : std::nullopt;
  if (!numel) return std::nullopt;
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, sizeof(float)},
                               {DNNL_ARG_DIFF_DST, false, 1, sizeof(float)},
                               {DNNL_ARG_DIFF_SRC, true, 0, sizeof(float)}};
  return plan_chunks(args, *numel, kElementGrain, [&](int64_t n) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc md = f32_dense({n});
      return dnnl::eltwise_backward::primitive_desc(cpu_engine(), e->alg, md, md, md, e->alpha, 0.f,
                                                    forward_pd(*e, n), default_attr());
    });
  });
}

}  // namespace

std::vector<OpEntry> eltwise_entries() {
  return {chunked("elu", &plan_forward), chunked("elu_backward", &plan_backward), chunked("silu", &plan_forward),
          chunked("silu_backward", &plan_backward)};
}

}  // namespace treadle::onednn
