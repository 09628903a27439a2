#pragma once
// Activation fusion. When a plan is compiled, a forward `linear` or `conv` whose only consumer is a relu, tanh
// or sigmoid takes the activation as its attribute "activation" and writes the activated output
// itself (an epilogue of its product: Eigen applies it to each block of output while it is in
// cache, oneDNN as an eltwise post-op). The activation node stays in the graph as "fused_activation", a
// view of the linear's output that costs nothing, so module scopes, plan outputs and the node
// numbering are unchanged. The fused node's gradient rule first applies the activation's own
// backward op to its output (relu, tanh and sigmoid differentiate from their output), so the
// backward pass is the unfused one. On Eigen the fused relu is bitwise the unfused one; tanh and
// sigmoid use the same vectorised functions, over differently aligned blocks (within an ulp).
#include <string>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/graph.hpp"

namespace treadle {

inline constexpr const char* kActivationAttr = "activation";

// The activations a product can absorb: their backward ops take the activation's output.
inline bool is_fusible_activation(const std::string& op) {
  return op == "relu" || op == "tanh" || op == "sigmoid";
}

// The fused activation of a node, or "" when it has none.
inline const std::string& fused_activation(const Attrs& attrs) {
  static const std::string none;
  return attrs.has(kActivationAttr) ? attrs.s(kActivationAttr) : none;
}

// An op's check of its "activation" attribute.
inline void check_activation_attr(const std::string& op, const Attrs& attrs) {
  if (!attrs.has(kActivationAttr)) return;
  for (const auto& [key, val] : attrs.items())
    if (key == kActivationAttr && !std::holds_alternative<std::string>(val))
      throw_type_error(op, ": attribute 'activation' must be a string");
  const std::string& act = attrs.s(kActivationAttr);
  if (!is_fusible_activation(act))
    throw_value_error(op, ": unknown activation '", act, "' (expected 'relu', 'tanh' or 'sigmoid')");
}

// The gradient of a node's pre-activation output: the upstream gradient, passed through the
// backward op of the node's fused activation (which reads the node's activated output) if it has one.
Value activation_grad(const GradContext& c);

// Registers "fused_activation", the view an absorbed activation node becomes.
void register_fused_activation(OpRegistry& r);

// Rewrites the forward nodes [0, end) of a graph under construction (before its backward pass):
// every linear/conv -> activation pair whose intermediate nothing else reads (`outputs`: the plan's
// outputs, which must stay observable) becomes one fused linear plus a fused_activation view.
void fuse_activations(Graph& g, int end, const std::vector<int>& outputs);

}  // namespace treadle
