// Eigen reference kernels for the ops that draw random numbers: dropout (x) -> (y, mask), and
// random () -> uniform [0, 1) or standard normal noise.
// Element i's uniform number is a pure function of (seed, step counter, node stream, i): a
// splitmix64 stream keyed by a hash of the first three, evaluated at position i. No state is
// carried between elements, so any chunking gives the same mask. The keep/drop test compares a
// 53-bit uniform in double, so float32 and float64 runs with one seed draw identical masks.
#include <cmath>
#include <cstdint>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"

namespace treadle {
namespace eigen {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// splitmix64's output function: a bijective avalanche mix of 64 bits.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t stream_key(uint64_t seed, uint64_t counter, uint64_t stream) {
  uint64_t k = mix64(seed + kGolden);
  k = mix64(k ^ mix64(counter + 2 * kGolden));
  return mix64(k ^ mix64(stream + 3 * kGolden));
}

// Uniform in [0, 1) from the i-th value of the splitmix64 sequence starting at `key`.
inline double uniform_at(uint64_t key, uint64_t i) {
  return static_cast<double>(mix64(key + (i + 1) * kGolden) >> 11) * 0x1.0p-53;
}

template <typename T>
void dropout_kernel(const KernelArgs& a) {
  const double p = a.attrs().f("p");
  const uint64_t key = stream_key(a.rng_seed, a.rng_counter, static_cast<uint64_t>(a.attrs().i("stream")));
  const T keep_scale = p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  T* mask = a.out[1].ptr<T>();
  parallel_chunks(a.exec, a.in[0].numel, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T m = uniform_at(key, static_cast<uint64_t>(i)) < p ? T(0) : keep_scale;
      mask[i] = m;
      y[i] = x[i] * m;
    }
  });
}

// Standard normal numbers by the Box-Muller transform of the uniforms at positions 2i and 2i + 1:
// one independent pair per element (the sine half is not used), so element i never depends on
// another element or on the chunking. 1 - u lies in (0, 1], so the logarithm is finite, and
// |z| stays below 8.6 (the tail beyond has probability 1e-17). Computed in double for both dtypes.
inline double normal_at(uint64_t key, uint64_t i) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double u1 = 1.0 - uniform_at(key, 2 * i), u2 = uniform_at(key, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

template <typename T>
void random_kernel(const KernelArgs& a) {
  const uint64_t key = stream_key(a.rng_seed, a.rng_counter, static_cast<uint64_t>(a.attrs().i("stream")));
  const bool normal = a.attrs().s("distribution") == "normal";
  T* y = a.out[0].ptr<T>();
  parallel_chunks(a.exec, a.out[0].numel, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto k = static_cast<uint64_t>(i);
      y[i] = static_cast<T>(normal ? normal_at(key, k) : uniform_at(key, k));
    }
  });
}

}  // namespace
}  // namespace eigen

void register_eigen_dropout(KernelTable& t) {
  using namespace eigen;
  TREADLE_EIGEN_REGISTER_FLOATS(t, "dropout", dropout_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "random", random_kernel);
}

}  // namespace treadle
