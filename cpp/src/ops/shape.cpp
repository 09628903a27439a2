// Shape ops: reshape, flatten, concat, slice, and slice_backward (the gradient of slice: dy placed
// into zeros). reshape and flatten alias their input (OpDef::view_of = 0); their copy kernels exist
// only for backends that ignore aliasing. These ops move bytes, so they accept every dtype.
//
// slice(a, axis, start, stop) takes the half-open range [start, stop) along `axis`; a negative
// start or stop counts from the end as in Python, but out-of-range bounds are an error rather than
// being clamped. Empty ranges (start == stop) are allowed.
#include <algorithm>
#include <optional>
#include <variant>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

int64_t int_attr(const std::string& op, const Attrs& attrs, const char* name) {
  if (!attrs.has(name)) throw_value_error(op, ": missing attribute '", name, "'");
  for (const auto& [key, val] : attrs.items())
    if (key == name && !std::holds_alternative<int64_t>(val))
      throw_type_error(op, ": attribute '", name, "' must be an integer");
  return attrs.i(name);
}

int ndim_of(const TensorMeta& m) { return static_cast<int>(m.shape.size()); }

// Resolves a single -1 and checks that the element count is unchanged.
Shape resolve_reshape(const Shape& from, const Shape& to) {
  const int64_t numel = shape_numel(from);
  int infer_at = -1;
  int64_t known = 1;
  for (std::size_t d = 0; d < to.size(); ++d) {
    if (to[d] == -1 && infer_at < 0) {
      infer_at = static_cast<int>(d);
    } else if (to[d] == -1) {
      throw_value_error("reshape: only one dimension may be -1, got ", shape_str(to));
    } else if (to[d] < 0) {
      throw_value_error("reshape: invalid dimension ", to[d], " in ", shape_str(to));
    } else {
      known *= to[d];
    }
  }
  Shape out = to;
  if (infer_at >= 0 && known != 0 && numel % known == 0) out[infer_at] = numel / known;
  if (infer_at >= 0 && out[infer_at] == -1) {
    throw_value_error("reshape: cannot reshape ", shape_str(from), " (", numel, " elements) into ", shape_str(to));
  }
  if (shape_numel(out) != numel)
    throw_value_error("reshape: cannot reshape ", shape_str(from), " (", numel, " elements) into ", shape_str(to),
                      " (", shape_numel(out), " elements)");
  return out;
}

std::vector<Value> reshape_back(const GradContext& ctx) {
  if (!ctx.needs_grad.at(0) || !ctx.grad_outputs.at(0).defined()) return {Value()};
  return {ops::reshape(ctx.grad_outputs[0], ctx.inputs.at(0).shape())};
}

OpDef reshape_def() {
  OpDef d;
  d.name = "reshape";
  d.view_of = 0;
  d.infer = [](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs("reshape", in, 1);
    if (!attrs.has("shape")) throw_value_error("reshape: missing attribute 'shape'");
    const Shape out = resolve_reshape(in[0].shape, attrs.ints("shape"));
    attrs.set("shape", out);
    return std::vector<TensorMeta>{{out, in[0].dtype}};
  };
  d.grad = reshape_back;
  return d;
}

OpDef flatten_def() {
  OpDef d;
  d.name = "flatten";
  d.view_of = 0;
  d.infer = [](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs("flatten", in, 1);
    const Shape& s = in[0].shape;
    if (s.empty()) return std::vector<TensorMeta>{{Shape{1}, in[0].dtype}};  // a scalar flattens to (1,)
    const int nd = ndim_of(in[0]);
    const int start = normalize_axis("flatten", attrs.i_or("start_dim", 1), nd);
    const int end = normalize_axis("flatten", attrs.i_or("end_dim", -1), nd);
    if (start > end)
      throw_value_error("flatten: start_dim ", start, " comes after end_dim ", end, " for input of shape ",
                        shape_str(s));
    attrs.set("start_dim", int64_t{start});
    attrs.set("end_dim", int64_t{end});
    Shape out(s.begin(), s.begin() + start);
    int64_t merged = 1;
    for (int k = start; k <= end; ++k) merged *= s[k];
    out.push_back(merged);
    out.insert(out.end(), s.begin() + end + 1, s.end());
    return std::vector<TensorMeta>{{out, in[0].dtype}};
  };
  d.grad = reshape_back;
  return d;
}

