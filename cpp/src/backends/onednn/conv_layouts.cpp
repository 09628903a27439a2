#include "backends/onednn/conv_layouts.hpp"

#include <array>

#include "treadle/error.hpp"

namespace treadle::onednn {
namespace {

constexpr std::size_t kAlign = 64;
constexpr int kMaxStepArgs = 8;

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) throw_runtime_error("onednn: ", what, " failed (status ", static_cast<int>(status), ")");
}

// The calling thread's stream, created once per host thread (a CPU stream carries no data).
dnnl_stream_t step_stream() {
  thread_local const dnnl::stream stream(cpu_engine());
  return stream.get();
}

// Memory objects for one execution when every pooled slot is busy (they allocate; rare).
class TempMemories {
 public:
  ~TempMemories() {
    for (int k = 0; k < n_; ++k) dnnl_memory_destroy(args_[k].memory);
  }
  void add(int arg, const MemDesc& md, void* ptr) {
    dnnl_memory_t m = nullptr;
    check(dnnl_memory_create(&m, md.get(), cpu_engine().get(), ptr), "memory creation");
    args_[n_++] = {arg, m};
  }
  int size() const { return n_; }
  const dnnl_exec_arg_t* data() const { return args_.data(); }

 private:
  std::array<dnnl_exec_arg_t, kMaxStepArgs> args_{};
  int n_ = 0;
};

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
  auto arg_of = [&](int k) { return k < n ? s.args[k] : DNNL_ARG_SCRATCHPAD; };
  auto md_of = [&](int k) -> const MemDesc& { return k < n ? s.mds[k] : s.scratch_md; };
  auto ptr_of = [&](int k) { return k < n ? *(ptrs.begin() + k) : scratch; };
  OmpSingleThread guard;
  MemoryPool::Slot* slot = s.pool->acquire();
  if (!slot) {
    TempMemories mem;
    for (int k = 0; k < total; ++k) mem.add(arg_of(k), md_of(k), ptr_of(k));
    check(dnnl_primitive_execute(s.prim.get(), step_stream(), mem.size(), mem.data()), "primitive execution");
    return;
  }
  struct Release {
    MemoryPool::Slot* slot;
    ~Release() { MemoryPool::release(slot); }
  } release{slot};
  if (slot->mems.empty())
    for (int k = 0; k < total; ++k)
      slot->mems.emplace_back(md_of(k), cpu_engine(), static_cast<void*>(DNNL_MEMORY_NONE));
  std::array<dnnl_exec_arg_t, kMaxStepArgs> args;
  for (int k = 0; k < total; ++k) {
    check(dnnl_memory_set_data_handle(slot->mems[k].get(), ptr_of(k)), "setting a data pointer");
    args[k] = {arg_of(k), slot->mems[k].get()};
  }
  check(dnnl_primitive_execute(s.prim.get(), step_stream(), total, args.data()), "primitive execution");
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
