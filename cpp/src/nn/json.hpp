#pragma once
// A small JSON reader and writer for file headers (safetensors). It exists so the core has no JSON
// dependency; it reads untrusted bytes, so it bounds nesting depth, rejects duplicate keys and
// invalid UTF-8, and reports the byte position of the first problem.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace treadle::json {

enum class Kind : uint8_t { null, boolean, number, string, array, object };

const char* kind_name(Kind k);

struct Value {
  Kind kind = Kind::null;
  bool boolean = false;
  std::string text;  // a string's decoded contents, or a number's literal text (exact)
  std::vector<Value> items;                            // array elements
  std::vector<std::pair<std::string, Value>> members;  // object members, in file order

  // The member named `key`, or null when absent (or when this is not an object).
  const Value* find(std::string_view key) const;
};

// Parses one JSON value filling all of `text` (whitespace around it allowed). Throws
// treadle::ValueError "<who>: <problem> at byte <k>" on any error, including nesting deeper than
// `max_depth` and duplicate object keys.
Value parse(std::string_view text, const std::string& who, int max_depth = 64);

// The exact value of a number written as a plain non-negative integer (no sign, fraction or
// exponent) that fits in uint64_t; nullopt otherwise.
std::optional<uint64_t> as_uint(const Value& v);

// Appends `s` as a quoted JSON string (escaping quotes, backslashes and control characters).
void write_string(std::string& out, std::string_view s);

}  // namespace treadle::json
