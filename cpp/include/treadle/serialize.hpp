#pragma once
// Files: safetensors reading and writing, model files and training checkpoints, all without Python.
//
// Format (the safetensors layout, readable by the `safetensors` package and by PyTorch tools): an
// 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {string: string}, name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...}
// padded with spaces, then the raw little-endian tensor bytes; offsets count from the end of the
// header and the tensors tile the payload without gaps. treadle reads and writes F32, F64, I32 and I64.
//
// Files written by treadle carry metadata keys prefixed "treadle.": the version, and a checksum
// "treadle.checksum" = "fnv1a64:<16 hex digits>" (FNV-1a 64) over a canonical form of the header
// followed by the payload, so a flipped bit anywhere is detected. The canonical form is, each field
// followed by a NUL byte: every metadata key and value except the checksum, in key order, then per
// tensor in payload order: name, dtype, shape (decimal, comma separated), begin, end. A file that
// shows treadle's marks (a "treadle." key, or a "fnv1a64:" value, each recognised with up to 2
// flipped bits) must carry a valid checksum, so no corruption of fewer than 9 bits passes
// unnoticed; files from other tools carry none and are read unverified.
//
// Writes are atomic: a temporary file in the destination's directory is written, flushed and
// fsynced, then renamed over the destination (and the directory fsynced), so a crash mid-write
// leaves the old file intact. Reads validate the whole header and the checksum before returning
// anything, and never read past the file: a truncated, corrupt or oversized-header file is a
// treadle::ValueError naming the file and the problem. I/O failures are std::system_error.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "treadle/model.hpp"
#include "treadle/replay.hpp"
#include "treadle/tensor.hpp"
#include "treadle/trainer.hpp"

namespace treadle {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// The library version written into files ("treadle.version").
TREADLE_API const char* serialize_version();

// Headers longer than this are rejected (as the safetensors package does).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// The contents of a safetensors file: tensors in payload order, and the "__metadata__" strings.
struct TREADLE_API TensorFile {
  NamedTensors tensors;
  Metadata metadata;
  std::string source;  // the path read (for messages), or "<memory>"
  const Tensor* find(const std::string& name) const;
};

// Writes `tensors` (CPU, any strides) with `metadata` plus treadle's version and checksum.
// Names must be unique, non-empty UTF-8; metadata keys may not start with "treadle.checksum".
TREADLE_API void save_safetensors(const std::string& path, const NamedTensors& tensors,
                                  const Metadata& metadata = {});
// The same file contents as bytes (no I/O).
TREADLE_API std::string safetensors_bytes(const NamedTensors& tensors, const Metadata& metadata = {});
// Reads and fully validates a file (header, offsets, checksum) into fresh tensors.
TREADLE_API TensorFile load_safetensors(const std::string& path);
// The same checks on bytes in memory (the fuzzing entry point).
TREADLE_API TensorFile parse_safetensors(const void* data, std::size_t size, const std::string& source = "<memory>");
// The header's metadata only (the header is validated; the payload is neither read nor checksummed).
TREADLE_API Metadata read_safetensors_metadata(const std::string& path);

// Model files: the parameters by name (PyTorch state_dict keys), "treadle.kind" = "model" and
// "treadle.dtype", plus the caller's metadata (e.g. "treadle.architecture", written by the Python
// package). Reserved keys (treadle.version/kind/dtype/checksum and the checkpoint keys) may not be given.
TREADLE_API void save_model(const std::string& path, const Model& model, const Metadata& metadata = {});
// Loads parameters from a model file, a checkpoint or any safetensors file whose tensor names and
// shapes are exactly the model's (float tensors are converted to the model's dtype). Everything is
// checked before the model is touched: on any error the model is unchanged. Returns the metadata.
TREADLE_API Metadata load_model(const std::string& path, Model& model);
TREADLE_API void load_model(const TensorFile& file, Model& model);

// Training checkpoints: parameters, the optimizer's state buffers ("optimizer:<name>"), its name,
// base learning rate and step count (which also drives the schedule), and the trainer context's
// RNG state (seed and counter) and, with dynamic loss scaling, the scale and its growth count
// ("treadle.loss_scale", "treadle.loss_scale_growth_tracker"), so a resumed run continues bit for
// bit. "treadle.kind" = "checkpoint".
// Save between steps: gradients and a pending forward (Trainer::forward without its backward) are
// not part of a checkpoint (every step starts by zeroing the gradients).
TREADLE_API void save_checkpoint(const std::string& path, Trainer& trainer, const Metadata& metadata = {});
// Restores a checkpoint into a trainer of the same architecture, dtype and optimizer kind; checks
// everything first, so on any error nothing changes. Returns the metadata.
TREADLE_API Metadata load_checkpoint(const std::string& path, Trainer& trainer);
TREADLE_API void load_checkpoint(const TensorFile& file, Trainer& trainer);
// The same with replay buffers, each saved under its name (tensors "replay:<name>:...", metadata
// "treadle.replay.<name>.*"): a resumed run samples the same batches. Loading checks the trainer's and
// every buffer's state (layout: policy, capacity, fields) before anything changes.
using ReplayBuffers = std::vector<std::pair<std::string, ReplayBuffer*>>;
TREADLE_API void save_checkpoint(const std::string& path, Trainer& trainer, const Metadata& metadata,
                                 const ReplayBuffers& buffers);
TREADLE_API Metadata load_checkpoint(const std::string& path, Trainer& trainer, const ReplayBuffers& buffers);

}  // namespace treadle
