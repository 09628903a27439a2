#pragma once
// Errors are typed exceptions whose message starts with the function that raised them.
// Bindings map ValueError -> Python ValueError, TypeError -> TypeError, others -> RuntimeError.
#include <sstream>
#include <stdexcept>
#include <string>

#include "treadle/export.hpp"

namespace treadle {

// A caller passed a value of the right type but wrong content (shape, range, NaN...).
class TREADLE_API ValueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A caller passed the wrong kind of thing (dtype, device, layout).
class TREADLE_API TypeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A failure that is not the caller's mistake: a device or library call that reported an error.
class TREADLE_API RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An operation that waits for other processes gave up after the time it was allowed.
class TREADLE_API TimeoutError : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

template <typename... Args>
[[noreturn]] void throw_value_error(const Args&... args) {
  throw ValueError(detail::concat(args...));
}
template <typename... Args>
[[noreturn]] void throw_type_error(const Args&... args) {
  throw TypeError(detail::concat(args...));
}
template <typename... Args>
[[noreturn]] void throw_runtime_error(const Args&... args) {
  throw std::runtime_error(detail::concat(args...));
}

}  // namespace treadle
