#pragma once
// The compute precision of matrix products (linear, matmul, bmm) and convolutions (conv and its
// data and weight gradients, whose two operands play the matrices' roles), carried by the node attribute
// "precision". "float32" (or no attribute) is the plain product. "bf16" defines a mixed-precision
// product exactly, so that the reference can check any fast path: both matrix operands are rounded
// to bfloat16 (round to nearest, ties to even), multiplied with float32 accumulation, and the result
// (plus a float32 bias) is float32. Only float32 operands may carry it.
#include <cstdint>
#include <cstring>
#include <string>

#include "core/op_registry.hpp"
#include "treadle/dtype.hpp"
#include "treadle/error.hpp"
#include "treadle/graph.hpp"

namespace treadle {

inline constexpr const char* kPrecisionAttr = "precision";

// True when the node computes its product from bf16-rounded operands.
inline bool is_bf16_compute(const Attrs& attrs) {
  return attrs.has(kPrecisionAttr) && attrs.s(kPrecisionAttr) == "bf16";
}

// Validates a precision name: "float32" or "bf16" (`who` names the caller in the message).
inline void check_precision_name(const std::string& who, const std::string& precision) {
  if (precision != "float32" && precision != "bf16")
    throw_value_error(who, ": unknown precision '", precision, "' (expected 'float32' or 'bf16')");
}

// An op's check of its "precision" attribute against its operands' dtype.
inline void check_precision_attr(const std::string& op, const Attrs& attrs, DType dtype) {
  if (!attrs.has(kPrecisionAttr)) return;
  check_precision_name(op, attrs.s(kPrecisionAttr));
  if (is_bf16_compute(attrs) && dtype != DType::f32)
    throw_type_error(op, ": precision 'bf16' needs float32 operands, got ", dtype_name(dtype));
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

// Bytes of the reference path's rounded copies of a product's two operands (0 without bf16).
inline std::size_t bf16_operand_workspace_bytes(int64_t numel0, int64_t numel1, const Attrs& attrs) {
  if (!is_bf16_compute(attrs)) return 0;
  return padded_bytes(numel0, sizeof(float)) + padded_bytes(numel1, sizeof(float));
}

// The op workspace of a product (OpDef::workspace): with bf16 compute, the reference path rounds
// both matrix operands into float32 copies.
inline std::size_t bf16_operand_workspace(const std::vector<TensorMeta>& in, const Attrs& attrs) {
  return bf16_operand_workspace_bytes(shape_numel(in.at(0).shape), shape_numel(in.at(1).shape), attrs);
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

}  // namespace treadle
