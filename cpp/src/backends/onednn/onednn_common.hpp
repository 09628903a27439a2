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

// A plain memory descriptor with explicit strides (elements).
MemDesc plain_desc(const Dims& dims, const Dims& strides, dnnl::memory::data_type dt);
// A plain float32 memory descriptor with explicit strides (elements).
MemDesc f32_desc(const Dims& dims, const Dims& strides);
// A dense row-major float32 memory descriptor.
MemDesc f32_dense(const Dims& dims);

// Attributes every primitive of this backend is created with (user-managed scratchpad).
dnnl::primitive_attr default_attr();

// True when oneDNN chose an optimised implementation (not a reference one, which Eigen beats);
// false notes a CPU decline (backends/kernel.hpp): which kernels oneDNN has depends on the ISA.
bool is_optimised(const dnnl::primitive_desc_base& pd);
// A primitive oneDNN could not create for want of an implementation: a CPU decline as well.
void note_unimplemented(const dnnl::error& e);
// Whether oneDNN runs AVX-512 (or AMX) kernels on this CPU. Where a crossover with Eigen measured
// with those differs from the one measured with AVX2 kernels, a size threshold asks this.
bool wide_vectors();
// True where oneDNN runs only its AVX2 kernels and `what` was measured slower there than Eigen's,
// noting the CPU decline (the plan names it); false with AVX-512 kernels, and when the caller asked
// for every kernel regardless of speed (size_thresholds_apply() false: all_kernels in the tests).
bool avx2_kernels_lose(const char* what);

// How a node's work is tiled: a rows x cols grid of items in tiles of row_grain x col_grain (work
// split along one dimension only has cols = 1). Grains depend on the problem only.
struct Split {
  int64_t rows = 0, cols = 1, row_grain = 1, col_grain = 1;
  int64_t row_tiles() const { return (rows + row_grain - 1) / row_grain; }
  int64_t col_tiles() const { return (cols + col_grain - 1) / col_grain; }
  int64_t tiles() const { return row_tiles() * col_tiles(); }
};

// Where one primitive argument's memory comes from: operand `index` of the node (an input, or an
// output when `output`), or the staged copy at byte `staged` of the workspace when that is >= 0;
// advanced by `row_step` bytes per row item and `col_step` per column item.
struct ArgSpec {
  int arg = 0;  // DNNL_ARG_*
  bool output = false;
  int index = 0;
  int64_t row_step = 0;
  int64_t col_step = 0;
  int64_t staged = -1;
};

// An input copied into the workspace (at byte `offset`) before the node's tiles run, split in fixed
// chunks: converted to bf16 in the same layout (bf16 compute, ops/precision.hpp), or, where
// `padded_cols` > 0, a float32 matrix of `rows` x `cols` copied row by row with rows `padded_cols`
// apart (a leading dimension oneDNN's kernels read faster, matmul_kernels.cpp).
struct Staging {
  int input = 0;
  int64_t numel = 0;
  int64_t offset = 0;
  int64_t rows = 0, cols = 0, padded_cols = 0;
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

// Most arguments one execution passes (lstm backward: 19 and the scratchpad).
inline constexpr int kMaxArgs = 20;

// Throws a runtime error naming `what` when a oneDNN C call failed.
void check(dnnl_status_t status, const char* what);

// The calling thread's stream, created once per host thread (a CPU stream carries no data).
dnnl_stream_t thread_stream();

// Executes `prim` on the calling thread's stream, under OmpSingleThread, with n <= kMaxArgs
// arguments: ids `args`, descriptors `*mds[k]`, data `ptrs`. The memory objects come from a free slot
// of `pool` (created on first use, in argument order); with every slot busy it makes temporary ones
// (descriptors are passed by pointer: a default-constructed dnnl::memory::desc allocates).
void execute_pooled(const dnnl::primitive& prim, MemoryPool& pool, int n, const int* args,
                    const MemDesc* const* mds, void* const* ptrs);

// An activation treadle applies to each output tile right after oneDNN wrote it (still in cache),
// with the Eigen backend's float functions (backends/eigen/transcendental.hpp): tanh and sigmoid,
// which oneDNN's eltwise post-ops compute several times slower on some instruction sets (AVX2:
// ~5 ns per element for tanh against ~1, measured) and which thus match the Eigen backend's.
// `arg` is the output's index in ChunkPlan::args (a row-major float32 matrix of tiles).
struct TileActivation {
  enum class Kind { none, tanh, sigmoid } kind = Kind::none;
  int arg = -1;
};

// One primitive for one tile shape, with the memory descriptor of each ArgSpec.
struct Variant {
  dnnl::primitive prim;
  std::vector<MemDesc> mds;
  MemDesc scratch_md;
  std::size_t scratch_bytes = 0;
  std::unique_ptr<MemoryPool> pool = std::make_unique<MemoryPool>();
};

// The prepared state of a node. variants[r][c] runs a tile that is a row remainder (r = 1) or a
// full row tile (r = 0), and likewise for columns; remainders exist only where the split is not
// exact.
struct ChunkedPrimitive {
  std::vector<ArgSpec> args;
  std::vector<Staging> staging;
  std::size_t staging_bytes = 0;   // the staged copies come first in the workspace, tile scratch after
  Split split;
  Variant variants[2][2];
  std::size_t scratch_stride = 0;  // bytes of workspace per tile
  TileActivation activation;
};

// What an op's builder returns: the split and the primitive descriptor of each tile shape, with
// arguments in the order of `args`.
struct ChunkPlan {
  std::vector<ArgSpec> args;
  Split split;
  dnnl::primitive_desc pds[2][2];
  std::vector<Staging> staging;
  std::size_t staging_bytes = 0;
  TileActivation activation;
};

// Runs make() -> primitive_desc; std::nullopt when oneDNN has no implementation for it.
template <typename F>
std::optional<dnnl::primitive_desc> try_pd(F&& make) {
  try {
    return make();
  } catch (const dnnl::error& e) {
    note_unimplemented(e);
    return std::nullopt;
  }
}

// Builds the descriptors for every tile shape of `split` with make_pd(rows, cols); std::nullopt
// when oneDNN has no optimised implementation for one of them. Called under OmpSingleThread.
template <typename F>
std::optional<ChunkPlan> plan_chunks(std::vector<ArgSpec> args, Split split, F&& make_pd) {
  if (split.rows <= 0 || split.cols <= 0 || split.row_grain <= 0 || split.col_grain <= 0) return std::nullopt;
  split.row_grain = std::min(split.row_grain, split.rows);
  split.col_grain = std::min(split.col_grain, split.cols);
  ChunkPlan p{std::move(args), split, {}, {}, 0, {}};
  const int64_t row_sizes[2] = {split.row_grain, split.rows % split.row_grain};
  const int64_t col_sizes[2] = {split.col_grain, split.cols % split.col_grain};
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c) {
      if (row_sizes[r] == 0 || col_sizes[c] == 0) continue;
      std::optional<dnnl::primitive_desc> pd = make_pd(row_sizes[r], col_sizes[c]);
      if (!pd || !is_optimised(*pd)) return std::nullopt;
      p.pds[r][c] = *pd;
    }
  return p;
}

