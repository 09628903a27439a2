// The building blocks of attention: batched matmul (with transpose flags), a general axis
// permutation, and the additive causal mask. Multi-head attention itself is composed from these
// (cpp/src/nn/attention_modules.cpp), so its gradient comes from theirs.
#include <numeric>

#include "core/op_registry.hpp"
#include "ops/precision.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

std::vector<TensorMeta> infer_bmm(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("bmm", in, 2);
  check_floating("bmm", in[0]);
  check_same_dtype("bmm", in);
  check_precision_attr("bmm", attrs, in[0].dtype);
  const Shape &a = in[0].shape, &b = in[1].shape;
  if (a.size() != 3 || b.size() != 3 || a[0] != b[0])
    throw_value_error("bmm: expected 3-D operands with the same batch size, got ", shape_str(a), " and ", shape_str(b));
  const bool ta = attrs.i_or("trans_a", 0), tb = attrs.i_or("trans_b", 0);
  const int64_t m = ta ? a[2] : a[1], k = ta ? a[1] : a[2];
  const int64_t kb = tb ? b[2] : b[1], n = tb ? b[1] : b[2];
  if (k != kb)
    throw_value_error("bmm: inner dimensions differ: ", shape_str(a), (ta ? "^T" : ""), " @ ", shape_str(b),
                      (tb ? "^T" : ""));
  return {{{a[0], m, n}, in[0].dtype}};
}

// Same rules as matmul, per batch element, in the node's precision.
std::vector<Value> grad_bmm(const GradContext& c) {
  const bool ta = c.node.attrs.i_or("trans_a", 0), tb = c.node.attrs.i_or("trans_b", 0);
  Value a = c.inputs[0], b = c.inputs[1], dc = c.grad_outputs[0];
  std::vector<Value> g(2);
  auto mm = [&](Value p, Value q, bool tp, bool tq) { return precision_product("bmm", c.node, p, q, tp, tq); };
  if (c.needs_grad[0]) g[0] = !ta ? mm(dc, b, false, !tb) : mm(b, dc, tb, true);
  if (c.needs_grad[1]) g[1] = !tb ? mm(a, dc, !ta, false) : mm(dc, a, true, ta);
  return g;
}

std::vector<TensorMeta> infer_permute(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("permute", in, 1);
  const Shape& s = in[0].shape;
  std::vector<int64_t> dims = attrs.ints("dims");
  if (dims.size() != s.size())
    throw_value_error("permute: ", dims.size(), " dims given for a ", s.size(), "-d input of shape ", shape_str(s));
  std::vector<bool> seen(s.size(), false);
  Shape out(s.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    int d = normalize_axis("permute", dims[i], static_cast<int>(s.size()));
    if (seen[d]) throw_value_error("permute: dimension ", d, " repeated in ", shape_str(attrs.ints("dims")));
    seen[d] = true;
    dims[i] = d;
    out[i] = s[d];
  }
  attrs.set("dims", dims);
  return {{out, in[0].dtype}};
}

std::vector<Value> grad_permute(const GradContext& c) {
  const std::vector<int64_t>& dims = c.node.attrs.ints("dims");
  std::vector<int64_t> inverse(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) inverse[dims[i]] = static_cast<int64_t>(i);
  return {ops::permute(c.grad_outputs[0], inverse)};
}

std::vector<TensorMeta> infer_causal_mask(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("causal_mask", in, 0);
  const int64_t l = attrs.i("rows"), s = attrs.i("cols");
  if (l <= 0 || s <= 0) throw_value_error("causal_mask: sizes must be positive, got (", l, ", ", s, ")");
  return {{{l, s}, dtype_from_name(attrs.s("dtype"))}};
}

}  // namespace

void register_attention_ops(OpRegistry& r) {
  r.add({.name = "bmm", .infer = infer_bmm, .grad = grad_bmm, .workspace = rounded_operand_workspace});
  r.add({.name = "permute", .infer = infer_permute, .grad = grad_permute});
  r.add({.name = "causal_mask", .infer = infer_causal_mask});
}

namespace ops {
Value bmm(Value a, Value b, bool trans_a, bool trans_b) {
  return a.graph().apply1("bmm", {a, b}, {{"trans_a", int64_t{trans_a}}, {"trans_b", int64_t{trans_b}}});
}
Value permute(Value a, const std::vector<int64_t>& dims) {
  bool identity = true;
  for (std::size_t i = 0; i < dims.size(); ++i) identity = identity && dims[i] == static_cast<int64_t>(i);
  if (identity && dims.size() == static_cast<std::size_t>(a.ndim())) return a;
  return a.graph().apply1("permute", {a}, {{"dims", dims}});
}
Value causal_mask(Graph& g, int64_t rows, int64_t cols, DType dtype) {
  return g.apply1("causal_mask", {}, {{"rows", rows}, {"cols", cols}, {"dtype", std::string(dtype_name(dtype))}});
}
}  // namespace ops

}  // namespace treadle
