#pragma once
// The operand rounding of mixed-precision products and convolutions (ops/precision.hpp): a float32
// operand rounded to bf16 or fp16 values and stored as float32 again. Products of two such values
// are exact in float32 (8x8 or 11x11 significant bits fit in 24), so a float32 kernel that reads the
// rounded copies computes the core's definition of `precision: "bf16"` / `"fp16"` exactly, up to the
// order of the float32 summation. Used where no library kernel takes the narrow operands with a
// float32 output: cuDNN's convolutions.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace treadle::cuda {

enum class OperandRounding { none, bf16, fp16 };

const char* rounding_name(OperandRounding r);

// y[i] = x[i] rounded to nearest (ties to even) in the format, as float32. NaN stays NaN; values
// beyond the format's range become +-Inf (fp16: |x| >= 65520); fp16 keeps its subnormals.
void round_operand(OperandRounding r, const float* x, float* y, int64_t n, cudaStream_t stream);

}  // namespace treadle::cuda
