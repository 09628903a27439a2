// The C API's replay buffers and checkpoints (treadle.h): thin wrappers over treadle::ReplayBuffer and
// save_checkpoint / load_checkpoint, every call guarded as in capi.cpp.
#include <memory>
#include <string>

#include "capi/capi_internal.hpp"
#include "treadle/replay.hpp"
#include "treadle/serialize.hpp"
#include "treadle/treadle.h"

struct treadle_replay {
  std::unique_ptr<treadle::ReplayBuffer> buffer;
};

using namespace treadle;
using capi::ArgumentError;
using capi::non_null;

namespace {

DType field_dtype(treadle_dtype d) {
  switch (d) {
    case TREADLE_F32: return DType::f32;
    case TREADLE_F64: return DType::f64;
    case TREADLE_I64: return DType::i64;
    case TREADLE_I32: return DType::i32;
    default: break;
  }
  throw ArgumentError("dtype must be TREADLE_F32, TREADLE_F64, TREADLE_I64 or TREADLE_I32, got " +
                      std::to_string(static_cast<int>(d)));
}

// One tensor per field over caller memory: n samples of the field's shape.
std::vector<Tensor> field_tensors(const ReplayBuffer& b, int64_t n, const void* const* data, const char* what) {
  non_null(data, what);
  std::vector<Tensor> out;
  for (std::size_t f = 0; f < b.fields().size(); ++f) {
    Shape shape{n};
    shape.insert(shape.end(), b.fields()[f].shape.begin(), b.fields()[f].shape.end());
    if (!data[f] && shape_numel(shape) > 0) throw ArgumentError(std::string(what) + "[" + std::to_string(f) + "] is NULL");
    out.push_back(Tensor::wrap(const_cast<void*>(data[f]), shape, b.fields()[f].dtype));
  }
  return out;
}

ReplayBuffers named_buffers(int n, const char* const* names, treadle_replay* const* buffers) {
  if (n < 0) throw ArgumentError("nbuffers must be >= 0, got " + std::to_string(n));
  ReplayBuffers out;
  if (n > 0) non_null(names, "names"), non_null(buffers, "buffers");
  for (int i = 0; i < n; ++i)
    out.emplace_back(non_null(names[i], "names[i]"), non_null(non_null(buffers[i], "buffers[i]")->buffer.get(), "buffers[i]"));
  return out;
}

}  // namespace

extern "C" {

int treadle_replay_create(const char* policy, int64_t capacity, int64_t min_size, int64_t max_reuse, uint64_t seed,
                          int nfields, const char* const* names, const int* ndims, const int64_t* shapes,
                          const treadle_dtype* dtypes, treadle_replay** out) {
  return capi::guarded_call("treadle_replay_create", [&] {
    *non_null(out, "out") = nullptr;
    if (nfields <= 0) throw ArgumentError("nfields must be positive, got " + std::to_string(nfields));
    non_null(names, "names"), non_null(ndims, "ndims"), non_null(dtypes, "dtypes");
    std::vector<ReplayField> fields;
    const int64_t* dims = shapes;
    for (int i = 0; i < nfields; ++i) {
      if (ndims[i] < 0 || ndims[i] > 16) throw ArgumentError("ndims[" + std::to_string(i) + "] must be in [0, 16]");
      if (ndims[i] > 0) non_null(dims, "shapes");
      fields.push_back({non_null(names[i], "names[i]"), Shape(dims, dims + ndims[i]), field_dtype(dtypes[i])});
      dims += ndims[i];
    }
    auto handle = std::make_unique<treadle_replay>();
    handle->buffer = std::make_unique<ReplayBuffer>(
        std::move(fields), ReplayOptions{replay_policy_from_name(non_null(policy, "policy")), capacity, min_size, max_reuse, seed});
    *out = handle.release();
  });
}

void treadle_replay_free(treadle_replay* buffer) { delete buffer; }

int treadle_replay_push(treadle_replay* buffer, int64_t n, const void* const* fields) {
  return capi::guarded_call("treadle_replay_push", [&] {
    ReplayBuffer& b = *non_null(buffer, "buffer")->buffer;
    if (n < 0) throw ArgumentError("n must be >= 0, got " + std::to_string(n));
    b.push(field_tensors(b, n, fields, "fields"));
  });
}

int treadle_replay_sample(treadle_replay* buffer, int64_t batch_size, void* const* fields) {
  return capi::guarded_call("treadle_replay_sample", [&] {
    ReplayBuffer& b = *non_null(buffer, "buffer")->buffer;
    if (batch_size <= 0) throw ArgumentError("batch_size must be positive, got " + std::to_string(batch_size));
    b.sample(batch_size, field_tensors(b, batch_size, fields, "fields"));
  });
}

int treadle_replay_ready(const treadle_replay* buffer, int64_t batch_size, int* ready) {
  return capi::guarded_call("treadle_replay_ready",
                            [&] { *non_null(ready, "ready") = non_null(buffer, "buffer")->buffer->ready(batch_size) ? 1 : 0; });
}

int treadle_replay_size(const treadle_replay* buffer, int64_t* size) {
  return capi::guarded_call("treadle_replay_size", [&] { *non_null(size, "size") = non_null(buffer, "buffer")->buffer->size(); });
}

int treadle_trainer_save_checkpoint(treadle_trainer* trainer, const char* path, int nbuffers, const char* const* names,
                                    treadle_replay* const* buffers) {
  return capi::guarded_call("treadle_trainer_save_checkpoint", [&] {
    save_checkpoint(non_null(path, "path"), *non_null(trainer, "trainer")->trainer, {}, named_buffers(nbuffers, names, buffers));
  });
}

int treadle_trainer_load_checkpoint(treadle_trainer* trainer, const char* path, int nbuffers, const char* const* names,
                                    treadle_replay* const* buffers) {
  return capi::guarded_call("treadle_trainer_load_checkpoint", [&] {
    load_checkpoint(non_null(path, "path"), *non_null(trainer, "trainer")->trainer, named_buffers(nbuffers, names, buffers));
  });
}

}  // extern "C"
