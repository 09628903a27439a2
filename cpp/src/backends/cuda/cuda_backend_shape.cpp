// Op adapters of the CUDA backend for shape, attention-building and embedding ops
// (shape_kernels.hpp, lt_bmm.hpp):
//   slice, slice_backward, concat, permute -> copy kernels, any dtype (they only move elements)
//   bmm                                    -> LtBmm (strided-batched cuBLASLt, f32, bf16 or fp16 operands)
//   causal_mask                            -> a fill (float32)
//   embedding, embedding_backward          -> a row gather; the gradient from positions sorted by
//                                             index (float32 table, int64 or int32 indices)
//   adaptive_avg_pool[_backward], upsample2d[_backward], output_transform[_backward]
//                                          -> resample_kernels.hpp (float32)
// reshape and flatten never reach a backend: the plan makes them views of their input
// (OpDef::view_of) and runs no kernel for them.
#include <cstdint>
#include <memory>
#include <string>

#include "backends/cuda/cuda_backend_ops.hpp"
#include "backends/cuda/embedding_kernels.hpp"
#include "backends/cuda/lt_bmm.hpp"
#include "backends/cuda/resample_kernels.hpp"
#include "backends/cuda/shape_kernels.hpp"
#include "core/op_registry.hpp"

namespace treadle::cuda {
namespace {

std::size_t element_bytes(const TensorRef& t) { return dtype_size(t.dtype); }

// ---- slice / slice_backward / concat: (outer, axis, inner) around attribute "axis" of `s`.
struct AxisView {
  int64_t outer = 1, inner = 1;
  int axis = 0;
};

AxisView axis_view(const Shape& s, int axis) {
  AxisView v;
  v.axis = axis;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d < axis) v.outer *= s[d];
    if (d > axis) v.inner *= s[d];
  }
  return v;
}

// Copies move bytes of every dtype, empty tensors included (the kernels then do nothing).
bool accepts_copy(const Graph&, const Node&) { return true; }

PreparedNode prepare_axis_view(const Graph& g, const Node& node) {
  // slice_backward's full shape is its output; slice's and concat's come from input 0 / the output.
  const bool backward = op_name(node) == "slice_backward";
  const Shape& s = shape_of(g, backward ? node.outputs[0] : node.inputs[0]);
  return with_state(std::make_shared<AxisView>(axis_view(s, static_cast<int>(node.attrs.i("axis")))));
}

void slice_kernel(const KernelArgs& a) {
  const AxisView& v = state_of<AxisView>(a);
  slice_copy(a.in[0].data, a.out[0].data, v.outer, a.in[0].dim(v.axis), v.inner, a.attrs().i("start"),
             a.out[0].dim(v.axis), element_bytes(a.in[0]), stream_of(a));
}

void slice_backward_kernel(const KernelArgs& a) {
  const AxisView& v = state_of<AxisView>(a);
  slice_backward_copy(a.in[0].data, a.out[0].data, v.outer, a.out[0].dim(v.axis), v.inner, a.attrs().i("start"),
                      a.in[0].dim(v.axis), element_bytes(a.in[0]), stream_of(a));
}

// One launch per input, each into its range of the output's axis.
void concat_kernel(const KernelArgs& a) {
  const AxisView& v = state_of<AxisView>(a);
  const int64_t out_axis = a.out[0].dim(v.axis);
  int64_t offset = 0;
  for (int k = 0; k < a.num_in; ++k) {
    const int64_t part = a.in[k].dim(v.axis);
    concat_part(a.in[k].data, a.out[0].data, v.outer, part, v.inner, out_axis, offset, element_bytes(a.out[0]),
                stream_of(a));
    offset += part;
  }
}

// ---- permute (attribute dims, non-negative after the op's check)
bool accepts_permute(const Graph& g, const Node& node) {
  return shape_of(g, node.inputs[0]).size() <= static_cast<std::size_t>(kMaxPermuteDims);
}

PreparedNode prepare_permute(const Graph& g, const Node& node) {
  const Shape& x = shape_of(g, node.inputs[0]);
  const std::vector<int64_t>& dims = node.attrs.ints("dims");
  const int nd = static_cast<int>(x.size());
  int64_t strides[kMaxPermuteDims] = {};  // x's row-major strides
  int64_t stride = 1;
  for (int d = nd - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= x[d];
  }
  auto p = std::make_shared<PermuteShape>();
  p->ndim = nd;
  for (int k = 0; k < nd; ++k) {
    p->out_dims[k] = x[dims[k]];
    p->in_strides[k] = strides[dims[k]];
  }
  return with_state(std::move(p));
}

void permute_kernel(const KernelArgs& a) {
  permute_copy(a.in[0].data, a.out[0].data, state_of<PermuteShape>(a), a.out[0].numel, element_bytes(a.in[0]),
               stream_of(a));
}

