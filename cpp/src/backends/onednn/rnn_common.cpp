#include "backends/onednn/rnn_common.hpp"

namespace treadle::onednn::rnn_common {

using dnnl::memory;

rnn::Cell cell_of(const Node& node) {
  return op_name(node).rfind("gru_layer", 0) == 0 ? rnn::Cell::gru : rnn::Cell::lstm;
}

std::optional<Layer> layer_of_node(const Graph& g, const Node& node, bool backward) {
  const rnn::Cell cell = cell_of(node);
  const rnn::CellInfo ci = rnn::cell_info(cell);
  const int num_in = static_cast<int>(node.inputs.size());
  int w_hh = 0, lengths = -1;
  bool valid = false;
  if (backward) {
    const rnn::BackwardSlots s = rnn::backward_slots(ci, num_in);
    valid = s.valid, w_hh = s.w_hh, lengths = s.lengths;
  } else {
    const rnn::ForwardSlots s = rnn::forward_slots(ci, num_in);
    valid = s.valid, w_hh = s.w_hh, lengths = s.lengths;
  }
  if (!valid || lengths >= 0 || !all_f32(g, node)) return std::nullopt;
  Layer l;
  l.cell = cell;
  l.G = ci.gates;
  l.batch_first = node.attrs.i_or("batch_first", 0) != 0;
  l.reverse = node.attrs.i_or("reverse", 0) != 0;
  const Shape& x = in_shape(g, node, 0);  // x is the first input of both ops
  l.T = l.batch_first ? x[1] : x[0];
  l.N = l.batch_first ? x[0] : x[1];
  l.I = x[2];
  l.H = in_shape(g, node, w_hh)[1];
  return l;
}

PooledPrimitive make_pooled(const dnnl::primitive_desc_base& pd, std::vector<int> args) {
  PooledPrimitive p;
  p.prim = dnnl::primitive(pd.get());
  for (int arg : args) p.mds.push_back(pd.query_md(dnnl::query::exec_arg_md, arg));
  p.scratch_bytes = pd.scratchpad_desc().get_size();
  if (p.scratch_bytes) {
    args.push_back(DNNL_ARG_SCRATCHPAD);
    p.mds.push_back(pd.scratchpad_desc());
  }
  p.args = std::move(args);
  return p;
}

void run_pooled(const PooledPrimitive& p, void* const* ptrs) {
  const int n = static_cast<int>(p.args.size());
  std::array<const MemDesc*, kMaxArgs> mds{};
  for (int k = 0; k < n; ++k) mds[k] = &p.mds[k];
  execute_pooled(p.prim, *p.pool, n, p.args.data(), mds.data(), ptrs);
}

namespace {
MemDesc ldgoi(const MemDesc& like, int64_t rows, int gates) {
  return MemDesc(Dims{1, 1, rows, gates, like.get_dims()[4]}, memory::data_type::f32, memory::format_tag::ldgoi);
}
}  // namespace

PooledPrimitive weight_reorder(const MemDesc& to, int64_t rows, int gates) {
  const dnnl::reorder::primitive_desc pd(cpu_engine(), ldgoi(to, rows, gates), cpu_engine(), to, default_attr());
  return make_pooled(pd, {DNNL_ARG_FROM, DNNL_ARG_TO});
}

PooledPrimitive weight_reorder_back(const MemDesc& from, int64_t rows, int gates) {
  const dnnl::reorder::primitive_desc pd(cpu_engine(), from, cpu_engine(), ldgoi(from, rows, gates), default_attr());
  return make_pooled(pd, {DNNL_ARG_FROM, DNNL_ARG_TO});
}

}  // namespace treadle::onednn::rnn_common
