#pragma once
// Internals of the C API (treadle.h): what the opaque handles hold, and the JSON factories.
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <memory>
#include <string>

#include "treadle/nn_layers.hpp"
#include "treadle/treadle.hpp"

struct treadle_model {
  std::shared_ptr<treadle::Model> model;
  std::string architecture;  // the JSON description, written into model files
};

struct treadle_trainer {
  std::shared_ptr<treadle::Model> model;
  std::unique_ptr<treadle::Trainer> trainer;
};

namespace treadle::capi {

// A caller mistake the C API detects itself (null pointers, ndim, buffer sizes): TREADLE_ERROR_ARGUMENT.
struct ArgumentError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// A pointer argument that must not be NULL (ArgumentError "<what> is NULL" otherwise).
template <typename T>
T& need(T* p, const char* what) {
  if (!p) throw ArgumentError(std::string(what) + " is NULL");
  return *p;
}
template <typename T>
T* non_null(T* p, const char* what) {
  if (!p) throw ArgumentError(std::string(what) + " is NULL");
  return p;
}
// Runs body, turning any exception into a status code and this thread's last error (capi.cpp).
// Exported for the C API of treadle::distributed (treadle_distributed.h), which shares the error channel.
TREADLE_API int guarded_call(const char* who, const std::function<void()>& body);
// A trainer step's x and y over caller memory, with treadle_trainer_step's checks (ArgumentError).
TREADLE_API Tensor step_input(const treadle_trainer& t, const void* x, int ndim, const int64_t* shape);
TREADLE_API Tensor step_target(const treadle_trainer& t, const void* y, int ndim, const int64_t* shape);

// A module tree from a description {"format": "treadle-architecture/1", "model": node} or a bare node.
// Returns the module and the canonical description (with the format wrapper) for model files.
std::shared_ptr<Module> build_module(const std::string& json, std::string* canonical);
// An optimizer from its name and a JSON object of torch.optim keyword arguments (empty: defaults).
std::shared_ptr<Optimizer> build_optimizer(const std::string& name, const std::string& options_json);
Loss build_loss(const std::string& name);

}  // namespace treadle::capi
