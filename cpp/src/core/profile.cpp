#include "treadle/profile.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <sstream>

namespace treadle {
namespace {

std::atomic<Profiler*> g_profiler{nullptr};

template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buf[96];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

}  // namespace

Profiler* global_profiler() { return g_profiler.load(std::memory_order_relaxed); }
Profiler* set_global_profiler(Profiler* profiler) { return g_profiler.exchange(profiler); }

std::vector<NodeProfile> Profiler::nodes() const {
  std::vector<NodeProfile> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& entry : nodes_) out.push_back(entry.second);
  }
  std::stable_sort(out.begin(), out.end(), [](const NodeProfile& a, const NodeProfile& b) {
    return a.seconds > b.seconds;
  });
  return out;
}

double Profiler::total_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  double total = 0;
  for (const auto& entry : nodes_) total += entry.second.seconds;
  return total;
}

void Profiler::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  nodes_.clear();
}

std::string Profiler::report(std::size_t top) const {
  std::vector<NodeProfile> all = nodes();
  double total = 0;
  for (const NodeProfile& n : all) total += n.seconds;
  std::ostringstream os;
  os << "treadle profile: " << all.size() << " nodes, " << format("%.3f ms of kernel time", total * 1e3)
     << "\n";
  if (all.empty()) return os.str();
  const double share = total > 0 ? 100.0 / total : 0.0;
  os << "  share   total ms    calls   mean us  op [backend] pass module -> output\n";
  for (std::size_t i = 0; i < std::min(top, all.size()); ++i) {
    const NodeProfile& n = all[i];
    os << format("  %5.1f%% %10.3f %8lld %9.2f  ", n.seconds * share, n.seconds * 1e3,
                 static_cast<long long>(n.calls), n.seconds / double(n.calls) * 1e6)
       << n.op << " [" << n.backend << "] " << n.pass
       << " " << (n.scope.empty() ? "<root>" : n.scope) << " -> " << shape_str(n.output_shape) << "\n";
  }
  // The same time by module and pass: a layer's forward and backward cost at a glance.
  std::map<std::pair<std::string, std::string>, double> by_module;
  for (const NodeProfile& n : all) by_module[{n.scope.empty() ? "<root>" : n.scope, n.pass}] += n.seconds;
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [key, seconds] : by_module) rows.emplace_back(seconds, key.first + " (" + key.second + ")");
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  os << "  by module:\n";
  for (std::size_t i = 0; i < std::min(top, rows.size()); ++i)
    os << format("  %5.1f%% %10.3f  ", rows[i].first * share, rows[i].first * 1e3) << rows[i].second << "\n";
  return os.str();
}

}  // namespace treadle