// ---- causal_mask (no inputs; float32 output)
bool accepts_causal_mask(const Graph& g, const Node& node) {
  return g.info(node.outputs[0]).dtype == DType::f32;
}

void causal_mask_kernel(const KernelArgs& a) {
  causal_mask_fill(out_f(a), a.out[0].dim(0), a.out[0].dim(1), stream_of(a));
}

// ---- bmm: a (B, ., .), b (B, ., .) -> c (B, M, N), precision "bf16" / "fp16" as exact 16-bit operands
PreparedNode prepare_bmm(const Graph& g, const Node& node) {
  const Shape &a = shape_of(g, node.inputs[0]), &b = shape_of(g, node.inputs[1]);
  BmmConfig c;
  c.trans_a = node.attrs.i_or("trans_a", 0) != 0;
  c.trans_b = node.attrs.i_or("trans_b", 0) != 0;
  c.batch = a[0];
  c.m = c.trans_a ? a[2] : a[1];
  c.k = c.trans_a ? a[1] : a[2];
  c.n = c.trans_b ? b[1] : b[2];
  const OperandRounding r = operand_rounding(node.attrs);
  c.math = r == OperandRounding::bf16   ? MathMode::bf16_operands
           : r == OperandRounding::fp16 ? MathMode::fp16_operands
                                        : MathMode::f32;
  auto s = std::make_shared<LtBmm>(lt_handle(), c);
  const std::size_t ws = s->workspace_bytes();
  return with_state(std::move(s), ws);
}

void bmm_kernel(const KernelArgs& a) {
  state_of<LtBmm>(a).run(in_f(a, 0), in_f(a, 1), out_f(a), a.workspace, stream_of(a));
}

// ---- embedding: (weight (num, dim), indices) -> y; embedding_backward: (dy, indices) -> dweight,
// the sorted positions and the sort's scratch in the workspace
bool accepts_embedding(const Graph& g, const Node& node) {
  const DType idx = g.info(node.inputs[1]).dtype;
  return float32_node(g, node) && (idx == DType::i64 || idx == DType::i32) &&
         shape_numel(shape_of(g, node.inputs[1])) <= INT32_MAX &&  // the gradient's sort counts in int
         !node.attrs.i_or("scale_grad_by_freq", 0);                // no device kernel divides by the counts
}

void embedding_kernel(const KernelArgs& a) {
  embedding_forward(in_f(a, 0), a.in[1].data, a.in[1].dtype == DType::i64, out_f(a), a.in[1].numel, a.in[0].dim(0),
                    a.in[0].dim(1), stream_of(a));
}

PreparedNode prepare_embedding_backward(const Graph& g, const Node& node) {
  const ValueInfo& idx = g.info(node.inputs[1]);
  auto l = std::make_shared<EmbeddingGradLayout>(
      embedding_backward_layout(shape_numel(idx.shape), idx.dtype == DType::i64));
  const std::size_t ws = l->total;
  return with_state(std::move(l), ws);
}

void embedding_backward_kernel(const KernelArgs& a) {
  embedding_backward(in_f(a, 0), a.in[1].data, out_f(a), a.out[0].dim(0), a.out[0].dim(1),
                     a.attrs().i_or("padding_idx", -1), state_of<EmbeddingGradLayout>(a), a.workspace, stream_of(a));
}

// ---- adaptive_avg_pool: x (N, C, *spatial) -> y (N, C, *output_size), 1 to 3 spatial dims stored
// as 3 with unit leading sizes; the backward's pooled input is its output.
PreparedNode prepare_adaptive(const Graph& g, const Node& node) {
  const bool backward = op_name(node) == "adaptive_avg_pool_backward";
  const Shape& x = shape_of(g, backward ? node.outputs[0] : node.inputs[0]);
  const Shape& y = shape_of(g, backward ? node.inputs[0] : node.outputs[0]);
  auto s = std::make_shared<AdaptivePoolShape>();
  s->planes = x[0] * x[1];
  const int nd = static_cast<int>(x.size()) - 2;
  for (int i = 0; i < nd; ++i) {
    s->in[3 - nd + i] = x[2 + i];
    s->out[3 - nd + i] = y[2 + i];
  }
  return with_state(std::move(s));
}

void adaptive_kernel(const KernelArgs& a) {
  adaptive_avg_pool_forward(in_f(a, 0), out_f(a), state_of<AdaptivePoolShape>(a), stream_of(a));
}

void adaptive_backward_kernel(const KernelArgs& a) {
  adaptive_avg_pool_backward(in_f(a, 0), out_f(a), state_of<AdaptivePoolShape>(a), stream_of(a));
}