// The 1-D form: `items` in chunks of `grain`, make_pd(items_in_chunk).
template <typename F>
std::optional<ChunkPlan> plan_chunks(std::vector<ArgSpec> args, int64_t items, int64_t grain, F&& make_pd) {
  return plan_chunks(std::move(args), Split{items, 1, grain, 1}, [&](int64_t n, int64_t) { return make_pd(n); });
}

// Creates the primitives of a plan (JIT code generation happens here, once per plan).
PreparedNode make_prepared(const ChunkPlan& plan);

// The kernel every oneDNN node runs: its chunks on the host's executor.
void run_chunked(const KernelArgs& a);

// One tile of a prepared node, as run_chunked runs it, for families whose kernels add their own
// steps around each tile (statistics converted after it, partial sums per tile). `overrides`, when
// given, holds one pointer per ArgSpec and then one for the scratchpad; a non-null one replaces that
// argument's pointer.
void run_tile(const KernelArgs& a, const ChunkedPrimitive& s, int64_t index, void* const* overrides = nullptr);

// The scratchpad region of tile `region` in the node's workspace (nullptr when there is none).
inline void* tile_scratch(const KernelArgs& a, const ChunkedPrimitive& s, int64_t region) {
  if (!s.scratch_stride) return nullptr;
  return static_cast<char*>(a.workspace) + s.staging_bytes + region * static_cast<int64_t>(s.scratch_stride);
}

// Runs piece(tile, region) for every tile, on the executor when it has workers. `region` is the first
// tile of the range that runs it: the tiles of one range run one after another and can share that
// tile's scratchpad, which stays in cache (a region per tile cycles through memory: 300 KB per
// pooling tile made a 32-tile node 2x slower). Concurrent ranges start at different tiles.
template <typename F>
void for_each_tile(const KernelArgs& a, const ChunkedPrimitive& s, const F& piece) {
  const int64_t tiles = s.split.tiles();
  if (tiles <= 1 || a.exec.num_workers() <= 1) {
    for (int64_t t = 0; t < tiles; ++t) piece(t, int64_t{0});
    return;
  }
  const F* fp = &piece;  // one captured pointer: the std::function needs no allocation
  a.exec.parallel_for(tiles, [fp](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) (*fp)(t, t0);
  });
}

// Rounds `n` up to a multiple of `m`.
inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Each op family gives its OpEntry list (backends/kernel.hpp), float32: accepts and prepare run
// under OmpSingleThread. A chunked family has the plan of its chunks (one primitive per chunk, run by
// run_chunked) and makes its entries with chunked(op, plan). A family whose chunks chain several
// primitives (reorders into blocked layouts, reductions of partial results) gives its own accepts /
// prepare / kernel; one with several kernels for an op gives `choose`.
using PlanFn = std::optional<ChunkPlan> (*)(const Graph& g, const Node& node);
OpEntry chunked(const char* op, PlanFn plan);
std::vector<OpEntry> matmul_entries();
std::vector<OpEntry> eltwise_entries();
std::vector<OpEntry> softmax_entries();
std::vector<OpEntry> conv_entries();
std::vector<OpEntry> norm_entries();
std::vector<OpEntry> pool_entries();
std::vector<OpEntry> rnn_entries();

// Shape and dtype of a node's operands.
inline const Shape& in_shape(const Graph& g, const Node& n, int i) { return g.info(n.inputs.at(i)).shape; }
inline const Shape& out_shape(const Graph& g, const Node& n, int i) { return g.info(n.outputs.at(i)).shape; }
bool all_f32(const Graph& g, const Node& n);
const std::string& op_name(const Node& n);

}  // namespace treadle::onednn
