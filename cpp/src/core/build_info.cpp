// treadle::build_info: what a user asks first of an install on a new machine (treadle/backend.hpp).
#include <Eigen/Core>
#include <string>

#include "backends/kernel.hpp"
#include "treadle/backend.hpp"

#ifndef TREADLE_VERSION_STRING
#define TREADLE_VERSION_STRING "unknown"
#endif

namespace treadle {
namespace {

// The widest x86-64 instruction set the core's own (Eigen) kernels were compiled for: a native
// build uses the building CPU's, a portable one the x86-64 baseline.
std::string compiled_for() {
#ifdef TREADLE_NATIVE_BUILD
  const std::string how = "native";
#else
  const std::string how = "portable";
#endif
#if defined(__AVX512F__)
  return how + " (avx512f)";
#elif defined(__AVX2__) && defined(__FMA__)
  return how + " (avx2, fma)";
#elif defined(__AVX__)
  return how + " (avx)";
#elif defined(__SSE4_2__)
  return how + " (sse4.2)";
#elif defined(__x86_64__)
  return how + " (sse2)";
#else
  return how;
#endif
}

std::string cpu_features() {
#if defined(__x86_64__) && defined(__GNUC__)
  std::string out;
  auto add = [&](bool has, const char* name) {
    if (has) out += out.empty() ? name : std::string(" ") + name;
  };
  __builtin_cpu_init();
  add(__builtin_cpu_supports("avx2"), "avx2");
  add(__builtin_cpu_supports("fma"), "fma");
  add(__builtin_cpu_supports("avx512f"), "avx512f");
  add(__builtin_cpu_supports("avx512bw"), "avx512bw");
  add(__builtin_cpu_supports("avx512vnni"), "avx512vnni");
  add(__builtin_cpu_supports("avx512bf16"), "avx512bf16");
  return out.empty() ? "baseline" : out;
#else
  return "unknown";
#endif
}

}  // namespace

std::vector<BuildInfoEntry> build_info() {
  std::string names;
  for (const Backend* b : available_backends()) names += names.empty() ? b->name() : std::string(", ") + b->name();
  std::vector<BuildInfoEntry> info = {
      {"version", TREADLE_VERSION_STRING},
      {"backends", names},
      {"compiled_for", compiled_for()},
      {"cpu_features", cpu_features()},
      {"eigen", std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
                    std::to_string(EIGEN_MINOR_VERSION)},
  };
  for (const Backend* b : available_backends())
    for (auto& [key, value] : b->build_info()) info.push_back({std::string(b->name()) + "." + key, value});
  return info;
}

}  // namespace treadle