// ---- upsample2d: x (N, C, H, W) -> (N, C, size); the backward's x is its output. The taps live in
// the workspace. The device kernels compute nearest and bilinear; a device plan refuses the other modes.
bool accepts_upsample(const Graph& g, const Node& node) {
  const std::string& mode = node.attrs.s("mode");
  return float32_node(g, node) && (mode == "nearest" || mode == "bilinear");
}

PreparedNode prepare_upsample(const Graph& g, const Node& node) {
  const bool backward = op_name(node) == "upsample2d_backward";
  const Shape& x = shape_of(g, backward ? node.outputs[0] : node.inputs[0]);
  const Shape& size = node.attrs.ints("size");
  auto s = std::make_shared<UpsampleShape>();
  s->planes = x[0] * x[1];
  s->in_h = x[2];
  s->in_w = x[3];
  s->out_h = size[0];
  s->out_w = size[1];
  s->bilinear = node.attrs.s("mode") == "bilinear";
  s->align_corners = node.attrs.i_or("align_corners", 0) != 0;
  s->scale_h = node.attrs.f_or("scale_h", 0.0);
  s->scale_w = node.attrs.f_or("scale_w", 0.0);
  const std::size_t ws = upsample_workspace_bytes(*s);
  return with_state(std::move(s), ws);
}

void upsample_kernel(const KernelArgs& a) {
  upsample2d_forward(in_f(a, 0), out_f(a), state_of<UpsampleShape>(a), a.workspace, stream_of(a));
}

void upsample_backward_kernel(const KernelArgs& a) {
  upsample2d_backward(in_f(a, 0), out_f(a), state_of<UpsampleShape>(a), a.workspace, stream_of(a));
}

// ---- output_transform: (x, scale, shift) -> y; backward (dy, x, scale, shift) -> (dx, dscale, dshift)
bool accepts_output_transform(const Graph& g, const Node& node) {
  return float32_node(g, node) && node.attrs.ints("activations").size() <= kMaxOutputActivations;
}

PreparedNode prepare_output_transform(const Graph& g, const Node& node) {
  const int k = op_name(node) == "output_transform" ? 0 : 1;  // x's position
  const Shape& x = shape_of(g, node.inputs[k]);
  auto s = std::make_shared<OutputTransformShape>();
  s->d = x.back();
  s->rows = shape_numel(x) / s->d;
  s->scale_len = shape_numel(shape_of(g, node.inputs[k + 1]));
  s->shift_len = shape_numel(shape_of(g, node.inputs[k + 2]));
  const std::vector<int64_t>& acts = node.attrs.ints("activations");
  s->num_acts = static_cast<int>(acts.size());
  for (std::size_t j = 0; j < acts.size(); ++j) s->acts[j] = static_cast<int8_t>(acts[j]);
  return with_state(std::move(s));
}

void output_transform_kernel(const KernelArgs& a) {
  output_transform_forward(in_f(a, 0), in_f(a, 1), in_f(a, 2), out_f(a), state_of<OutputTransformShape>(a),
                           stream_of(a));
}

void output_transform_backward_kernel(const KernelArgs& a) {
  output_transform_backward(in_f(a, 0), in_f(a, 1), in_f(a, 2), out_f(a, 0), out_f(a, 1), out_f(a, 2),
                            state_of<OutputTransformShape>(a), stream_of(a));
}

}  // namespace

std::vector<OpEntry> shape_op_entries() {
  return {
      {"slice", accepts_copy, prepare_axis_view, slice_kernel},
      {"slice_backward", accepts_copy, prepare_axis_view, slice_backward_kernel},
      {"concat", accepts_copy, prepare_axis_view, concat_kernel},
      {"permute", accepts_permute, prepare_permute, permute_kernel},
      {"causal_mask", accepts_causal_mask, nullptr, causal_mask_kernel},
      {"bmm", float32_node, prepare_bmm, bmm_kernel, false},
      {"embedding", accepts_embedding, nullptr, embedding_kernel},
      {"embedding_backward", accepts_embedding, prepare_embedding_backward, embedding_backward_kernel},
      {"adaptive_avg_pool", float32_node, prepare_adaptive, adaptive_kernel},
      {"adaptive_avg_pool_backward", float32_node, prepare_adaptive, adaptive_backward_kernel},
      {"upsample2d", accepts_upsample, prepare_upsample, upsample_kernel},
      {"upsample2d_backward", accepts_upsample, prepare_upsample, upsample_backward_kernel},
      {"output_transform", accepts_output_transform, prepare_output_transform, output_transform_kernel},
      {"output_transform_backward", accepts_output_transform, prepare_output_transform,
       output_transform_backward_kernel},
  };
}

}  // namespace treadle::cuda
