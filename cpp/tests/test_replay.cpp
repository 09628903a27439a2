// treadle::ReplayBuffer from C++: pushing and sampling allocate nothing once the buffer and the host's
// tensors exist (every operator new in the process is counted), start no thread, and the policies
// hand out what they hold. Prints one line per check; exit 1 on failure.
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <new>
#include <string>
#include <vector>

#include "treadle/replay.hpp"

namespace {
std::size_t g_allocations = 0;
int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

int threads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}
}  // namespace

void* operator new(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

int main() {
  using namespace treadle;
  for (ReplayPolicy policy : {ReplayPolicy::fifo, ReplayPolicy::firo, ReplayPolicy::reservoir}) {
    const std::string name = replay_policy_name(policy);
    ReplayBuffer buffer({{"x", {3}, DType::f32}, {"id", {}, DType::i64}}, {policy, 64, 8, -1, 7});
    std::vector<float> x(16 * 3);
    std::vector<int64_t> ids(16), got_ids(8);
    std::vector<float> got_x(8 * 3);
    const std::vector<Tensor> batch{Tensor::wrap(x.data(), {16, 3}, DType::f32), Tensor::wrap(ids.data(), {16}, DType::i64)};
    const std::vector<Tensor> out{Tensor::wrap(got_x.data(), {8, 3}, DType::f32), Tensor::wrap(got_ids.data(), {8}, DType::i64)};
    const int threads_before = threads();
    const std::size_t before = g_allocations;
    bool consistent = true;
    for (int step = 0; step < 200; ++step) {
      for (int i = 0; i < 16; ++i) {
        ids[i] = step * 16 + i;
        for (int c = 0; c < 3; ++c) x[i * 3 + c] = static_cast<float>(ids[i] * 10 + c);
      }
      buffer.push(batch);
      while (buffer.ready(8)) {
        buffer.sample(8, out);
        for (int i = 0; i < 8; ++i)  // each sample's fields stay together
          consistent = consistent && got_x[i * 3 + 2] == static_cast<float>(got_ids[i] * 10 + 2);
        if (policy == ReplayPolicy::reservoir) break;  // reservoir samples stay: one batch per step
      }
    }
    const std::size_t allocations = g_allocations - before;  // read before the message allocates
    check(allocations == 0, name + ": 200 steps of push and sample allocated nothing (" + std::to_string(allocations) +
                                " allocations)");
    check(threads() == threads_before, name + ": no thread started");
    check(consistent, name + ": every sampled row carries its own fields");
    check(buffer.pushed() == 3200, name + ": pushed() counts every sample offered");
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}
