#pragma once
// A dense tensor: shape, strides (in elements), dtype, device and shared storage.
// Storage may own its memory or wrap memory owned elsewhere (a numpy array) with a keep-alive handle.
#include <cstdint>
#include <memory>

#include "treadle/dtype.hpp"

namespace treadle {

class TREADLE_API Storage {
 public:
  // Owned, 64-byte aligned, zero-initialised.
  explicit Storage(std::size_t bytes);
  // Borrowed: `owner` keeps the memory alive (may be null when the caller guarantees lifetime).
  Storage(void* data, std::size_t bytes, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  bool owned() const { return owned_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool owned_ = false;
  std::shared_ptr<void> owner_;
};

class TREADLE_API Tensor {
 public:
  Tensor() = default;
  // Fresh zero-filled contiguous tensor.
  Tensor(Shape shape, DType dtype);
  // View into `storage` at `offset_bytes`, contiguous.
  Tensor(std::shared_ptr<Storage> storage, std::size_t offset_bytes, Shape shape, DType dtype);
  // View with explicit strides (elements).
  Tensor(std::shared_ptr<Storage> storage, std::size_t offset_bytes, Shape shape, Shape strides, DType dtype);

  static Tensor wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> owner = nullptr);
  // A contiguous view of memory on `device` that the caller owns (e.g. a CuPy or torch CUDA array,
  // `owner` keeping it alive). Only what runs on that device reads it: a model on backend "cuda"
  // takes such tensors as inputs, targets and predict outputs (copied on the device). Everything
  // that reads data on the host (clone, copy_from, to, a CPU model) raises TypeError instead.
  static Tensor wrap_device(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<void> owner = nullptr);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + ndim() : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cpu() const { return device_.kind == DeviceKind::cpu; }
  // TypeError "<who>: expected a cpu tensor, got cuda:0" unless the data is host memory.
  void require_cpu(const char* who) const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* data() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data()); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Deep copy (contiguous result).
  Tensor clone() const;
  // Copy `src` (same shape and dtype, any strides) into this tensor.
  void copy_from(const Tensor& src);
  // Same data, converted to `dtype` (always a copy).
  Tensor to(DType dtype) const;
  // The same data on `device` (always a copy, contiguous, owned: device memory is freed with the last
  // tensor sharing it), or *this when it is there already. A CUDA build copies between the host and
  // cuda:N on `stream` (a cudaStream_t; null: a stream of the call's own) and waits for the copy;
  // a build without CUDA raises ValueError for a CUDA device. Device tensors feed a model on backend
  // "cuda" (Trainer, Model::predict) without an upload.
  Tensor to(Device device, void* stream = nullptr) const;
  Tensor reshape(Shape shape) const;  // contiguous tensors only; a view

 private:
  std::shared_ptr<Storage> storage_;
  std::size_t offset_ = 0;
  Shape shape_, strides_;
  DType dtype_ = DType::f32;
  Device device_{};
};

TREADLE_API Shape contiguous_strides(const Shape& shape);

// The most one host allocation (a tensor, a plan's arena, an output buffer) may take: this machine's
// physical memory, at most 2^47 bytes. Larger requests are refused with ValueError before any
// allocator sees them (a malloc of petabytes may abort instead of failing, e.g. under ASan).
TREADLE_API int64_t max_tensor_bytes();

// Bounds the bytes of the host tensors this thread creates while it lives. Loading builds a file's
// architecture under one sized from the file's own tensors: a description that declares more
// parameters than the file holds (a forged Linear(1, 2**62), or a cheap Linear(70000, 70000)) is
// refused, naming `what`, before it is allocated or initialised. Budgets nest; the innermost counts.
class TREADLE_API AllocationBudget {
 public:
  AllocationBudget(int64_t bytes, std::string what);
  ~AllocationBudget();
  AllocationBudget(const AllocationBudget&) = delete;
  AllocationBudget& operator=(const AllocationBudget&) = delete;
  // Called for every new tensor: throws ValueError when `bytes` more would pass this thread's budget.
  static void spend(int64_t bytes);

 private:
  int64_t left_;
  std::string what_;
  AllocationBudget* outer_;
};

}  // namespace treadle
