#pragma once
// The fused activation of a linear or conv node (ops/fusion.hpp), applied by the producing kernel to
// each block of its output while the block is in cache. The element functions are those of the
// activation kernels, so a fused relu is bitwise the unfused one (tanh and sigmoid: within an ulp,
// their vectorised blocks being aligned differently).
#include <cstdint>

#include "backends/eigen/eigen_common.hpp"
#include "backends/eigen/transcendental.hpp"
#include "ops/fusion.hpp"

namespace treadle::eigen {

enum class Epilogue { none, relu, tanh, sigmoid };

inline Epilogue epilogue_of(const Attrs& attrs) {
  const std::string& act = fused_activation(attrs);
  if (act.empty()) return Epilogue::none;
  return act == "relu" ? Epilogue::relu : act == "tanh" ? Epilogue::tanh : Epilogue::sigmoid;
}

template <typename T>
void apply_epilogue(Epilogue e, T* y, int64_t n) {
  switch (e) {
    case Epilogue::none: return;
    case Epilogue::relu: {
      VecMap<T> v(y, n);
      v = (v < T(0)).select(T(0), v);
      return;
    }
    case Epilogue::tanh: tanh_to(y, y, n); return;
    case Epilogue::sigmoid: sigmoid_to(y, y, n); return;
  }
}

}  // namespace treadle::eigen
