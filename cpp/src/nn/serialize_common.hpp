#pragma once
// Shared by safetensors.cpp (the file format) and checkpoint.cpp (model files and checkpoints).
#include <string>

#include "treadle/serialize.hpp"

namespace treadle::serialize_detail {

// The safetensors dtype code ("F32", ...); TypeError for dtypes treadle does not write.
const char* safetensors_code(DType t);
// std::system_error with errno `err` and the message `what`.
[[noreturn]] void throw_io_error(int err, const std::string& what);
// save_safetensors with the caller's name in messages.
void write_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata,
                       const std::string& who);
// load_safetensors with the caller's name in messages.
TensorFile read_safetensors(const std::string& path, const std::string& who);

}  // namespace treadle::serialize_detail
