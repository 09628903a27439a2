// Eigen reference kernels for the shape ops. They only move bytes, so one function per op serves
// every dtype (the element size comes from the tensor). Each view is (outer rows) x (row bytes)
// around the op's axis; rows are split over the executor.
#include <algorithm>
#include <cstring>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"

namespace treadle {
namespace eigen {
namespace {

constexpr DType kAllDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};

// Product of the dims of t before `axis` (outer) and after it (inner).
int64_t outer_of(const TensorRef& t, int axis) {
  int64_t n = 1;
  for (int d = 0; d < axis; ++d) n *= t.dim(d);
  return n;
}

int64_t inner_of(const TensorRef& t, int axis) {
  int64_t n = 1;
  for (int d = axis + 1; d < t.ndim(); ++d) n *= t.dim(d);
  return n;
}

// Rows per chunk so that a chunk moves about kElementGrain elements.
int64_t row_grain(int64_t row_elems) { return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, row_elems)); }

// reshape and flatten alias their input in a plan; a backend that runs them anyway gets a copy.
void copy_kernel(const KernelArgs& a) {
  if (a.out[0].data == a.in[0].data) return;
  const std::size_t es = dtype_size(a.in[0].dtype);
  const char* src = static_cast<const char*>(a.in[0].data);
  char* dst = static_cast<char*>(a.out[0].data);
  parallel_chunks(a.exec, a.in[0].numel, kElementGrain, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b * es, src + b * es, (e - b) * es);
  });
}

void concat_kernel(const KernelArgs& a) {
  const int axis = static_cast<int>(a.attrs().i("axis"));
  const std::size_t es = dtype_size(a.out[0].dtype);
  const int64_t outer = outer_of(a.out[0], axis);
  const int64_t inner = inner_of(a.out[0], axis);
  const int64_t out_row = a.out[0].dim(axis) * inner;  // elements per output row
  char* dst = static_cast<char*>(a.out[0].data);
  parallel_chunks(a.exec, outer, row_grain(out_row), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t offset = r * out_row;
      for (int k = 0; k < a.num_in; ++k) {
        const int64_t row = a.in[k].dim(axis) * inner;
        if (row > 0) std::memcpy(dst + offset * es, static_cast<const char*>(a.in[k].data) + r * row * es, row * es);
        offset += row;
      }
    }
  });
}

void slice_kernel(const KernelArgs& a) {
  const int axis = static_cast<int>(a.attrs().i("axis"));
  const int64_t start = a.attrs().i("start");
  const std::size_t es = dtype_size(a.in[0].dtype);
  const int64_t inner = inner_of(a.in[0], axis);
  const int64_t in_row = a.in[0].dim(axis) * inner;
  const int64_t out_row = a.out[0].dim(axis) * inner;
  const char* src = static_cast<const char*>(a.in[0].data);
  char* dst = static_cast<char*>(a.out[0].data);
  parallel_chunks(a.exec, outer_of(a.in[0], axis), row_grain(out_row), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      std::memcpy(dst + r * out_row * es, src + (r * in_row + start * inner) * es, out_row * es);
  });
}

// dy into rows of zeros: [0, start) and [stop, size) along the axis are zero (all-zero bits is
// zero in every supported dtype).
void slice_backward_kernel(const KernelArgs& a) {
  const int axis = static_cast<int>(a.attrs().i("axis"));
  const int64_t start = a.attrs().i("start");
  const std::size_t es = dtype_size(a.in[0].dtype);
  const int64_t inner = inner_of(a.out[0], axis);
  const int64_t in_row = a.in[0].dim(axis) * inner;
  const int64_t out_row = a.out[0].dim(axis) * inner;
  const int64_t head = start * inner;
  const int64_t tail = out_row - head - in_row;
  const char* src = static_cast<const char*>(a.in[0].data);
  char* dst = static_cast<char*>(a.out[0].data);
  parallel_chunks(a.exec, outer_of(a.out[0], axis), row_grain(out_row), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      char* row = dst + r * out_row * es;
      std::memset(row, 0, head * es);
      if (in_row > 0) std::memcpy(row + head * es, src + r * in_row * es, in_row * es);
      std::memset(row + (head + in_row) * es, 0, tail * es);
    }
  });
}

}  // namespace
}  // namespace eigen

void register_eigen_shape(KernelTable& t) {
  using namespace eigen;
  for (DType dt : kAllDtypes) {
    t.add("reshape", dt, &copy_kernel);
    t.add("flatten", dt, &copy_kernel);
    t.add("concat", dt, &concat_kernel);
    t.add("slice", dt, &slice_kernel);
    t.add("slice_backward", dt, &slice_backward_kernel);
  }
}

}  // namespace treadle
