#pragma once
// Per-node timing of plan runs. Off unless a profiler is attached to a context or installed
// process-wide; then every kernel call is timed (two clock reads) and added to its node's entry.
// Recording is thread-safe, so one profiler can watch many contexts at once.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "treadle/export.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

// One node of one plan: what it is and how long its kernel took over all recorded runs.
struct NodeProfile {
  uint64_t plan = 0;  // Plan id: nodes of different input signatures stay apart
  int node = 0;
  std::string op, scope, backend, pass;  // pass: "forward", "loss" or "backward"
  Shape output_shape;
  int64_t calls = 0;
  double seconds = 0;
};

class TREADLE_API Profiler {
 public:
  // Adds one kernel call to (plan, step); `describe` fills the entry the first time it is seen.
  template <typename Describe>
  void record(uint64_t plan, int step, double seconds, Describe&& describe) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, fresh] = nodes_.try_emplace({plan, step});
    if (fresh) it->second = describe();
    it->second.calls += 1;
    it->second.seconds += seconds;
  }
  // Every recorded node, slowest (total time) first.
  std::vector<NodeProfile> nodes() const;
  double total_seconds() const;
  // A readable table of the `top` slowest nodes with their share of the total, then the total per
  // module scope and pass (where the time of a layer goes, forward and backward).
  std::string report(std::size_t top = 20) const;
  void reset();

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<uint64_t, int>, NodeProfile> nodes_;
};

// The process-wide profiler that plans use when their context has none (null: off). Returns the
// previous one so a caller can restore it.
TREADLE_API Profiler* global_profiler();
TREADLE_API Profiler* set_global_profiler(Profiler* profiler);

}  // namespace treadle
