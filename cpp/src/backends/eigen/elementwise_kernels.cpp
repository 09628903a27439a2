// Reference elementwise kernels (add, sub, mul, div) with numpy broadcasting, mul3, the broadcast-undoing reduction and fill.
#include <algorithm>
#include <array>
#include <vector>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"

namespace treadle {
namespace {
using namespace eigen;

// Per-dimension values of one tensor, on the stack up to rank 8 (kernels never allocate); a higher
// rank, which no layer produces, falls back to the heap.
class DimArray {
 public:
  explicit DimArray(std::size_t n) : n_(n) {
    if (n > fixed_.size()) heap_.assign(n, 0);
  }
  int64_t& operator[](std::size_t i) { return n_ > fixed_.size() ? heap_[i] : fixed_[i]; }
  int64_t operator[](std::size_t i) const { return n_ > fixed_.size() ? heap_[i] : fixed_[i]; }

 private:
  std::size_t n_;
  std::array<int64_t, 8> fixed_{};
  std::vector<int64_t> heap_;
};

// Strides (in elements) of `in` viewed with the output's rank; broadcast dimensions get stride 0.
DimArray broadcast_strides(const Shape& in, const Shape& out) {
  DimArray s(out.size());
  int64_t stride = 1;
  for (int i = static_cast<int>(in.size()) - 1, o = static_cast<int>(out.size()) - 1; i >= 0; --i, --o) {
    s[o] = in[i] == 1 ? 0 : stride;
    stride *= in[i];
  }
  return s;
}

// Calls f(out_index, a_index, b_index) for every output element in [begin, end), in row-major order.
// The offsets move by the last dimension's strides along a row; the multi-index carries only at the
// end of a row.
template <typename F>
void for_each_broadcast(const Shape& out, const DimArray& sa, const DimArray& sb, int64_t begin, int64_t end,
                        F&& f) {
  if (begin >= end) return;  // nothing to visit; an empty output may have a zero extent to divide by
  const int nd = static_cast<int>(out.size());
  if (nd == 0) {
    f(0, 0, 0);
    return;
  }
  DimArray idx(nd);
  int64_t rem = begin;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % out[d];
    rem /= out[d];
  }
  const int64_t last = out[nd - 1], step_a = sa[nd - 1], step_b = sb[nd - 1];
  for (int64_t o = begin; o < end;) {
    int64_t ia = 0, ib = 0;
    for (int d = 0; d < nd; ++d) {
      ia += idx[d] * sa[d];
      ib += idx[d] * sb[d];
    }
    const int64_t run = std::min(last - idx[nd - 1], end - o);
    for (int64_t j = 0; j < run; ++j) f(o + j, ia + j * step_a, ib + j * step_b);
    o += run;
    idx[nd - 1] += run;
    for (int d = nd - 1; d > 0 && idx[d] == out[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

struct AddOp {
  template <typename X>
  static auto apply(const X& a, const X& b) { return a + b; }
};
struct SubOp {
  template <typename X>
  static auto apply(const X& a, const X& b) { return a - b; }
};
struct MulOp {
  template <typename X>
  static auto apply(const X& a, const X& b) { return a * b; }
};
struct DivOp {
  template <typename X>
  static auto apply(const X& a, const X& b) { return a / b; }
};

template <typename Op, typename T>
void binary_kernel(const KernelArgs& a) {
  const TensorRef &A = a.in[0], &B = a.in[1], &Y = a.out[0];
  const int64_t n = Y.numel;
  if (A.numel == n && B.numel == n) {  // same shape: one vectorised pass
    parallel_chunks(a.exec, n, kElementGrain, [&](int64_t i0, int64_t i1) {
      VecMap<T>(Y.ptr<T>() + i0, i1 - i0) =
          Op::apply(ConstVecMap<T>(A.ptr<T>() + i0, i1 - i0), ConstVecMap<T>(B.ptr<T>() + i0, i1 - i0));
    });
    return;
  }
  const int64_t cols = Y.dim(-1);
  if (A.numel == n && B.ndim() > 0 && B.numel == cols && B.dim(-1) == cols) {  // (..., C) op (C): bias-like
    parallel_chunks(a.exec, n / cols, std::max<int64_t>(1, kElementGrain / cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        VecMap<T>(Y.ptr<T>() + r * cols, cols) =
            Op::apply(ConstVecMap<T>(A.ptr<T>() + r * cols, cols), ConstVecMap<T>(B.ptr<T>(), cols));
    });
    return;
  }
  auto sa = broadcast_strides(*A.shape, *Y.shape), sb = broadcast_strides(*B.shape, *Y.shape);
  parallel_chunks(a.exec, n, kElementGrain, [&](int64_t i0, int64_t i1) {
    const T *pa = A.ptr<T>(), *pb = B.ptr<T>();
    T* py = Y.ptr<T>();
    for_each_broadcast(*Y.shape, sa, sb, i0, i1,
                       [&](int64_t o, int64_t ia, int64_t ib) { py[o] = Op::apply(pa[ia], pb[ib]); });
  });
}

// Comparisons: 1 or 0 in the operands' dtype, with numpy broadcasting.
struct GtOp { template <typename T> static bool test(T a, T b) { return a > b; } };
struct LtOp { template <typename T> static bool test(T a, T b) { return a < b; } };
struct GeOp { template <typename T> static bool test(T a, T b) { return a >= b; } };
struct LeOp { template <typename T> static bool test(T a, T b) { return a <= b; } };
struct EqOp { template <typename T> static bool test(T a, T b) { return a == b; } };
struct NeOp { template <typename T> static bool test(T a, T b) { return a != b; } };

template <typename Op, typename T>
void compare_kernel(const KernelArgs& a) {
  const TensorRef &A = a.in[0], &B = a.in[1], &Y = a.out[0];
  const T *pa = A.ptr<T>(), *pb = B.ptr<T>();
  T* py = Y.ptr<T>();
  if (A.numel == Y.numel && B.numel == Y.numel) {
    parallel_chunks(a.exec, Y.numel, kElementGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) py[i] = Op::test(pa[i], pb[i]) ? T(1) : T(0);
    });
    return;
  }
  auto sa = broadcast_strides(*A.shape, *Y.shape), sb = broadcast_strides(*B.shape, *Y.shape);
  parallel_chunks(a.exec, Y.numel, kElementGrain, [&](int64_t i0, int64_t i1) {
    for_each_broadcast(*Y.shape, sa, sb, i0, i1,
                       [&](int64_t o, int64_t ia, int64_t ib) { py[o] = Op::test(pa[ia], pb[ib]) ? T(1) : T(0); });
  });
}

template <typename Op>
void register_comparison(KernelTable& t, const char* op) {
  t.add(op, DType::f32, &compare_kernel<Op, float>);
  t.add(op, DType::f64, &compare_kernel<Op, double>);
  t.add(op, DType::i64, &compare_kernel<Op, int64_t>);
}

template <typename T>
void scale_kernel(const KernelArgs& a) {
  const T alpha = static_cast<T>(a.attrs().f("alpha"));
  parallel_chunks(a.exec, a.out[0].numel, kElementGrain, [&](int64_t i0, int64_t i1) {
    VecMap<T>(a.out[0].ptr<T>() + i0, i1 - i0) = alpha * ConstVecMap<T>(a.in[0].ptr<T>() + i0, i1 - i0);
  });
}

// ((a * b) * c) * alpha: the rounding of mul, mul and scale in turn, so a graph written with mul3
// keeps the bits of one written with the three ops.
template <typename T>
void mul3_kernel(const KernelArgs& a) {
  const T alpha = static_cast<T>(a.attrs().f("alpha"));
  const T *pa = a.in[0].ptr<T>(), *pb = a.in[1].ptr<T>(), *pc = a.in[2].ptr<T>();
  T* py = a.out[0].ptr<T>();
  parallel_chunks(a.exec, a.out[0].numel, kElementGrain, [&](int64_t i0, int64_t i1) {
    const int64_t n = i1 - i0;
    VecMap<T>(py + i0, n) =
        alpha * ((ConstVecMap<T>(pa + i0, n) * ConstVecMap<T>(pb + i0, n)) * ConstVecMap<T>(pc + i0, n));
  });
}

// Column sums of a row-major (rows, cols) matrix, reading it row by row (contiguous, vectorised).
// Each element sums blocks of kBlock rows in order and then the block sums in order: error grows
// with kBlock + rows / kBlock instead of rows, and the order never depends on the chunking.
template <typename T>
void column_sums(Executor& exec, const T* x, int64_t rows, int64_t cols, T* y) {
  constexpr int64_t kTile = 256, kBlock = 128;
  // Chunks of whole 64-column strips holding about kElementGrain elements: a smaller chunk costs
  // more to hand to a worker than to sum (a column's sum is the same in any chunk).
  const int64_t strips = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, rows) / 64);
  parallel_chunks(exec, cols, 64 * strips, [&](int64_t c0, int64_t c1) {
    for (int64_t t0 = c0; t0 < c1; t0 += kTile) {
      const int64_t w = std::min(kTile, c1 - t0);
      alignas(64) T block[kTile];
      VecMap<T> out(y + t0, w), acc(block, w);
      out.setZero();
      for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
        acc.setZero();
        for (int64_t r = r0; r < std::min(rows, r0 + kBlock); ++r) acc += ConstVecMap<T>(x + r * cols + t0, w);
        out += acc;
      }
    }
  });
}

