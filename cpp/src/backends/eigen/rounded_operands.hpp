#pragma once
// The reference path of bf16 and fp16 compute (ops/precision.hpp): a product's two matrix operands
// rounded to the format's values into float32 copies in the node's workspace, which the float32
// GEMM then reads. Slow next to a native half-precision kernel, but exact to the definition up to
// summation order. One path for both formats: only the rounding function differs.
#include <tuple>
#include <type_traits>
#include <utility>

#include "backends/eigen/eigen_common.hpp"
#include "ops/precision.hpp"

namespace treadle::eigen {

// The operands a product kernel reads: the inputs themselves, or their rounded copies.
template <typename T>
std::pair<const T*, const T*> product_operands(const KernelArgs& a) {
  const T* p0 = a.in[0].ptr<T>();
  const T* p1 = a.in[1].ptr<T>();
  if constexpr (std::is_same_v<T, float>) {
    const OperandRounding rounding = rounding_of(a.attrs());
    if (rounding != OperandRounding::none) {
      float* c0 = static_cast<float*>(a.workspace);
      char* ws = static_cast<char*>(a.workspace);
      float* c1 = reinterpret_cast<float*>(ws + padded_bytes(a.in[0].numel, sizeof(float)));
      auto round_into = [&a, rounding](const float* src, float* dst, int64_t n) {
        parallel_chunks(a.exec, n, kElementGrain,
                        [&](int64_t i0, int64_t i1) { round_operands(rounding, src + i0, dst + i0, i1 - i0); });
      };
      round_into(p0, c0, a.in[0].numel);
      round_into(p1, c1, a.in[1].numel);
      return {c0, c1};
    }
  }
  return {p0, p1};
}

}  // namespace treadle::eigen
