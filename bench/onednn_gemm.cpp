// One float32 product C = op(A) op(B), row-major, timed three ways on the calling thread: oneDNN's
// matmul reading the operands in place, oneDNN reading a copy of each operand whose leading
// dimension is a multiple of 1024 floats with its rows padded by 16 floats (the copy is timed
// too), and Eigen's GEMM. Buffers are 64-byte aligned and apart, as in treadle's arena. Built and
// run by bench/onednn_gemm.py, which passes "ta tb m n k" lines on stdin and reads one line of
// GFLOP/s per product back: "inplace padded eigen" (medians of 7 after a warm-up).
#include <dnnl.hpp>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <unordered_map>
#include <vector>

namespace {
using dnnl::memory;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <typename F>
double gflops(double flops, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + 3, t.end());
  return flops / t[3] / 1e9;
}

float* aligned(std::vector<float>& v) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t{63});
}

// A stored (rows x cols) matrix and the leading dimension oneDNN reads it with.
struct Operand {
  const float* src;
  float* copy;
  int64_t rows, cols, ld;
  void refresh() const {
    if (ld == cols) return;
    for (int64_t r = 0; r < rows; ++r) std::memcpy(copy + r * ld, src + r * cols, cols * sizeof(float));
  }
  const float* data() const { return ld == cols ? src : copy; }
};

double onednn(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const auto f32 = memory::data_type::f32;
  const memory::desc ad = ta ? memory::desc({m, k}, f32, {1, a.ld}) : memory::desc({m, k}, f32, {a.ld, 1});
  const memory::desc bd = tb ? memory::desc({k, n}, f32, {1, b.ld}) : memory::desc({k, n}, f32, {b.ld, 1});
  const memory::desc cd({m, n}, f32, {n, 1});
  dnnl::matmul prim(dnnl::matmul::primitive_desc(eng, ad, bd, cd));
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(ad, eng, const_cast<float*>(a.data()))},
                                       {DNNL_ARG_WEIGHTS, memory(bd, eng, const_cast<float*>(b.data()))},
                                       {DNNL_ARG_DST, memory(cd, eng, c)}};
  return gflops(2.0 * m * n * k, [&] {
    a.refresh();
    b.refresh();
    prim.execute(s, args);
    s.wait();
  });
}

double eigen(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  Eigen::Map<const Mat> A(a, ta ? k : m, ta ? m : k), B(b, tb ? n : k, tb ? k : n);
  Eigen::Map<Mat> C(c, m, n);
  return gflops(2.0 * m * n * k, [&] {
    if (ta && tb) C.noalias() = A.transpose() * B.transpose();
    else if (ta) C.noalias() = A.transpose() * B;
    else if (tb) C.noalias() = A * B.transpose();
    else C.noalias() = A * B;
  });
}

int64_t padded(int64_t cols) { return cols % 1024 == 0 ? cols + 16 : cols; }
}  // namespace

int main() {
  int ta, tb;
  long long m, n, k;
  while (std::cin >> ta >> tb >> m >> n >> k) {
    const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    std::vector<float> va(ar * ac + 16, 0.5f), vb(br * bc + 16, 0.25f), vc(m * n + 16);
    std::vector<float> pa(ar * (ac + 16) + 16), pb(br * (bc + 16) + 16);
    float *a = aligned(va), *b = aligned(vb), *c = aligned(vc);
    const Operand in_a{a, aligned(pa), ar, ac, ac}, in_b{b, aligned(pb), br, bc, bc};
    const Operand pad_a{a, aligned(pa), ar, ac, padded(ac)}, pad_b{b, aligned(pb), br, bc, padded(bc)};
    const double g0 = onednn(ta, tb, m, n, k, in_a, in_b, c);
    const double g1 = onednn(ta, tb, m, n, k, pad_a, pad_b, c);
    const double g2 = eigen(ta, tb, m, n, k, a, b, c);
    std::printf("%.2f %.2f %.2f\n", g0, g1, g2);
    std::fflush(stdout);
  }
}
