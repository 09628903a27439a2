// The C API (treadle.h): every entry point runs its body through guarded(), which turns any
// exception into a status code and a thread-local message, so nothing ever unwinds into C.
#include "treadle/treadle.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <system_error>

#include "capi/capi_internal.hpp"
#include "treadle/error.hpp"

using namespace treadle;

namespace {

thread_local std::string last_error;

using capi::ArgumentError;

template <typename F>
int guarded(const char* who, F&& body) {
  try {
    body();
    last_error.clear();
    return TREADLE_OK;
  } catch (const ArgumentError& e) {
    last_error = std::string(who) + ": " + e.what();
    return TREADLE_ERROR_ARGUMENT;
  } catch (const ValueError& e) {
    last_error = e.what();
    return TREADLE_ERROR_VALUE;
  } catch (const TypeError& e) {
    last_error = e.what();
    return TREADLE_ERROR_TYPE;
  } catch (const TimeoutError& e) {
    last_error = e.what();
    return TREADLE_ERROR_TIMEOUT;
  } catch (const std::system_error& e) {
    last_error = std::string(who) + ": " + e.what();
    return TREADLE_ERROR_IO;
  } catch (const std::bad_alloc&) {
    last_error = std::string(who) + ": out of memory";
    return TREADLE_ERROR_MEMORY;
  } catch (const std::exception& e) {
    last_error = std::string(who) + ": " + e.what();
    return TREADLE_ERROR_INTERNAL;
  } catch (...) {
    last_error = std::string(who) + ": unknown error";
    return TREADLE_ERROR_INTERNAL;
  }
}

using capi::need;
using capi::non_null;

Shape make_shape(int ndim, const int64_t* shape, const char* what) {
  if (ndim < 0 || ndim > 16) throw ArgumentError(std::string(what) + ": ndim must be in [0, 16], got " + std::to_string(ndim));
  if (ndim > 0 && !shape) throw ArgumentError(std::string(what) + ": shape is NULL");
  Shape s(shape, shape + ndim);
  for (int64_t d : s)
    if (d < 0) throw ArgumentError(std::string(what) + ": negative dimension " + std::to_string(d));
  return s;
}

// A tensor over caller memory (never written through unless it is an output).
Tensor wrap(const void* data, int ndim, const int64_t* shape, DType dtype, const char* what) {
  Shape s = make_shape(ndim, shape, what);
  if (!data && shape_numel(s) > 0) throw ArgumentError(std::string(what) + " is NULL");
  return Tensor::wrap(const_cast<void*>(data), std::move(s), dtype);
}

void check_capacity(int64_t needed, int64_t capacity, const char* what) {
  if (capacity < needed)
    throw ArgumentError(std::string(what) + " holds " + std::to_string(capacity) + " values, " +
                        std::to_string(needed) + " needed");
}

void copy_out(const Tensor& t, void* out, int64_t count, const char* what) {
  check_capacity(t.numel(), count, what);
  if (t.numel() == 0) return;
  Tensor src = t.is_contiguous() ? t : t.clone();
  std::memcpy(non_null(out, what), src.data(), src.nbytes());
}

DType to_dtype(treadle_dtype d) {
  if (d == TREADLE_F32) return DType::f32;
  if (d == TREADLE_F64) return DType::f64;
  throw ArgumentError("dtype must be TREADLE_F32 or TREADLE_F64, got " + std::to_string(static_cast<int>(d)));
}

std::vector<std::string> comma_list(const char* text) {
  std::vector<std::string> items;
  std::string item;
  for (const char* c = text ? text : ""; ; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!item.empty()) items.push_back(item);
      item.clear();
      if (*c == '\0') break;
    } else if (*c != ' ') {
      item += *c;
    }
  }
  return items;
}

}  // namespace

int capi::guarded_call(const char* who, const std::function<void()>& body) { return guarded(who, body); }
Tensor capi::step_input(const treadle_trainer& t, const void* x, int ndim, const int64_t* shape) {
  return wrap(x, ndim, shape, t.model->dtype(), "x");
}
Tensor capi::step_target(const treadle_trainer& t, const void* y, int ndim, const int64_t* shape) {
  return wrap(y, ndim, shape, t.trainer->loss().target_dtype(t.model->dtype()), "y");
}

