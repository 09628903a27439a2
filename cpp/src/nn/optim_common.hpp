#pragma once
// Helpers shared by the fused optimizer kernels (optimizers_basic.cpp, optimizers_adaptive.cpp).
// Element loops call std::sqrt: it is the correctly rounded IEEE root (unlike Eigen's EIGEN_FAST_MATH
// packet sqrt on AVX-512), and it vectorises when the build passes -fno-math-errno.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "treadle/error.hpp"
#include "treadle/optim.hpp"

namespace treadle::optim::detail {

// Elements per chunk of a fused update when the host lends workers. An update streams three or
// four buffers and does a few flops per element, so a chunk handed to another core costs more in
// moving its cache lines there (and the parameters back for the next forward) than it saves
// below ~64K elements (measured: a 26K-parameter MLP's Adam split in two made each step ~15% slower).
// Each element is updated alone, so the chunking never changes a result.
inline constexpr int64_t kUpdateGrain = int64_t{1} << 16;

inline void require(bool ok, const char* who, const char* what, double value) {
  if (!ok) throw_value_error(who, ": invalid ", what, " value: ", value);
}

// torch.lerp's formula (exact at both ends): start + w * (end - start), or from the end when w >= 0.5.
template <typename T>
inline T lerp(T start, T end, T w) {
  return std::abs(w) < T(0.5) ? start + w * (end - start) : end - (end - start) * (T(1) - w);
}

// Calls f(std::bool_constant<b>{}): options become compile-time constants, so the element loops
// are branch-free and vectorise.
template <typename F>
void dispatch(bool b, F&& f) {
  if (b)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// Base of the fused optimizers: dispatches update() on the buffers' dtype to Derived::run<T>
// (private in Derived, which befriends this class).
template <typename Derived>
class FusedOptimizer : public Optimizer {
 public:
  using Optimizer::Optimizer;

 protected:
  void update(const Tensor& params, const Tensor& grads, double lr, Executor& exec) override {
    auto& self = static_cast<Derived&>(*this);
    if (dtype_ == DType::f32)
      self.template run<float>(params, grads, lr, exec);
    else
      self.template run<double>(params, grads, lr, exec);
  }
};

}  // namespace treadle::optim::detail
