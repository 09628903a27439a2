#include "treadle/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include <unistd.h>

#include "backends/device_runtime.hpp"
#include "treadle/error.hpp"

namespace treadle {

namespace {
constexpr std::size_t kAlignment = 64;

template <typename To, typename From>
void convert(To* dst, const From* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(src[i]);
}

template <typename To>
void convert_from(To* dst, const void* src, DType from, int64_t n) {
  switch (from) {
    case DType::f32: convert(dst, static_cast<const float*>(src), n); break;
    case DType::f64: convert(dst, static_cast<const double*>(src), n); break;
    case DType::i32: convert(dst, static_cast<const int32_t*>(src), n); break;
    case DType::i64: convert(dst, static_cast<const int64_t*>(src), n); break;
    default: throw_type_error("Tensor.to: conversion from ", dtype_name(from), " is not supported");
  }
}
}  // namespace

Storage::Storage(std::size_t bytes) : bytes_(bytes), owned_(true) {
  std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  data_ = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, rounded == 0 ? kAlignment : rounded);
}

Storage::Storage(void* data, std::size_t bytes, std::shared_ptr<void> owner)
    : data_(data), bytes_(bytes), owned_(false), owner_(std::move(owner)) {}

Storage::~Storage() {
  if (owned_) std::free(data_);
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

// The most one host tensor may hold: this machine's physical memory (a larger one could only be
// touched by swapping or the OOM killer, well after the call that asked for it), and never more than
// 2^47 bytes, far below where byte counts and the planner's offsets overflow.
int64_t max_tensor_bytes() {
  static const int64_t limit = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    const int64_t cap = int64_t{1} << 47;
    return pages > 0 && page > 0 && pages < cap / page ? static_cast<int64_t>(pages) * page : cap;
  }();
  return limit;
}

namespace {
// Bytes of a new dense tensor, refusing negative dimensions and absurd sizes with a ValueError that
// names the shape (they used to wrap around and crash later).
std::size_t checked_bytes(const Shape& shape, DType dtype) {
  for (int64_t d : shape)
    if (d < 0) throw_value_error("Tensor: negative dimension in shape ", shape_str(shape));
  const int64_t n = shape_numel(shape);
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(dtype)), &bytes) || bytes > max_tensor_bytes())
    throw_value_error("Tensor: shape ", shape_str(shape), " of ", dtype_name(dtype), " needs ", n, " elements, more "
                      "than the ", max_tensor_bytes(), " bytes one tensor may hold (this machine's memory)");
  AllocationBudget::spend(bytes);
  return static_cast<std::size_t>(bytes);
}

thread_local AllocationBudget* current_budget = nullptr;
}  // namespace

AllocationBudget::AllocationBudget(int64_t bytes, std::string what)
    : left_(bytes), what_(std::move(what)), outer_(current_budget) {
  current_budget = this;
}

AllocationBudget::~AllocationBudget() { current_budget = outer_; }

void AllocationBudget::spend(int64_t bytes) {
  AllocationBudget* b = current_budget;
  if (!b) return;
  if (bytes > b->left_)
    throw_value_error(b->what_, ": needs a tensor of ", bytes, " bytes, past the ", b->left_,
                      " bytes left of its budget");
  b->left_ -= bytes;
}

Tensor::Tensor(Shape shape, DType dtype)
    : storage_(std::make_shared<Storage>(checked_bytes(shape, dtype))),
      shape_(std::move(shape)),
      dtype_(dtype) {
  strides_ = contiguous_strides(shape_);
}

Tensor::Tensor(std::shared_ptr<Storage> storage, std::size_t offset_bytes, Shape shape, DType dtype)
    : storage_(std::move(storage)), offset_(offset_bytes), shape_(std::move(shape)), dtype_(dtype) {
  strides_ = contiguous_strides(shape_);
  if (offset_ + nbytes() > storage_->bytes())
    throw_value_error("Tensor: view of ", nbytes(), " bytes at offset ", offset_, " exceeds storage of ",
                      storage_->bytes(), " bytes");
}

