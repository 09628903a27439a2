#pragma once
// Shared machinery of the oneDNN backend.
//
// Threads: the oneDNN wheel uses the OpenMP runtime (libgomp). Every oneDNN call (primitive
// creation as well as execution: implementations size their thread partitioning at creation) runs
// under OmpSingleThread, which sets the calling thread's OpenMP thread count to 1 and restores it,
// so libgomp never starts a worker. Parallelism comes only from the host's executor: a node's work
// is split into fixed chunks (rows, batch entries, elements), each one single-threaded oneDNN
// execution. Chunk sizes depend on the problem only, never on the workers, so results do not
// depend on how the executor chunks.
//
// State: a node's primitives are built once when the plan is finalized (Backend::prepare) and are
// immutable afterwards. They use the user scratchpad mode, with one scratch region per chunk in the
// plan's workspace, so that several contexts (threads) can execute them at the same time.
#include <dnnl.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/kernel.hpp"

namespace treadle::onednn {

// Sets the calling thread's OpenMP thread count to 1 for its lifetime.
class OmpSingleThread {
 public:
  OmpSingleThread();
  ~OmpSingleThread();
  OmpSingleThread(const OmpSingleThread&) = delete;
  OmpSingleThread& operator=(const OmpSingleThread&) = delete;

 private:
  int previous_;
};

const dnnl::engine& cpu_engine();

using Dims = dnnl::memory::dims;
using MemDesc = dnnl::memory::desc;

// A plain float32 memory descriptor with explicit strides (elements).
MemDesc f32_desc(const Dims& dims, const Dims& strides);
// A dense row-major float32 memory descriptor.
MemDesc f32_dense(const Dims& dims);

// Attributes every primitive of this backend is created with (user-managed scratchpad).
dnnl::primitive_attr default_attr();

// True when oneDNN chose an optimised implementation (not a reference one, which Eigen beats).
bool is_optimised(const dnnl::primitive_desc_base& pd);

// Where one primitive argument's memory comes from: operand `index` of the node (an input, or an
// output when `output`), advanced by `step_bytes` per chunk item.
struct ArgSpec {
  int arg = 0;  // DNNL_ARG_*
  bool output = false;
  int index = 0;
  int64_t step_bytes = 0;  // advance of the data pointer per chunk item
};

// Memory objects for executions of one primitive, kept across steps: creating them costs about a
// microsecond (aligned allocations inside oneDNN), as much as a small product. Each execution takes
// a free slot and points its memories at the step's data; executions running at the same time
// (chunks on several workers, contexts on several threads) take different slots. The slots are the
// only mutable part of a prepared node, and they are synchronised.
class MemoryPool {
 public:
  static constexpr int kSlots = 32;
  struct Slot {
    std::atomic<bool> busy{false};
    std::vector<dnnl::memory> mems;  // created on first use: one per ArgSpec, then the scratchpad
  };
  Slot* acquire();  // nullptr when every slot is busy (the caller then makes temporary memories)
  static void release(Slot* s) { s->busy.store(false, std::memory_order_release); }

 private:
  std::array<Slot, kSlots> slots_;
};

// One primitive for one chunk size, with the memory descriptor of each ArgSpec.
struct Variant {
  dnnl::primitive prim;
  std::vector<MemDesc> mds;
  MemDesc scratch_md;
  std::size_t scratch_bytes = 0;
  std::unique_ptr<MemoryPool> pool = std::make_unique<MemoryPool>();
};

// The prepared state of a node: `items` split into chunks of `grain`; `full` runs a whole chunk,
// `tail` the remainder (when items % grain != 0).
struct ChunkedPrimitive {
  std::vector<ArgSpec> args;
  int64_t items = 0, grain = 0;
  Variant full, tail;
  std::size_t scratch_stride = 0;  // bytes of workspace per chunk
  int64_t num_chunks() const { return (items + grain - 1) / grain; }
};

// What an op's builder returns: primitive descriptors for a chunk of `grain` items and for the
// tail (empty when the split is exact), in the order of `args`.
struct ChunkPlan {
  std::vector<ArgSpec> args;
  int64_t items = 0, grain = 0;
  dnnl::primitive_desc full, tail;
};

// Runs make() -> primitive_desc; std::nullopt when oneDNN has no implementation for it.
template <typename F>
std::optional<dnnl::primitive_desc> try_pd(F&& make) {
  try {
    return make();
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

// Builds the descriptors for a chunk of `n` items; std::nullopt when oneDNN has no optimised
// implementation. Called under OmpSingleThread.
template <typename F>
std::optional<ChunkPlan> plan_chunks(std::vector<ArgSpec> args, int64_t items, int64_t grain, F&& make_pd) {
  if (items <= 0 || grain <= 0) return std::nullopt;
  ChunkPlan p{std::move(args), items, std::min(grain, items), {}, {}};
  std::optional<dnnl::primitive_desc> full = make_pd(p.grain);
  if (!full || !is_optimised(*full)) return std::nullopt;
  p.full = *full;
  if (const int64_t rest = items % p.grain) {
    std::optional<dnnl::primitive_desc> tail = make_pd(rest);
    if (!tail || !is_optimised(*tail)) return std::nullopt;
    p.tail = *tail;
  }
  return p;
}

// Creates the primitives of a plan (JIT code generation happens here, once per plan).
PreparedNode make_prepared(const ChunkPlan& plan);

// The kernel every oneDNN node runs: its chunks on the host's executor.
void run_chunked(const KernelArgs& a);

// Rounds `n` up to a multiple of `m`.
inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Each op family: whether it takes the node (returns the plan of its chunks) and its state.
using PlanFn = std::optional<ChunkPlan> (*)(const Graph& g, const Node& node);
struct OpEntry {
  std::string op;
  PlanFn plan;
};
std::vector<OpEntry> matmul_entries();
std::vector<OpEntry> eltwise_entries();
std::vector<OpEntry> softmax_entries();

// Shape and dtype of a node's operands.
inline const Shape& in_shape(const Graph& g, const Node& n, int i) { return g.info(n.inputs.at(i)).shape; }
inline const Shape& out_shape(const Graph& g, const Node& n, int i) { return g.info(n.outputs.at(i)).shape; }
bool all_f32(const Graph& g, const Node& n);
const std::string& op_name(const Node& n);

}  // namespace treadle::onednn