OpDef concat_def() {
  OpDef d;
  d.name = "concat";
  d.infer = [](const std::vector<TensorMeta>& in, Attrs& attrs) {
    if (in.empty()) throw_value_error("concat: expected at least one input");
    check_same_dtype("concat", in);
    const int axis = normalize_axis("concat", int_attr("concat", attrs, "axis"), ndim_of(in[0]));
    attrs.set("axis", int64_t{axis});
    Shape out = in[0].shape;
    out[axis] = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const Shape& s = in[k].shape;
      bool match = s.size() == out.size();
      for (std::size_t d = 0; match && d < s.size(); ++d) match = static_cast<int>(d) == axis || s[d] == out[d];
      if (!match)
        throw_value_error("concat: input ", k, " has shape ", shape_str(s), " but input 0 has shape ",
                          shape_str(in[0].shape), "; all dimensions except axis ", axis, " must match");
      out[axis] += s[axis];
    }
    return std::vector<TensorMeta>{{out, in[0].dtype}};
  };
  d.grad = [](const GradContext& ctx) {
    std::vector<Value> grads(ctx.inputs.size());
    const Value& dy = ctx.grad_outputs.at(0);
    if (!dy.defined()) return grads;
    const int axis = static_cast<int>(ctx.node.attrs.i("axis"));
    int64_t offset = 0;
    for (std::size_t k = 0; k < ctx.inputs.size(); ++k) {
      const int64_t len = ctx.inputs[k].dim(axis);
      if (ctx.needs_grad.at(k)) grads[k] = ops::slice(dy, axis, offset, offset + len);
      offset += len;
    }
    return grads;
  };
  return d;
}

// A range [start, stop) along `axis`: negative bounds count from the end, then must lie in [0, size].
struct SliceRange {
  int axis;
  int64_t start, stop;
};

SliceRange slice_range(const std::string& op, Attrs& attrs, const Shape& s, int64_t size) {
  const int axis = normalize_axis(op, int_attr(op, attrs, "axis"), static_cast<int>(s.size()));
  const int64_t start0 = int_attr(op, attrs, "start"), stop0 = int_attr(op, attrs, "stop");
  if (size < 0) size = s[axis];
  const int64_t start = start0 < 0 ? start0 + size : start0;
  const int64_t stop = stop0 < 0 ? stop0 + size : stop0;
  if (start < 0 || start > stop || stop > size)
    throw_value_error(op, ": range [", start0, ", ", stop0, ") is out of bounds for axis ", axis, " of size ", size,
                      " in shape ", shape_str(s));
  attrs.set("axis", int64_t{axis});
  attrs.set("start", start);
  attrs.set("stop", stop);
  return {axis, start, stop};
}

OpDef slice_def() {
  OpDef d;
  d.name = "slice";
  d.infer = [](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs("slice", in, 1);
    const SliceRange r = slice_range("slice", attrs, in[0].shape, -1);
    Shape out = in[0].shape;
    out[r.axis] = r.stop - r.start;
    return std::vector<TensorMeta>{{out, in[0].dtype}};
  };
  d.grad = [](const GradContext& ctx) -> std::vector<Value> {
    if (!ctx.needs_grad.at(0) || !ctx.grad_outputs.at(0).defined()) return {Value()};
    const Attrs& at = ctx.node.attrs;
    const int64_t axis = at.i("axis");
    Attrs attrs{{"axis", axis},
                {"start", at.i("start")},
                {"stop", at.i("stop")},
                {"size", ctx.inputs.at(0).dim(static_cast<int>(axis))}};
    return {ctx.graph.apply1("slice_backward", {ctx.grad_outputs[0]}, attrs)};
  };
  return d;
}

// (dy) -> dx of size `size` along `axis`: dy in [start, stop), zeros elsewhere.
OpDef slice_backward_def() {
  OpDef d;
  d.name = "slice_backward";
  d.infer = [](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs("slice_backward", in, 1);
    const int64_t size = int_attr("slice_backward", attrs, "size");
    if (size < 0) throw_value_error("slice_backward: size must be non-negative, got ", size);
    const SliceRange r = slice_range("slice_backward", attrs, in[0].shape, size);
    if (in[0].shape[r.axis] != r.stop - r.start)
      throw_value_error("slice_backward: gradient of shape ", shape_str(in[0].shape), " does not fit range [",
                        r.start, ", ", r.stop, ") along axis ", r.axis);
    Shape out = in[0].shape;
    out[r.axis] = size;
    return std::vector<TensorMeta>{{out, in[0].dtype}};
  };
  // slice_backward is linear and its adjoint is the slice it came from.
  d.grad = [](const GradContext& ctx) -> std::vector<Value> {
    if (!ctx.needs_grad.at(0) || !ctx.grad_outputs.at(0).defined()) return {Value()};
    const Attrs& at = ctx.node.attrs;
    return {ops::slice(ctx.grad_outputs[0], static_cast<int>(at.i("axis")), at.i("start"), at.i("stop"))};
  };
  return d;
}

Graph& graph_of(const char* op, const Value& v) {
  if (!v.defined()) throw_value_error(op, ": input is an undefined value");
  return v.graph();
}

}  // namespace

