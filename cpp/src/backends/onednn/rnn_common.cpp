#include "backends/onednn/rnn_common.hpp"

namespace treadle::onednn::rnn_common {

using dnnl::memory;

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
