#pragma once
// The compute precision of matrix products (linear, matmul, bmm) and convolutions (conv and its
// data and weight gradients, whose two operands play the matrices' roles), carried by the node attribute
// "precision". "float32" (or no attribute) is the plain product. "bf16" and "fp16" define a
// mixed-precision product exactly, so that the reference can check any fast path: both matrix
// operands are rounded to the format (bfloat16 or IEEE binary16; round to nearest, ties to even),
// multiplied with float32 accumulation, and the result (plus a float32 bias) is float32. fp16 keeps
// subnormals (down to 2^-24), rounds magnitudes from 65520 up to +-Inf and NaN to NaN: what a tensor
// core reads from an fp16 conversion. Only float32 operands may carry either.
#include <cstdint>
#include <cstring>
#include <string>

#include "core/op_registry.hpp"
#include "treadle/dtype.hpp"
#include "treadle/error.hpp"
#include "treadle/graph.hpp"

namespace treadle {

inline constexpr const char* kPrecisionAttr = "precision";

// How a node's product reads its two matrix operands.
enum class OperandRounding : uint8_t { none, bf16, fp16 };

inline OperandRounding rounding_of(const Attrs& attrs) {
  if (!attrs.has(kPrecisionAttr)) return OperandRounding::none;
  const std::string& p = attrs.s(kPrecisionAttr);
  return p == "bf16" ? OperandRounding::bf16 : p == "fp16" ? OperandRounding::fp16 : OperandRounding::none;
}

// True when the node computes its product from bf16-rounded operands.
inline bool is_bf16_compute(const Attrs& attrs) { return rounding_of(attrs) == OperandRounding::bf16; }
// True when the node computes its product from fp16-rounded operands.
inline bool is_fp16_compute(const Attrs& attrs) { return rounding_of(attrs) == OperandRounding::fp16; }
// True for either mixed precision: the reference path rounds copies of the operands.
inline bool has_rounded_operands(const Attrs& attrs) { return rounding_of(attrs) != OperandRounding::none; }
// "bf16", "fp16", or nullptr for a float32 product (plan listings).
inline const char* rounding_label(OperandRounding r) {
  return r == OperandRounding::bf16 ? "bf16" : r == OperandRounding::fp16 ? "fp16" : nullptr;
}

// Validates a precision name: "float32", "bf16" or "fp16" (`who` names the caller in the message).
inline void check_precision_name(const std::string& who, const std::string& precision) {
  if (precision != "float32" && precision != "bf16" && precision != "fp16")
    throw_value_error(who, ": unknown precision '", precision, "' (expected 'float32', 'bf16' or 'fp16')");
}

// An op's check of its "precision" attribute against its operands' dtype.
inline void check_precision_attr(const std::string& op, const Attrs& attrs, DType dtype) {
  if (!attrs.has(kPrecisionAttr)) return;
  check_precision_name(op, attrs.s(kPrecisionAttr));
  if (has_rounded_operands(attrs) && dtype != DType::f32)
    throw_type_error(op, ": precision '", attrs.s(kPrecisionAttr), "' needs float32 operands, got ",
                     dtype_name(dtype));
}

// A product emitted by a gradient rule, in the precision of the node it differentiates.
inline Value precision_product(const char* op, const Node& node, Value a, Value b, bool ta, bool tb) {
  Attrs attrs{{"trans_a", int64_t{ta}}, {"trans_b", int64_t{tb}}};
  if (node.attrs.has(kPrecisionAttr)) attrs.set(kPrecisionAttr, node.attrs.s(kPrecisionAttr));
  return a.graph().apply1(op, {a, b}, std::move(attrs));
}

// Bytes of one operand copy in a workspace, padded so the next copy starts 64-byte aligned.
inline std::size_t padded_bytes(int64_t numel, std::size_t elem_size) {
  return (static_cast<std::size_t>(numel) * elem_size + 63) / 64 * 64;
}

// Bytes of the reference path's rounded copies of a product's two operands (0 for float32).
inline std::size_t rounded_operand_workspace_bytes(int64_t numel0, int64_t numel1, const Attrs& attrs) {
  if (!has_rounded_operands(attrs)) return 0;
  return padded_bytes(numel0, sizeof(float)) + padded_bytes(numel1, sizeof(float));
}

// The op workspace of a product (OpDef::workspace): with bf16 or fp16 compute, the reference path
// rounds both matrix operands into float32 copies.
inline std::size_t rounded_operand_workspace(const std::vector<TensorMeta>& in, const Attrs& attrs) {
  return rounded_operand_workspace_bytes(shape_numel(in.at(0).shape), shape_numel(in.at(1).shape), attrs);
}

// The upper 16 bits of x rounded to nearest even: x as a bfloat16. NaNs stay NaN (quiet); the
// integer form keeps the loops below vectorisable.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Rounds n floats to bf16 values, stored as float32 (the reference path's operand copies).
inline void round_to_bf16(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(bf16_bits(x[i])) << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
}

// Converts n floats to bf16 (the fast path's operand copies).
inline void convert_to_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_bits(x[i]);
}

// x as IEEE binary16 bits, rounded to nearest even. Magnitudes from 65520 (halfway between the
// largest half, 65504, and 2^16) up become Inf; below 2^-14 the result is subnormal (a multiple of
// 2^-24), and below 2^-25 it is zero; NaNs stay NaN (quiet). Integer arithmetic only, so the result
// does not depend on the floating-point environment.
inline uint16_t fp16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // normal in fp16: drop 13 mantissa bits, rebias the exponent (127 -> 15)
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  // Subnormal in fp16: the count of 2^-24 units, |x| = m * 2^(e - 150) with the implicit bit in m.
  const uint32_t e = a >> 23;
  const uint32_t shift = 126u - e;  // >= 14 here
  if (shift > 24u) return sign;     // below 2^-25, or a float32 subnormal: rounds to zero
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t half = 1u << (shift - 1u);
  return static_cast<uint16_t>(sign | ((m + half - 1u + ((m >> shift) & 1u)) >> shift));
}

// fp16 bits as a float32 (exact).
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else {  // zero or subnormal: man * 2^-24, exact in float32
    const float v = static_cast<float>(man) * 0x1p-24f;
    std::memcpy(&u, &v, sizeof u);
    u |= sign;
  }
  float y;
  std::memcpy(&y, &u, sizeof y);
  return y;
}

// Rounds n floats to fp16 values, stored as float32 (the reference path's operand copies).
inline void round_to_fp16(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_float(fp16_bits(x[i]));
}

// Rounds n floats to the format of `r` (which is not `none`), stored as float32.
inline void round_operands(OperandRounding r, const float* x, float* y, int64_t n) {
  if (r == OperandRounding::fp16)
    round_to_fp16(x, y, n);
  else
    round_to_bf16(x, y, n);
}

}  // namespace treadle
