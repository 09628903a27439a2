#include "backends/onednn/onednn_common.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "backends/eigen/transcendental.hpp"
#include "core/op_registry.hpp"
#include "ops/precision.hpp"
#include "treadle/error.hpp"

namespace treadle::onednn {

// omp_set_num_threads only changes the calling thread's ICV (libgomp gives a thread outside any
// parallel region its own implicit task on first write), so other host threads are unaffected.
OmpSingleThread::OmpSingleThread() : previous_(omp_get_max_threads()) {
  if (previous_ != 1) omp_set_num_threads(1);
}

OmpSingleThread::~OmpSingleThread() {
  if (previous_ != 1) omp_set_num_threads(previous_);
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine = [] {
    OmpSingleThread guard;
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

MemDesc plain_desc(const Dims& dims, const Dims& strides, dnnl::memory::data_type dt) {
  return MemDesc(dims, dt, strides);
}

MemDesc f32_desc(const Dims& dims, const Dims& strides) {
  return plain_desc(dims, strides, dnnl::memory::data_type::f32);
}

MemDesc f32_dense(const Dims& dims) {
  Dims strides(dims.size(), 1);
  for (int d = static_cast<int>(dims.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * dims[d + 1];
  return f32_desc(dims, strides);
}

dnnl::primitive_attr default_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

bool is_optimised(const dnnl::primitive_desc_base& pd) {
  const char* impl = pd.impl_info_str();
  const bool fast = impl && std::strncmp(impl, "ref", 3) != 0;
  if (!fast) note_cpu_decline(std::string("only oneDNN's reference kernel (") + (impl ? impl : "?") + ")");
  return fast;
}

bool wide_vectors() {
  static const bool wide = [] {
    switch (dnnl_get_effective_cpu_isa()) {
      case dnnl_cpu_isa_avx512_core:
      case dnnl_cpu_isa_avx512_core_vnni:
      case dnnl_cpu_isa_avx512_core_bf16:
      case dnnl_cpu_isa_avx512_core_fp16:
      case dnnl_cpu_isa_avx512_core_amx:
      case dnnl_cpu_isa_avx512_core_amx_fp16: return true;
      default: return false;
    }
  }();
  return wide;
}

bool avx2_kernels_lose(const char* what) {
  if (wide_vectors() || !size_thresholds_apply()) return false;
  note_cpu_decline(std::string("with AVX2 kernels oneDNN's ") + what + " is slower than Eigen's");
  return true;
}

void note_unimplemented(const dnnl::error& e) {
  if (e.status == dnnl_unimplemented) note_cpu_decline("no oneDNN kernel for this instruction set");
}

bool all_f32(const Graph& g, const Node& n) {
  for (int v : n.inputs)
    if (g.info(v).dtype != DType::f32) return false;
  for (int v : n.outputs)
    if (g.info(v).dtype != DType::f32) return false;
  return true;
}

const std::string& op_name(const Node& n) { return OpRegistry::instance().at(n.op).name; }

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) throw_runtime_error("onednn: ", what, " failed (status ", static_cast<int>(status), ")");
}

dnnl_stream_t thread_stream() {
  thread_local const dnnl::stream stream(cpu_engine());
  return stream.get();
}

void execute_pooled(const dnnl::primitive& prim, MemoryPool& pool, int n, const int* args,
                    const MemDesc* const* mds, void* const* ptrs) {
  if (n > kMaxArgs) throw_runtime_error("onednn: ", n, " primitive arguments, at most ", kMaxArgs);
  std::array<dnnl_exec_arg_t, kMaxArgs> exec{};
  std::array<dnnl_memory_t, kMaxArgs> temp{};
  MemoryPool::Slot* slot = pool.acquire();
  struct Cleanup {  // releases the slot, or destroys the temporary memories
    MemoryPool::Slot* slot;
    std::array<dnnl_memory_t, kMaxArgs>& temp;
    ~Cleanup() {
      if (slot) MemoryPool::release(slot);
      for (dnnl_memory_t m : temp)
        if (m) dnnl_memory_destroy(m);
    }
  } cleanup{slot, temp};
  for (int k = 0; k < n; ++k) {
    if (slot) {
      if (static_cast<int>(slot->mems.size()) == k)
        slot->mems.emplace_back(*mds[k], cpu_engine(), static_cast<void*>(DNNL_MEMORY_NONE));
      check(dnnl_memory_set_data_handle(slot->mems[k].get(), ptrs[k]), "setting a data pointer");
      exec[k] = {args[k], slot->mems[k].get()};
    } else {
      check(dnnl_memory_create(&temp[k], mds[k]->get(), cpu_engine().get(), ptrs[k]), "memory creation");
      exec[k] = {args[k], temp[k]};
    }
  }
  OmpSingleThread guard;
  check(dnnl_primitive_execute(prim.get(), thread_stream(), n, exec.data()), "primitive execution");
}

MemoryPool::Slot* MemoryPool::acquire() {
  for (Slot& s : slots_)
    if (!s.busy.load(std::memory_order_relaxed) && !s.busy.exchange(true, std::memory_order_acquire)) return &s;
  return nullptr;
}

namespace {

constexpr std::size_t kScratchAlign = 64;

Variant make_variant(const ChunkPlan& plan, const dnnl::primitive_desc& pd) {
  Variant v;
  v.prim = dnnl::primitive(pd);
  for (const ArgSpec& s : plan.args) v.mds.push_back(pd.query_md(dnnl::query::exec_arg_md, s.arg));
  v.scratch_md = pd.scratchpad_desc();
  v.scratch_bytes = v.scratch_md.get_size();
  return v;
}

// The tile at (row tile, column tile): its first row and column and the variant for its shape.
struct Tile {
  int64_t index, row0, col0;
  const Variant* variant;
};

Tile tile_at(const ChunkedPrimitive& s, int64_t t) {
  const Split& sp = s.split;
  const int64_t rt = t / sp.col_tiles(), ct = t % sp.col_tiles();
  const int64_t row0 = rt * sp.row_grain, col0 = ct * sp.col_grain;
  const bool row_rest = sp.rows - row0 < sp.row_grain, col_rest = sp.cols - col0 < sp.col_grain;
  return {t, row0, col0, &s.variants[row_rest][col_rest]};
}

// The data pointer of each argument (scratchpad last) for a tile; returns the count.
int tile_pointers(const KernelArgs& a, const ChunkedPrimitive& s, const Tile& t, std::array<void*, kMaxArgs>& ptrs) {
  const int n = static_cast<int>(s.args.size());
  for (int k = 0; k < n; ++k) {
    const ArgSpec& spec = s.args[k];
    const TensorRef& ref = spec.output ? a.out[spec.index] : a.in[spec.index];
    char* base = spec.staged >= 0 ? static_cast<char*>(a.workspace) + spec.staged : static_cast<char*>(ref.data);
    ptrs[k] = base + t.row0 * spec.row_step + t.col0 * spec.col_step;
  }
  if (!t.variant->scratch_bytes) return n;
  ptrs[n] = static_cast<char*>(a.workspace) + s.staging_bytes + t.index * static_cast<int64_t>(s.scratch_stride);
  return n + 1;
}

// Applies the node's TileActivation to the tile just written at `y`: one pass when its rows are
// contiguous, else row by row.
void activate_tile(const ChunkedPrimitive& s, const Tile& t, float* y) {
  const Split& sp = s.split;
  const int64_t rows = std::min(sp.row_grain, sp.rows - t.row0), cols = std::min(sp.col_grain, sp.cols - t.col0);
  const int64_t stride = s.args[s.activation.arg].row_step / static_cast<int64_t>(sizeof(float));
  auto apply = [&](float* p, int64_t n) {
    if (s.activation.kind == TileActivation::Kind::tanh) eigen::tanh_to(p, p, n);
    else eigen::sigmoid_to(p, p, n);
  };
  if (stride == cols) {
    apply(y, rows * cols);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) apply(y + r * stride, cols);
}

}  // namespace

void run_tile(const KernelArgs& a, const ChunkedPrimitive& s, int64_t index, void* const* overrides) {
  const Tile t = tile_at(s, index);
  const Variant& v = *t.variant;
  std::array<void*, kMaxArgs> ptrs;
  const int n = tile_pointers(a, s, t, ptrs);
  if (overrides)
    for (int k = 0; k < n; ++k)
      if (overrides[k]) ptrs[k] = overrides[k];
  const int na = static_cast<int>(s.args.size());
  std::array<int, kMaxArgs> ids;
  std::array<const MemDesc*, kMaxArgs> mds;
  for (int k = 0; k < n; ++k) {
    ids[k] = k < na ? s.args[k].arg : DNNL_ARG_SCRATCHPAD;
    mds[k] = k < na ? &v.mds[k] : &v.scratch_md;
  }
  execute_pooled(v.prim, *v.pool, n, ids.data(), mds.data(), ptrs.data());
  if (s.activation.kind != TileActivation::Kind::none) activate_tile(s, t, static_cast<float*>(ptrs[s.activation.arg]));
}

PreparedNode make_prepared(const ChunkPlan& plan) {
  OmpSingleThread guard;
  auto state = std::make_shared<ChunkedPrimitive>();
  state->args = plan.args;
  state->staging = plan.staging;
  state->staging_bytes = plan.staging_bytes;
  state->split = plan.split;
  state->activation = plan.activation;
  std::size_t scratch = 0;
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c)
      if (plan.pds[r][c]) {
        state->variants[r][c] = make_variant(plan, plan.pds[r][c]);
        scratch = std::max(scratch, state->variants[r][c].scratch_bytes);
      }
  state->scratch_stride = (scratch + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  const std::size_t workspace =
      state->staging_bytes + state->scratch_stride * static_cast<std::size_t>(state->split.tiles());
  return {std::move(state), workspace};
}

OpEntry chunked(const char* op, PlanFn plan) {
  OpEntry e;
  e.op = op;
  e.accepts = [plan](const Graph& g, const Node& node) { return plan(g, node).has_value(); };
  e.prepare = [plan](const Graph& g, const Node& node) {
    std::optional<ChunkPlan> p = plan(g, node);
    if (!p) throw_runtime_error("onednn: node ", op_name(node), " is no longer supported at prepare time");
    return make_prepared(*p);
  };
  e.kernel = &run_chunked;
  return e;
}

namespace {

constexpr int64_t kStagingGrain = 1 << 16;  // elements per conversion chunk

// Runs body(c0, c1) over `chunks` fixed chunks, on the host's workers where there are several.
template <typename Body>
void over_chunks(const KernelArgs& a, int64_t chunks, const Body& body) {
  if (chunks <= 1 || a.exec.num_workers() <= 1) {
    body(int64_t{0}, chunks);
    return;
  }
  const auto* b = &body;
  a.exec.parallel_for(chunks, [b](int64_t c0, int64_t c1) { (*b)(c0, c1); });
}

// Copies (converts to bf16, or pads the rows of) the staged inputs in fixed chunks (results never
// depend on the executor), before any tile reads them.
void stage_inputs(const KernelArgs& a, const ChunkedPrimitive& s) {
  for (const Staging& st : s.staging) {
    const float* src = a.in[st.input].ptr<float>();
    char* to = static_cast<char*>(a.workspace) + st.offset;
    if (st.padded_cols > 0) {
      auto* dst = reinterpret_cast<float*>(to);
      const int64_t grain = std::max<int64_t>(1, kStagingGrain / std::max<int64_t>(1, st.cols));
      over_chunks(a, (st.rows + grain - 1) / grain, [&](int64_t c0, int64_t c1) {
        for (int64_t r = c0 * grain; r < std::min(st.rows, c1 * grain); ++r)
          std::memcpy(dst + r * st.padded_cols, src + r * st.cols, static_cast<std::size_t>(st.cols) * sizeof(float));
      });
      continue;
    }
    auto* dst = reinterpret_cast<uint16_t*>(to);
    over_chunks(a, (st.numel + kStagingGrain - 1) / kStagingGrain, [&](int64_t c0, int64_t c1) {
      const int64_t i0 = c0 * kStagingGrain, i1 = std::min(st.numel, c1 * kStagingGrain);
      convert_to_bf16(src + i0, dst + i0, i1 - i0);
    });
  }
}

}  // namespace

void run_chunked(const KernelArgs& a) {
  const auto& s = *static_cast<const ChunkedPrimitive*>(a.state);
  if (!s.staging.empty()) stage_inputs(a, s);
  const int64_t tiles = s.split.tiles();
  if (tiles <= 1 || a.exec.num_workers() <= 1) {
    for (int64_t t = 0; t < tiles; ++t) run_tile(a, s, t);
    return;
  }
  // One captured pointer keeps the std::function inside its small buffer: no allocation per call.
  struct Job {
    const KernelArgs& a;
    const ChunkedPrimitive& s;
  } job{a, s};
  const Job* j = &job;
  a.exec.parallel_for(tiles, [j](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) run_tile(j->a, j->s, t);
  });
}

}  // namespace treadle::onednn
