#include "backends/onednn/conv_layouts.hpp"

#include <array>

#include "treadle/error.hpp"

namespace treadle::onednn {
namespace {

constexpr std::size_t kAlign = 64;
constexpr int kMaxStepArgs = 8;

}  // namespace

std::size_t aligned_bytes(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

namespace {

Step step_of(dnnl::primitive prim, const dnnl::primitive_desc_base& pd, std::vector<int> args) {
  Step s;
  s.prim = std::move(prim);
  for (int arg : args) s.mds.push_back(pd.query_md(dnnl::query::exec_arg_md, arg));
  s.args = std::move(args);
  s.scratch_md = pd.scratchpad_desc();
  s.scratch_bytes = s.scratch_md.get_size();
  if (static_cast<int>(s.args.size()) + 1 > kMaxStepArgs) throw_runtime_error("onednn: too many primitive arguments");
  return s;
}

}  // namespace

Step make_step(const dnnl::primitive_desc& pd, std::vector<int> args) {
  return step_of(dnnl::primitive(pd), pd, std::move(args));
}

void run_step(const Step& s, std::initializer_list<void*> ptrs, void* scratch) {
  const int n = static_cast<int>(s.args.size());
  if (static_cast<int>(ptrs.size()) != n) throw_runtime_error("onednn: step given ", ptrs.size(), " pointers, needs ", n);
  const int total = s.scratch_bytes ? n + 1 : n;
  std::array<int, kMaxStepArgs> ids;
  std::array<const MemDesc*, kMaxStepArgs> mds;
  std::array<void*, kMaxStepArgs> data;
  for (int k = 0; k < total; ++k) {
    ids[k] = k < n ? s.args[k] : DNNL_ARG_SCRATCHPAD;
    mds[k] = k < n ? &s.mds[k] : &s.scratch_md;
    data[k] = k < n ? *(ptrs.begin() + k) : scratch;
  }
  execute_pooled(s.prim, *s.pool, total, ids.data(), mds.data(), data.data());
}

Staged make_staged(const MemDesc& plain, const MemDesc& blocked, bool to_blocked) {
  Staged t;
  t.plain = plain;
  t.blocked = blocked;
  if (plain == blocked) return t;
  const MemDesc& from = to_blocked ? plain : blocked;
  const MemDesc& to = to_blocked ? blocked : plain;
  const dnnl::reorder::primitive_desc pd(cpu_engine(), from, cpu_engine(), to, default_attr());
  t.reorder = step_of(dnnl::reorder(pd), pd, {DNNL_ARG_FROM, DNNL_ARG_TO});
  t.bytes = blocked.get_size();
  return t;
}

void run_staged(const Staged& t, const void* from, void* to, void* scratch) {
  if (!t.in_place()) run_step(t.reorder, {const_cast<void*>(from), to}, scratch);
}

std::size_t max_scratch(std::initializer_list<const Step*> steps) {
  std::size_t bytes = 0;
  for (const Step* s : steps)
    if (s->defined()) bytes = std::max(bytes, s->scratch_bytes);
  return bytes;
}

}  // namespace treadle::onednn