extern "C" {

const char* treadle_last_error(void) { return last_error.c_str(); }
const char* treadle_version(void) { return serialize_version(); }

int treadle_set_last_error(int status, const char* message) {
  try {
    last_error = message ? message : "";
  } catch (...) {  // out of memory for the copy: nothing may unwind into C
    last_error.clear();
  }
  return status;
}

int treadle_model_from_json(const char* json, treadle_dtype dtype, uint64_t seed, treadle_model** out) {
  return guarded("treadle_model_from_json", [&] {
    need(out, "out") = nullptr;
    DType dt = to_dtype(dtype);
    auto handle = std::make_unique<treadle_model>();
    manual_seed(seed);
    handle->model = std::make_shared<Model>(capi::build_module(non_null(json, "json"), &handle->architecture));
    if (dt != DType::f32) handle->model->to(dt);
    *out = handle.release();
  });
}

int treadle_model_load(const char* path, treadle_model** out) {
  return guarded("treadle_model_load", [&] {
    need(out, "out") = nullptr;
    Metadata meta = read_safetensors_metadata(non_null(path, "path"));
    auto arch = meta.find("treadle.architecture");
    if (arch == meta.end())
      throw_value_error("treadle_model_load: '", path, "' has no architecture description (write it with ",
                        "treadle_model_save or tl.save; for weights only use treadle_model_load_weights)");
    auto handle = std::make_unique<treadle_model>();
    {
      // The description is untrusted too: it may not declare more parameters than the file could hold
      // (three times its size: built in float32 first, then converted, then packed; as tl.load).
      std::error_code ec;
      const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
      AllocationBudget budget(ec ? 0 : 3 * size + (int64_t{16} << 20),
                              std::string("treadle_model_load: the architecture in '") + path +
                                  "' needs more memory than the file's tensors fill, so it does not describe them");
      handle->model = std::make_shared<Model>(capi::build_module(arch->second, &handle->architecture));
      if (auto dt = meta.find("treadle.dtype"); dt != meta.end() && dtype_from_name(dt->second) != DType::f32)
        handle->model->to(dtype_from_name(dt->second));
    }
    load_model(path, *handle->model);
    *out = handle.release();
  });
}

int treadle_model_load_weights(treadle_model* model, const char* path) {
  return guarded("treadle_model_load_weights", [&] { load_model(non_null(path, "path"), *need(model, "model").model); });
}

int treadle_model_save(const treadle_model* model, const char* path) {
  return guarded("treadle_model_save", [&] {
    const treadle_model& m = need(model, "model");
    save_model(non_null(path, "path"), *m.model, {{"treadle.architecture", m.architecture}});
  });
}

void treadle_model_free(treadle_model* model) { delete model; }

int treadle_model_dtype(const treadle_model* model, treadle_dtype* out) {
  return guarded("treadle_model_dtype", [&] {
    need(out, "out") = need(model, "model").model->dtype() == DType::f64 ? TREADLE_F64 : TREADLE_F32;
  });
}

int treadle_model_num_parameters(const treadle_model* model, int64_t* out) {
  return guarded("treadle_model_num_parameters",
                 [&] { need(out, "out") = need(model, "model").model->flat_parameters().numel(); });
}

int treadle_model_get_parameters(const treadle_model* model, void* buffer, int64_t count) {
  return guarded("treadle_model_get_parameters", [&] {
    copy_out(need(model, "model").model->flat_parameters(), buffer, count, "buffer");
  });
}

int treadle_model_set_parameters(treadle_model* model, const void* buffer, int64_t count) {
  return guarded("treadle_model_set_parameters", [&] {
    const Tensor& flat = need(model, "model").model->flat_parameters();
    if (count != flat.numel())
      throw ArgumentError("count is " + std::to_string(count) + ", the model has " + std::to_string(flat.numel()) +
                          " parameters");
    if (count > 0) std::memcpy(flat.data(), non_null(buffer, "buffer"), flat.nbytes());
  });
}

int treadle_model_set_backend(treadle_model* model, const char* backend) {
  return guarded("treadle_model_set_backend",
                 [&] { need(model, "model").model->set_backend(non_null(backend, "backend")); });
}

int treadle_model_set_precision(treadle_model* model, const char* precision) {
  return guarded("treadle_model_set_precision",
                 [&] { need(model, "model").model->set_precision(non_null(precision, "precision")); });
}

int treadle_model_set_deterministic(treadle_model* model, int deterministic) {
  return guarded("treadle_model_set_deterministic",
                 [&] { need(model, "model").model->set_deterministic(deterministic != 0); });
}

int treadle_model_set_fusion(treadle_model* model, int fusion) {
  return guarded("treadle_model_set_fusion", [&] { need(model, "model").model->set_fusion(fusion != 0); });
}

int treadle_model_output_shape(treadle_model* model, int x_ndim, const int64_t* x_shape, int capacity, int* out_ndim,
                               int64_t* out_shape) {
  return guarded("treadle_model_output_shape", [&] {
    Model& m = *need(model, "model").model;
    Tensor probe = Tensor::wrap(nullptr, make_shape(x_ndim, x_shape, "x"), m.dtype());
    Shape s = m.output_shapes({probe}).at(0).first;
    if (static_cast<int>(s.size()) > capacity || (!s.empty() && !out_shape))
      throw ArgumentError("out_shape holds " + std::to_string(capacity) + " entries, " + std::to_string(s.size()) +
                          " needed");
    need(out_ndim, "out_ndim") = static_cast<int>(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) out_shape[i] = s[i];
  });
}

int treadle_model_predict(treadle_model* model, const void* x, int x_ndim, const int64_t* x_shape, void* y,
                          int64_t y_count) {
  return guarded("treadle_model_predict", [&] {
    Model& m = *need(model, "model").model;
    Tensor xt = wrap(x, x_ndim, x_shape, m.dtype(), "x");
    auto [shape, dtype] = m.output_shapes({xt}).at(0);
    check_capacity(shape_numel(shape), y_count, "y");
    m.predict_into({xt}, {wrap(y, static_cast<int>(shape.size()), shape.data(), dtype, "y")});
  });
}

int treadle_trainer_create(treadle_model* model, const char* loss, const char* optimizer, const char* options_json,
                           uint64_t seed, treadle_trainer** out) {
  return guarded("treadle_trainer_create", [&] {
    need(out, "out") = nullptr;
    auto handle = std::make_unique<treadle_trainer>();
    handle->model = need(model, "model").model;
    handle->trainer = std::make_unique<Trainer>(handle->model, capi::build_loss(non_null(loss, "loss")),
                                                capi::build_optimizer(non_null(optimizer, "optimizer"),
                                                                      options_json ? options_json : ""),
                                                TrainerOptions{}, nullptr, seed);
    *out = handle.release();
  });
}

void treadle_trainer_free(treadle_trainer* trainer) { delete trainer; }

int treadle_trainer_step(treadle_trainer* trainer, const void* x, int x_ndim, const int64_t* x_shape, const void* y,
                         int y_ndim, const int64_t* y_shape, double* loss) {
  return guarded("treadle_trainer_step", [&] {
    treadle_trainer& t = need(trainer, "trainer");
    double l = t.trainer->step(capi::step_input(t, x, x_ndim, x_shape), capi::step_target(t, y, y_ndim, y_shape));
    if (loss) *loss = l;
  });
}

int treadle_trainer_evaluate(treadle_trainer* trainer, const void* x, int x_ndim, const int64_t* x_shape,
                             const void* y, int y_ndim, const int64_t* y_shape, double* loss) {
  return guarded("treadle_trainer_evaluate", [&] {
    treadle_trainer& t = need(trainer, "trainer");
    double l = t.trainer->evaluate(capi::step_input(t, x, x_ndim, x_shape),
                                        capi::step_target(t, y, y_ndim, y_shape));
    if (loss) *loss = l;
  });
}

int treadle_trainer_zero_grad(treadle_trainer* trainer) {
  return guarded("treadle_trainer_zero_grad", [&] { need(trainer, "trainer").trainer->zero_grad(); });
}

int treadle_trainer_forward(treadle_trainer* trainer, const void* x, int x_ndim, const int64_t* x_shape, void* out,
                            int64_t out_count) {
  return guarded("treadle_trainer_forward", [&] {
    treadle_trainer& t = need(trainer, "trainer");
    // Checked before running, so that a too-small buffer leaves no pending forward behind.
    Tensor xt = wrap(x, x_ndim, x_shape, t.model->dtype(), "x");
    check_capacity(shape_numel(t.model->output_shapes({xt}).at(0).first), out_count, "out");
    copy_out(t.trainer->forward(xt), out, out_count, "out");
  });
}

int treadle_trainer_backward(treadle_trainer* trainer, const void* grad_out, int ndim, const int64_t* shape) {
  return guarded("treadle_trainer_backward", [&] {
    treadle_trainer& t = need(trainer, "trainer");
    t.trainer->backward(wrap(grad_out, ndim, shape, t.model->dtype(), "grad_out"));
  });
}

int treadle_trainer_update(treadle_trainer* trainer) {
  return guarded("treadle_trainer_update", [&] { need(trainer, "trainer").trainer->update(); });
}

int treadle_trainer_get_gradients(treadle_trainer* trainer, void* buffer, int64_t count) {
  return guarded("treadle_trainer_get_gradients", [&] {
    copy_out(need(trainer, "trainer").model->flat_gradients(), buffer, count, "buffer");
  });
}

int treadle_verify(int quick, const char* ops, const char* backends, uint64_t seed, const char* json_path, int print,
                   int64_t* failures) {
  return guarded("treadle_verify", [&] {
    need(failures, "failures") = -1;
    VerifyOptions options;
    options.quick = quick != 0, options.ops = comma_list(ops), options.backends = comma_list(backends);
    options.seed = seed;
    const VerifyReport report = verify(options);
    if (json_path && *json_path) {
      std::ofstream file(json_path);
      file << report.json();
      if (!file.flush())
        throw std::system_error(errno, std::generic_category(), std::string("cannot write ") + json_path);
    }
    if (print) {
      std::fputs(report.text().c_str(), stdout);
      std::fflush(stdout);
    }
    *failures = static_cast<int64_t>(report.failures.size());
  });
}

}  // extern "C"
