#pragma once
// Shared pieces of the GPU check program: a tiny test registry, device arrays that upload/download
// through the caching allocator, random inputs, and the float64 comparison.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/device_allocator.hpp"
#include "backends/cuda/device_copy.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda::test {

struct TestFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
void expect(bool ok, const Args&... args) {
  if (!ok) throw TestFailure(detail::concat(args...));
}

// What every device test gets: one stream (non-blocking, never the default stream), the allocator
// all its device memory comes from, a cuBLASLt handle and a seeded generator.
struct Env {
  CudaStream stream;
  CachingDeviceAllocator alloc;
  CublasLtHandle lt;
  std::mt19937_64 rng{1234};
  cudaStream_t s() const { return stream.get(); }
};

// A test returns a short detail for the PASS line (e.g. the largest error) or throws.
using TestFn = std::function<std::string(Env&)>;
struct TestCase {
  std::string name;
  TestFn fn;
};
void add_runtime_tests(std::vector<TestCase>& out);
void add_kernel_tests(std::vector<TestCase>& out);
void add_linear_tests(std::vector<TestCase>& out);
int run_benchmarks(Env& env, const std::string& json_path);

inline std::vector<float> uniform(Env& env, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(env.rng);
  return v;
}

// Device copy of a host vector, from the allocator, on the env's stream.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(Env& env, std::size_t n) : env_(&env), n_(n), buf_(env.alloc.buffer(n * sizeof(T), env.s())) {
    fill_zero_async(buf_.data(), n * sizeof(T), env.s());
  }
  DeviceArray(Env& env, const std::vector<T>& host) : DeviceArray(env, host.size()) { upload(host); }
  void upload(const std::vector<T>& host) { copy_to_device(buf_.data(), host.data(), host.size() * sizeof(T), env_->s()); }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    copy_to_host(host.data(), buf_.data(), n_ * sizeof(T), env_->s());
    return host;
  }
  T* get() const { return buf_.ptr<T>(); }
  std::size_t size() const { return n_; }

 private:
  Env* env_;
  std::size_t n_;
  DeviceBuffer buf_;
};

// x rounded to bfloat16 (to nearest, ties to even), as a float: the core's definition of bf16 operands.
inline float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf and NaN unchanged
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

inline std::vector<float> round_bf16(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// max |got - ref| / max |ref|: a norm-wise relative error, meaningful also where ref crosses zero.
// Any NaN/Inf in `got` where ref is finite makes it infinite.
inline double relative_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double err = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::isfinite(ref[i]) && !std::isfinite(got[i])) return INFINITY;
    err = std::max(err, std::abs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0 ? err / scale : err;
}

// Throws with the name and the error when above tol; returns "name err=..." for the PASS line.
inline std::string compare(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                           double tol) {
  expect(got.size() == ref.size(), what, ": size ", got.size(), " != reference size ", ref.size());
  const double err = relative_error(got, ref);
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s rel.err %.2e (tol %.0e)", what.c_str(), err, tol);
  expect(err <= tol, buf);
  return buf;
}

// Runs fn and requires it to throw E whose message contains `needle`; returns the message.
template <typename E, typename F>
std::string expect_throw(const std::string& what, F&& fn, const std::string& needle) {
  try {
    fn();
  } catch (const E& e) {
    const std::string msg = e.what();
    expect(msg.find(needle) != std::string::npos, what, ": message '", msg, "' lacks '", needle, "'");
    return msg;
  } catch (const std::exception& e) {
    throw TestFailure(detail::concat(what, ": threw the wrong type: ", e.what()));
  }
  throw TestFailure(detail::concat(what, ": did not throw"));
}

}  // namespace treadle::cuda::test
