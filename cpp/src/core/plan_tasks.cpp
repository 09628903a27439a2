// Splitting a plan into tasks for a host scheduler. A task is a contiguous run of steps of one
// module and pass. Its dependencies come from the bytes each task reads and writes under the static
// memory plan, so that any order respecting them computes exactly what the sequential run computes,
// including where the memory plan reuses an arena range for a later value.
#include <algorithm>

#include "core/op_registry.hpp"
#include "core/plan.hpp"

namespace treadle {
namespace {

// Byte ranges one task touches, per buffer that tasks can write (arena, parameters).
struct Ranges {
  std::vector<std::pair<int64_t, int64_t>> arena, params;

  void add(Buffer buffer, int64_t begin, int64_t end) {
    if (buffer == Buffer::arena) arena.emplace_back(begin, end);
    if (buffer == Buffer::params) params.emplace_back(begin, end);
  }
  void normalize() {
    for (auto* list : {&arena, &params}) {
      std::sort(list->begin(), list->end());
      std::vector<std::pair<int64_t, int64_t>> merged;
      for (const auto& r : *list)
        if (!merged.empty() && r.first <= merged.back().second)
          merged.back().second = std::max(merged.back().second, r.second);
        else
          merged.push_back(r);
      *list = std::move(merged);
    }
  }
};

bool overlap(const std::vector<std::pair<int64_t, int64_t>>& a, const std::vector<std::pair<int64_t, int64_t>>& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].second <= b[j].first) ++i;
    else if (b[j].second <= a[i].first) ++j;
    else return true;
  }
  return false;
}

bool overlap(const Ranges& a, const Ranges& b) { return overlap(a.arena, b.arena) || overlap(a.params, b.params); }

// The first `depth` components of a module path ("encoder.fc1" at depth 1 is "encoder").
std::string scope_prefix(const std::string& scope, int depth) {
  std::size_t pos = 0;
  for (int d = 0; d < depth; ++d) {
    pos = scope.find('.', pos);
    if (pos == std::string::npos) return scope;
    ++pos;
  }
  return scope.substr(0, pos - 1);
}

}  // namespace

std::vector<PlanTask> Plan::partition_tasks(int depth) const {
  const OpRegistry& reg = OpRegistry::instance();
  std::vector<PlanTask> tasks;
  std::string current_key;
  for (int s = 0; s < num_steps(); ++s) {
    const Node& node = graph.nodes()[steps[s].node];
    const std::string pass = pass_of(s);
    // Nodes outside any module (gradient sums, the loss) join the task before them in the same pass.
    const bool root = node.scope.empty();
    const std::string key = pass == "loss" ? pass : pass + " " + (root ? "<root>" : scope_prefix(node.scope, depth));
    const bool same_pass = !tasks.empty() && current_key.compare(0, pass.size(), pass) == 0;
    if (tasks.empty() || (key != current_key && !(root && same_pass))) {
      tasks.push_back(PlanTask{key, s, s, {}, {}});
      current_key = key;
    }
    tasks.back().end = s + 1;
  }

  // What each task reads and writes. Views read their source (so a task holding a view waits for
  // the data behind it); kernels write their outputs, their in-place inputs and the workspace.
  const auto bytes_of = [&](int v) { return planned_bytes(graph.values()[v]); };
  std::vector<Ranges> reads(tasks.size()), writes(tasks.size());
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    for (int s = tasks[t].begin; s < tasks[t].end; ++s) {
      const Node& node = graph.nodes()[steps[s].node];
      const OpDef& def = reg.at(node.op);
      for (int in : node.inputs) reads[t].add(loc_[in].buffer, loc_[in].offset, loc_[in].offset + bytes_of(in));
      if (!steps[s].kernel) continue;
      for (int out : node.outputs)
        writes[t].add(loc_[out].buffer, loc_[out].offset, loc_[out].offset + bytes_of(out));
      for (int k : def.writes_inputs) {
        int v = node.inputs.at(k);
        writes[t].add(loc_[v].buffer, loc_[v].offset, loc_[v].offset + bytes_of(v));
      }
      if (steps[s].workspace > 0)
        writes[t].add(Buffer::arena, static_cast<int64_t>(workspace_offset_),
                      static_cast<int64_t>(workspace_offset_ + steps[s].workspace));
    }
    reads[t].normalize();
    writes[t].normalize();
  }

  // Hazards with every earlier task (read after write, write after read, write after write), then
  // only the edges no other dependency already implies.
  const std::size_t n = tasks.size();
  std::vector<std::vector<bool>> reaches(n, std::vector<bool>(n, false));
  for (std::size_t b = 0; b < n; ++b) {
    std::vector<int> direct;
    for (std::size_t a = 0; a < b; ++a)
      if (overlap(writes[a], reads[b]) || overlap(reads[a], writes[b]) || overlap(writes[a], writes[b]))
        direct.push_back(static_cast<int>(a));
    for (auto it = direct.rbegin(); it != direct.rend(); ++it) {
      if (reaches[b][*it]) continue;  // implied by a later dependency
      tasks[b].deps.push_back(*it);
      reaches[b][*it] = true;
      for (std::size_t k = 0; k < n; ++k)
        if (reaches[*it][k]) reaches[b][k] = true;
    }
    std::sort(tasks[b].deps.begin(), tasks[b].deps.end());
  }

  // A parameter gradient is final once the step producing it has run.
  for (std::size_t g = 0; g < param_grads.size(); ++g) {
    const int producer = graph.info(param_grads[g].second).producer;
    for (PlanTask& t : tasks)
      if (producer >= steps[t.begin].node && producer < steps[t.end - 1].node + 1) t.param_grads.push_back(int(g));
  }
  return tasks;
}

}  // namespace treadle
