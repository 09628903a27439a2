// Activations and their backward ops on oneDNN's eltwise primitives, where oneDNN's algorithm is
// the op's definition and its float32 accuracy matches the reference contract (1e-5 relative,
// 1e-6 absolute): relu and leaky_relu (relu with alpha = slope), elu, silu (swish with alpha = 1),
// tanh, sigmoid (logistic). Backward ops take the same saved tensor as the op's definition: the
// output for relu, tanh and sigmoid (oneDNN's *_use_dst_for_bwd algorithms), the input otherwise.
// gelu and softplus stay on Eigen: oneDNN computes 0.5 x (1 + erf/tanh(.)) and log(1 + exp(.)),
// which cancel in the negative tail (errors up to ~1e-6 absolute on small results, measured).
// Elements are split into fixed chunks over the host's executor.
#include <cstring>

#include "backends/onednn/onednn_common.hpp"

namespace treadle::onednn {
namespace {

using dnnl::algorithm;

constexpr int64_t kElementGrain = int64_t{1} << 16;

struct EltwiseAlg {
  algorithm forward = algorithm::undef;
  algorithm backward = algorithm::undef;
  bool backward_uses_dst = false;
  float alpha = 0.f, beta = 0.f;
};

// The oneDNN algorithm for activation `name` (the op name without "_backward") and its attributes.
std::optional<EltwiseAlg> eltwise_alg(const std::string& name, const Attrs& attrs) {
  if (name == "relu") return EltwiseAlg{algorithm::eltwise_relu, algorithm::eltwise_relu_use_dst_for_bwd, true};
  if (name == "leaky_relu") {
    const float slope = static_cast<float>(attrs.f("negative_slope"));
    return EltwiseAlg{algorithm::eltwise_relu, algorithm::eltwise_relu, false, slope};
  }
  if (name == "elu") {
    const float alpha = static_cast<float>(attrs.f("alpha"));
    return EltwiseAlg{algorithm::eltwise_elu, algorithm::eltwise_elu, false, alpha};
  }
  if (name == "silu") return EltwiseAlg{algorithm::eltwise_swish, algorithm::eltwise_swish, false, 1.f};
  if (name == "tanh") return EltwiseAlg{algorithm::eltwise_tanh, algorithm::eltwise_tanh_use_dst_for_bwd, true};
  if (name == "sigmoid")
    return EltwiseAlg{algorithm::eltwise_logistic, algorithm::eltwise_logistic_use_dst_for_bwd, true};
  return std::nullopt;
}

dnnl::eltwise_forward::primitive_desc forward_pd(const EltwiseAlg& e, int64_t n) {
  const MemDesc md = f32_dense({n});
  return dnnl::eltwise_forward::primitive_desc(cpu_engine(), dnnl::prop_kind::forward_training, e.forward, md, md,
                                               e.alpha, e.beta, default_attr());
}

std::optional<ChunkPlan> plan_forward(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const std::optional<EltwiseAlg> e = eltwise_alg(op_name(node), node.attrs);
  const int64_t numel = shape_numel(in_shape(g, node, 0));
  if (!e) return std::nullopt;
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, sizeof(float)}, {DNNL_ARG_DST, true, 0, sizeof(float)}};
  return plan_chunks(args, numel, kElementGrain, [&](int64_t n) {
    return try_pd([&]() -> dnnl::primitive_desc { return forward_pd(*e, n); });
  });
}

// (saved, dy) -> dx
std::optional<ChunkPlan> plan_backward(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  std::string name = op_name(node);
  name.resize(name.size() - std::strlen("_backward"));
  const std::optional<EltwiseAlg> e = eltwise_alg(name, node.attrs);
  const int64_t numel = shape_numel(in_shape(g, node, 0));
  if (!e) return std::nullopt;
  std::vector<ArgSpec> args = {{e->backward_uses_dst ? DNNL_ARG_DST : DNNL_ARG_SRC, false, 0, sizeof(float)},
                               {DNNL_ARG_DIFF_DST, false, 1, sizeof(float)},
                               {DNNL_ARG_DIFF_SRC, true, 0, sizeof(float)}};
  return plan_chunks(args, numel, kElementGrain, [&](int64_t n) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc md = f32_dense({n});
      return dnnl::eltwise_backward::primitive_desc(cpu_engine(), e->backward, md, md, md, e->alpha, e->beta,
                                                    forward_pd(*e, n), default_attr());
    });
  });
}

}  // namespace

std::vector<OpEntry> eltwise_entries() {
  std::vector<OpEntry> entries;
  for (const char* name : {"relu", "leaky_relu", "elu", "silu", "tanh", "sigmoid"}) {
    entries.push_back({name, &plan_forward});
    entries.push_back({std::string(name) + "_backward", &plan_backward});
  }
  return entries;
}

}  // namespace treadle::onednn