void register_shape_ops(OpRegistry& r) {
  r.add(reshape_def());
  r.add(flatten_def());
  r.add(concat_def());
  r.add(slice_def());
  r.add(slice_backward_def());
}

namespace ops {

Value reshape(Value a, const Shape& shape) { return graph_of("reshape", a).apply1("reshape", {a}, {{"shape", shape}}); }

Value flatten(Value a, int start_dim, int end_dim) {
  return graph_of("flatten", a)
      .apply1("flatten", {a}, {{"start_dim", int64_t{start_dim}}, {"end_dim", int64_t{end_dim}}});
}

Value concat(const std::vector<Value>& parts, int axis) {
  if (parts.empty()) throw_value_error("concat: expected at least one input");
  for (const Value& p : parts) graph_of("concat", p);
  return parts[0].graph().apply1("concat", parts, {{"axis", int64_t{axis}}});
}

Value slice(Value a, int axis, int64_t start, int64_t stop) {
  return graph_of("slice", a).apply1("slice", {a}, {{"axis", int64_t{axis}}, {"start", start}, {"stop", stop}});
}

// The composites below record reshape, permute and slice nodes (torch's view-like methods).
Value transpose(Value a, int dim0, int dim1) {
  const int nd = (graph_of("transpose", a), a.ndim());
  // As torch, a 0-d or 1-d tensor transposes to itself (dims 0 and -1 name its only axis).
  const int d0 = normalize_axis("transpose", dim0, std::max(nd, 1));
  const int d1 = normalize_axis("transpose", dim1, std::max(nd, 1));
  if (d0 == d1 || nd < 2) return a;
  std::vector<int64_t> dims(nd);
  for (int i = 0; i < nd; ++i) dims[i] = i;
  std::swap(dims[d0], dims[d1]);
  return permute(a, dims);
}

Value unsqueeze(Value a, int dim) {
  Shape s = (graph_of("unsqueeze", a), a.shape());
  const int d = normalize_axis("unsqueeze", dim, static_cast<int>(s.size()) + 1);
  s.insert(s.begin() + d, 1);
  return reshape(a, s);
}

Value squeeze(Value a, std::optional<int> dim) {
  Shape s = (graph_of("squeeze", a), a.shape());
  if (s.empty()) return a;
  if (dim) {
    const int d = normalize_axis("squeeze", *dim, static_cast<int>(s.size()));
    if (s[d] != 1) return a;  // as torch: a dimension that is not 1 stays
    s.erase(s.begin() + d);
  } else {
    s.erase(std::remove(s.begin(), s.end(), int64_t{1}), s.end());
  }
  return s == a.shape() ? a : reshape(a, s);
}

std::vector<Value> split(Value a, const std::vector<int64_t>& sizes, int dim) {
  const Shape s = (graph_of("split", a), a.shape());
  if (s.empty()) throw_value_error("split: a 0-d tensor cannot be split");
  const int d = normalize_axis("split", dim, static_cast<int>(s.size()));
  int64_t total = 0;
  for (int64_t n : sizes) {
    if (n < 0) throw_value_error("split: sizes must be non-negative, got ", shape_str(sizes));
    total += n;
  }
  if (total != s[d])
    throw_value_error("split: sizes ", shape_str(sizes), " sum to ", total, ", but dimension ", d, " has size ", s[d]);
  std::vector<Value> parts;
  int64_t start = 0;
  for (int64_t n : sizes) {
    parts.push_back(slice(a, d, start, start + n));
    start += n;
  }
  return parts;
}

std::vector<Value> split(Value a, int64_t split_size, int dim) {
  const Shape s = (graph_of("split", a), a.shape());
  if (s.empty()) throw_value_error("split: a 0-d tensor cannot be split");
  const int d = normalize_axis("split", dim, static_cast<int>(s.size()));
  if (split_size <= 0 && !(split_size == 0 && s[d] == 0))
    throw_value_error("split: split_size must be positive, got ", split_size);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < s[d]; start += split_size) sizes.push_back(std::min(split_size, s[d] - start));
  if (sizes.empty()) sizes.push_back(0);
  return split(a, sizes, d);
}

std::vector<Value> chunk(Value a, int64_t chunks, int dim) {
  if (chunks <= 0) throw_value_error("chunk: chunks must be positive, got ", chunks);
  const Shape s = (graph_of("chunk", a), a.shape());
  if (s.empty()) throw_value_error("chunk: a 0-d tensor cannot be chunked");
  const int d = normalize_axis("chunk", dim, static_cast<int>(s.size()));
  const int64_t size = (s[d] + chunks - 1) / chunks;  // as torch: equal parts of ceil(n / chunks), the last smaller
  return split(a, size == 0 ? int64_t{1} : size, d);
}

}  // namespace ops
}  // namespace treadle