// Sums the input over its broadcast dimensions. Parallel over output elements only, each summed
// in a fixed order, so it is deterministic under any chunking.
template <typename T>
void sum_to_kernel(const KernelArgs& a) {
  const TensorRef &X = a.in[0], &Y = a.out[0];
  const Shape& xs = *X.shape;
  const int64_t cols = X.dim(-1);
  if (Y.ndim() > 0 && !xs.empty() && Y.numel == cols && Y.dim(-1) == cols) {  // (..., C) -> (C): column sums
    column_sums(a.exec, X.ptr<T>(), X.numel / cols, cols, Y.ptr<T>());
    return;
  }
  const DimArray sy = broadcast_strides(*Y.shape, xs), unused(xs.size());
  T* py = Y.ptr<T>();
  const T* px = X.ptr<T>();
  for (int64_t i = 0; i < Y.numel; ++i) py[i] = T(0);
  for_each_broadcast(xs, sy, unused, 0, X.numel, [&](int64_t o, int64_t iy, int64_t) { py[iy] += px[o]; });
}

template <typename T>
void constant_kernel(const KernelArgs& a) {
  VecMap<T>(a.out[0].ptr<T>(), a.out[0].numel).setConstant(static_cast<T>(a.attrs().f("value")));
}

}  // namespace

void register_eigen_elementwise(KernelTable& t) {
  t.add("add", DType::f32, &binary_kernel<AddOp, float>);
  t.add("add", DType::f64, &binary_kernel<AddOp, double>);
  t.add("sub", DType::f32, &binary_kernel<SubOp, float>);
  t.add("sub", DType::f64, &binary_kernel<SubOp, double>);
  t.add("mul", DType::f32, &binary_kernel<MulOp, float>);
  t.add("mul", DType::f64, &binary_kernel<MulOp, double>);
  t.add("div", DType::f32, &binary_kernel<DivOp, float>);
  t.add("div", DType::f64, &binary_kernel<DivOp, double>);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "scale", scale_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "mul3", mul3_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "sum_to", sum_to_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "constant", constant_kernel);
  t.add("constant", DType::i64, &constant_kernel<int64_t>);  // integer scalars in comparisons and where
  register_comparison<GtOp>(t, "gt");
  register_comparison<LtOp>(t, "lt");
  register_comparison<GeOp>(t, "ge");
  register_comparison<LeOp>(t, "le");
  register_comparison<EqOp>(t, "eq");
  register_comparison<NeOp>(t, "ne");
}

}  // namespace treadle
