#pragma once
// Building blocks for op families that chain several oneDNN primitives inside one piece of work
// (convolutions in blocked layouts: reorder in, compute, reorder out). A Step is one primitive
// with the descriptors of its arguments and a pool of memory objects, so that executing it
// allocates nothing in treadle's code after warm-up; a Staged tensor is a plain tensor together
// with the layout oneDNN chose for it and the reorder between the two (none when they coincide).
// Everything here is created at plan time and immutable afterwards, apart from the synchronised
// memory pools.
#include <initializer_list>

#include "backends/onednn/onednn_common.hpp"

namespace treadle::onednn {

// Bytes rounded up to the alignment of every buffer carved from a workspace.
std::size_t aligned_bytes(std::size_t bytes);

struct Step {
  dnnl::primitive prim;
  std::vector<int> args;  // DNNL_ARG_* in the order run_step takes pointers (scratchpad not included)
  std::vector<MemDesc> mds;
  MemDesc scratch_md;
  std::size_t scratch_bytes = 0;
  std::unique_ptr<MemoryPool> pool = std::make_unique<MemoryPool>();

  bool defined() const { return static_cast<bool>(prim); }
};

// Creates the primitive of `pd` (JIT code generation happens here); call under OmpSingleThread.
Step make_step(const dnnl::primitive_desc& pd, std::vector<int> args);

// Executes a step on the calling thread (under OmpSingleThread) with one data pointer per argument
// and the step's scratchpad at `scratch` (at least scratch_bytes, unused when that is 0).
void run_step(const Step& s, std::initializer_list<void*> ptrs, void* scratch);

// A tensor in treadle's plain layout and in the layout a primitive wants. `reorder` converts in the
// direction given at creation; it is undefined when both layouts are the same (the primitive then
// reads or writes the plain tensor in place).
struct Staged {
  MemDesc plain, blocked;
  Step reorder;
  std::size_t bytes = 0;  // of the blocked copy (0 when none is needed)

  bool in_place() const { return !reorder.defined(); }
};

// `to_blocked`: plain -> blocked (an input), else blocked -> plain (an output).
Staged make_staged(const MemDesc& plain, const MemDesc& blocked, bool to_blocked);

// Runs the reorder of `t` (from -> to) unless the tensor is used in place.
void run_staged(const Staged& t, const void* from, void* to, void* scratch);

// The largest scratchpad among steps that run one after the other in the same piece.
std::size_t max_scratch(std::initializer_list<const Step*> steps);

}  // namespace treadle::onednn