Tensor::Tensor(std::shared_ptr<Storage> storage, std::size_t offset_bytes, Shape shape, Shape strides, DType dtype)
    : storage_(std::move(storage)), offset_(offset_bytes), shape_(std::move(shape)), strides_(std::move(strides)),
      dtype_(dtype) {}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> owner) {
  std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(std::make_shared<Storage>(data, bytes, std::move(owner)), 0, std::move(shape), dtype);
}

Tensor Tensor::wrap_device(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<void> owner) {
  if (device.kind == DeviceKind::cpu) throw_value_error("Tensor.wrap_device: device must not be the CPU (use wrap)");
  Tensor t = wrap(data, std::move(shape), dtype, std::move(owner));
  t.device_ = device;
  return t;
}

void Tensor::require_cpu(const char* who) const {
  if (device_.kind != DeviceKind::cpu)
    throw_type_error(who, ": expected a cpu tensor, got ", device_name(device_), " (device memory is read on its device ",
                     "only: a model on backend 'cuda' takes it)");
}

// Row-major without gaps. Checked in place (no temporary strides vector): it runs on every step.
bool Tensor::is_contiguous() const {
  if (numel() <= 1) return true;
  int64_t expected = 1;
  for (int d = ndim() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

Tensor Tensor::clone() const {
  require_cpu("Tensor.clone");
  Tensor out(shape_, dtype_);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  require_cpu("Tensor.copy_from");
  src.require_cpu("Tensor.copy_from");
  if (src.shape() != shape_ || src.dtype() != dtype_)
    throw_value_error("Tensor.copy_from: expected ", dtype_name(dtype_), shape_str(shape_), ", got ",
                      dtype_name(src.dtype()), shape_str(src.shape()));
  if (is_contiguous() && src.is_contiguous()) {
    std::memmove(data(), src.data(), nbytes());
    return;
  }
  // General strided copy, element by element in row-major order.
  const std::size_t es = dtype_size(dtype_);
  const int nd = ndim();
  std::vector<int64_t> idx(nd, 0);
  for (int64_t n = 0, total = numel(); n < total; ++n) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < nd; ++d) {
      so += idx[d] * src.strides()[d];
      doff += idx[d] * strides_[d];
    }
    std::memcpy(static_cast<char*>(data()) + doff * es, static_cast<const char*>(src.data()) + so * es, es);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape_[d]) break;
      idx[d] = 0;
    }
  }
}

Tensor Tensor::to(Device device, void* stream) const {
  if (device == device_) return *this;
  const Device other = device.kind != DeviceKind::cpu ? device : device_;  // the side that is not the host
  return require_device_runtime(other, "Tensor.to").copy(*this, device, stream);
}

Tensor Tensor::to(DType dtype) const {
  require_cpu("Tensor.to");
  Tensor src = is_contiguous() ? *this : clone();
  Tensor out(shape_, dtype);
  const int64_t n = numel();
  switch (dtype) {
    case DType::f32: convert_from(out.data_as<float>(), src.data(), dtype_, n); break;
    case DType::f64: convert_from(out.data_as<double>(), src.data(), dtype_, n); break;
    case DType::i32: convert_from(out.data_as<int32_t>(), src.data(), dtype_, n); break;
    case DType::i64: convert_from(out.data_as<int64_t>(), src.data(), dtype_, n); break;
    default: throw_type_error("Tensor.to: conversion to ", dtype_name(dtype), " is not supported");
  }
  return out;
}

Tensor Tensor::reshape(Shape shape) const {
  if (!is_contiguous()) throw_value_error("Tensor.reshape: tensor is not contiguous");
  if (shape_numel(shape) != numel())
    throw_value_error("Tensor.reshape: cannot reshape ", shape_str(shape_), " to ", shape_str(shape));
  Tensor view(storage_, offset_, std::move(shape), dtype_);
  view.device_ = device_;
  return view;
}

}  // namespace treadle
