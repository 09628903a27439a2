#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "treadle/export.hpp"

namespace treadle {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64 };

TREADLE_API std::size_t dtype_size(DType t);
TREADLE_API const char* dtype_name(DType t);
TREADLE_API DType dtype_from_name(const std::string& name);  // "float32", "float64", ...
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16; }
inline bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};
TREADLE_API std::string device_name(Device d);

using Shape = std::vector<int64_t>;
TREADLE_API int64_t shape_numel(const Shape& s);
TREADLE_API std::string shape_str(const Shape& s);  // "(32, 8)"

}  // namespace treadle
