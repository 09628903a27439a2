#pragma once
// A register-blocked GEMM, C (M x N) = A (M x K) @ B (K x N), for the Eigen backend's small and
// medium products: a recurrent layer's per-step products (B packed once per call and reused by
// every step), its whole-sequence gradients, and the linear and matmul kernels (B packed per block).
//
// Why not Eigen's GEMM: at the sizes of a step (M = batch <= ~128, K and N = H or G*H <= ~1024)
// Eigen packs both operands on every product (for an LSTM of hidden size 64, a 16k-float weight
// matrix 32 times per sequence) and its kernel reaches ~60% of the FMA peak there. Here B is packed
// into column panels of kPanel = 2 packets (16 floats with AVX2), each panel K x kPanel contiguous
// and zero-padded past N, and A is read in place: a micro-kernel keeps a 6 x kPanel block of C in
// registers, broadcasting one element of A per row and loading the panel's row of B per k. A
// block of a panel (kKc x kPanel) stays in L1 across the row blocks.
//
// Every element of C is one sequential sum over k in a single accumulator, in the same order
// whatever M, the row block it falls in or the packet width: results do not depend on the batch
// split or the workers. Header-only, so each instruction-set variant of the kernels
// (cmake/TreadleEigenVariants.cmake) compiles it with its own packets.
#include <algorithm>
#include <cstdint>

#include <Eigen/Core>

namespace treadle::eigen::small_gemm {

template <typename T>
using Packet = typename Eigen::internal::packet_traits<T>::type;
template <typename T>
constexpr int kPacket = Eigen::internal::unpacket_traits<Packet<T>>::size;
// Where it beats Eigen's GEMM (measured at 32 x 64 @ 64 x 256, 32 x 256 @ 256 x 64 and
// 128 x 128 @ 128 x 512, B's packing left out): 1.45-1.6x in float and 1.4-1.8x in double with AVX2
// and FMA; without FMA (a multiply and an add per step) 0.6-1.0x, so callers keep Eigen there.
#ifdef EIGEN_VECTORIZE_FMA
constexpr bool kBeatsEigen = true;
#else
constexpr bool kBeatsEigen = false;
#endif

// Packets per panel and rows per micro-kernel, BLIS's AVX2 shape: 12 accumulators, 2 B packets and
// a broadcast take 15 of AVX2's 16 vector registers, and 8 loads feed 12 FMAs, so the FMA units set
// the pace (a 4 x 3 block needs 16 loads per 12 FMAs and ran at half the speed on AMD Zen 3).
constexpr int kPanelPackets = 2;
constexpr int kRows = 6;  // panel_block() handles the 1-5 leftover rows by name
template <typename T>
constexpr int kPanel = kPanelPackets * kPacket<T>;
// Upper bound of kPanel over every instruction set (AVX-512 float: 32), for sizing buffers
// in code that does not know the packet width.
constexpr int64_t kMaxPanel = 64;
static_assert(kPanel<float> <= kMaxPanel && kPanel<double> <= kMaxPanel);

// Rows of B per pass over a panel: a kKc x kPanel block of B (16 KiB of float with AVX2) stays in
// L1 while the micro-kernels run down A's rows. Products with K above it add kKc-long partial sums
// into C in order of k, the same order for every row block and every worker.
constexpr int64_t kKc = 256;

// An operand in place: element (r, c) at p[r * ld + c], or at p[c * ld + r] when `transposed`.
template <typename T>
struct View {
  const T* p;
  int64_t ld;
  bool transposed = false;
};

// Elements of the packed form of a K x N matrix: whole panels (at most K * (N + kMaxPanel - 1)).
template <typename T>
int64_t packed_elems(int64_t K, int64_t N) {
  return K * ((N + kPanel<T> - 1) / kPanel<T>) * kPanel<T>;
}

// Rows [k0, k0 + kc) of B's panel starting at column j0 into `out` (kc x kPanel, zero past N).
template <typename T>
void pack_panel(const View<T>& b, int64_t k0, int64_t kc, int64_t j0, int64_t N, T* out) {
  constexpr int P = kPanel<T>;
  const int64_t cols = std::min<int64_t>(P, N - j0);
  if (b.transposed) {  // B's columns are rows of memory: read each one in order, write it down the panel
    for (int64_t j = 0; j < P; ++j) {
      if (j < cols) {
        const T* src = b.p + (j0 + j) * b.ld + k0;
        for (int64_t k = 0; k < kc; ++k) out[k * P + j] = src[k];
      } else {
        for (int64_t k = 0; k < kc; ++k) out[k * P + j] = T(0);
      }
    }
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    T* row = out + k * P;
    std::copy(b.p + (k0 + k) * b.ld + j0, b.p + (k0 + k) * b.ld + j0 + cols, row);
    std::fill(row + cols, row + P, T(0));
  }
}

// B (K x N) packed whole into `out` (packed_elems(K, N) elements): panel after panel, each K x kPanel.
template <typename T>
void pack(const View<T>& b, int64_t K, int64_t N, T* out) {
  for (int64_t j0 = 0; j0 < N; j0 += kPanel<T>, out += K * kPanel<T>) pack_panel(b, 0, K, j0, N, out);
}

// C rows [0, R) x panel columns [0, cols) (cols <= kPanel) = (or +=) A rows @ panel rows [0, K).
template <typename T, int R, bool ATransposed>
void micro_kernel(const T* a, int64_t lda, const T* panel, int64_t K, T* c, int64_t ldc, int64_t cols,
                  bool accumulate) {
  using P = Packet<T>;
  constexpr int S = kPacket<T>, NP = kPanelPackets;
  P acc[R][NP];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NP; ++j) acc[i][j] = Eigen::internal::pset1<P>(T(0));
  for (int64_t k = 0; k < K; ++k) {
    const T* brow = panel + k * NP * S;
    P b[NP];
    for (int j = 0; j < NP; ++j) b[j] = Eigen::internal::ploadu<P>(brow + j * S);
    for (int i = 0; i < R; ++i) {
      const P ai = Eigen::internal::pset1<P>(ATransposed ? a[k * lda + i] : a[i * lda + k]);
      for (int j = 0; j < NP; ++j) acc[i][j] = Eigen::internal::pmadd(ai, b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i) {
    T* crow = c + i * ldc;
    for (int j = 0; j < NP; ++j) {
      const int64_t j0 = int64_t{j} * S;
      if (j0 >= cols) break;
      if (j0 + S <= cols) {
        P v = acc[i][j];
        if (accumulate) v = Eigen::internal::padd(Eigen::internal::ploadu<P>(crow + j0), v);
        Eigen::internal::pstoreu(crow + j0, v);
        continue;
      }
      alignas(64) T tail[S];  // a partial packet at the matrix's right edge
      Eigen::internal::pstoreu(tail, acc[i][j]);
      for (int64_t q = 0; j0 + q < cols; ++q) crow[j0 + q] = accumulate ? crow[j0 + q] + tail[q] : tail[q];
    }
  }
}

// C (M x cols) = (or +=) A (M x kc) @ one packed panel block (kc x kPanel): row blocks of kRows.
template <typename T, bool ATransposed>
void panel_block(const T* a, int64_t lda, int64_t M, const T* panel, int64_t kc, T* c, int64_t ldc, int64_t cols,
                 bool accumulate) {
  // Row i of A starts at a + i * lda, or at a + i when A is transposed (its rows are columns).
  const int64_t row_step = ATransposed ? 1 : lda;
  int64_t i = 0;
  for (; i + kRows <= M; i += kRows)
    micro_kernel<T, kRows, ATransposed>(a + i * row_step, lda, panel, kc, c + i * ldc, ldc, cols, accumulate);
  const T* ar = a + i * row_step;
  T* cr = c + i * ldc;
  switch (M - i) {
    case 5: micro_kernel<T, 5, ATransposed>(ar, lda, panel, kc, cr, ldc, cols, accumulate); break;
    case 4: micro_kernel<T, 4, ATransposed>(ar, lda, panel, kc, cr, ldc, cols, accumulate); break;
    case 3: micro_kernel<T, 3, ATransposed>(ar, lda, panel, kc, cr, ldc, cols, accumulate); break;
    case 2: micro_kernel<T, 2, ATransposed>(ar, lda, panel, kc, cr, ldc, cols, accumulate); break;
    case 1: micro_kernel<T, 1, ATransposed>(ar, lda, panel, kc, cr, ldc, cols, accumulate); break;
    default: break;
  }
}

// Runs panel_block over every (K block, panel) of the product; `panel_at(j0, k0, kc)` gives the
// packed kc x kPanel block of B at column j0, rows k0... K blocks outermost: a long K (a weight
// gradient over every row of a sequence, megabytes of A) is read from memory once, each block
// staying in L2 while every panel passes over it, rather than once per panel.
template <typename T, typename PanelAt>
void blocked_product(const View<T>& a, int64_t M, int64_t K, int64_t N, T* c, int64_t ldc, bool accumulate,
                     PanelAt&& panel_at) {
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int64_t kc = std::min(kKc, K - k0);
    const bool acc = accumulate || k0 > 0;
    const T* ak = a.transposed ? a.p + k0 * a.ld : a.p + k0;
    for (int64_t j0 = 0; j0 < N; j0 += kPanel<T>) {
      const int64_t cols = std::min<int64_t>(kPanel<T>, N - j0);
      const T* panel = panel_at(j0, k0, kc);
      if (a.transposed) panel_block<T, true>(ak, a.ld, M, panel, kc, c + j0, ldc, cols, acc);
      else panel_block<T, false>(ak, a.ld, M, panel, kc, c + j0, ldc, cols, acc);
    }
  }
}

// C (M x N, row stride ldc) = A (M x K) @ B, B packed whole by pack(.., K, N, ..); with
// `accumulate`, C += the product.
template <typename T>
void multiply(const View<T>& a, int64_t M, const T* packed, int64_t K, int64_t N, T* c, int64_t ldc,
              bool accumulate = false) {
  blocked_product(a, M, K, N, c, ldc, accumulate, [&](int64_t j0, int64_t k0, int64_t) {
    return packed + (j0 / kPanel<T>) * K * kPanel<T> + k0 * kPanel<T>;
  });
}

// The same with B in place: each kKc x kPanel block of B is packed on the stack just before use
// (K * N copies per product, for products that run once).
template <typename T>
void multiply(const View<T>& a, int64_t M, const View<T>& b, int64_t K, int64_t N, T* c, int64_t ldc,
              bool accumulate = false) {
  alignas(64) T block[kKc * kPanel<T>];
  blocked_product(a, M, K, N, c, ldc, accumulate, [&](int64_t j0, int64_t k0, int64_t kc) {
    pack_panel(b, k0, kc, j0, N, block);
    return static_cast<const T*>(block);
  });
}

template <typename T>
using ConstStrided = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                                Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using Strided =
    Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned, Eigen::OuterStride<>>;

// f(the rows x cols Eigen expression of operand v): a strided map, or the transpose of one.
template <typename T, typename F>
void as_eigen(const View<T>& v, int64_t rows, int64_t cols, F&& f) {
  if (v.transposed) f(ConstStrided<T>(v.p, cols, rows, Eigen::OuterStride<>(v.ld)).transpose());
  else f(ConstStrided<T>(v.p, rows, cols, Eigen::OuterStride<>(v.ld)));
}

// The same product on Eigen's GEMM, for the sizes and CPUs where small_gemm does not pay.
template <typename T>
void eigen_product(const View<T>& a, int64_t M, const View<T>& b, int64_t K, int64_t N, T* c, int64_t ldc,
                   bool accumulate = false) {
  Strided<T> C(c, M, N, Eigen::OuterStride<>(ldc));
  as_eigen(a, M, K, [&](const auto& A) {
    as_eigen(b, K, N, [&](const auto& B) {
      if (accumulate) C.noalias() += A * B;
      else C.noalias() = A * B;
    });
  });
}

// C (M x N) = (or +=) A @ B on small_gemm where it beats Eigen's GEMM (kBeatsEigen), else on Eigen's.
template <typename T>
void product(const View<T>& a, int64_t M, const View<T>& b, int64_t K, int64_t N, T* c, int64_t ldc,
             bool accumulate = false) {
  if constexpr (kBeatsEigen) multiply(a, M, b, K, N, c, ldc, accumulate);
  else eigen_product(a, M, b, K, N, c, ldc, accumulate);
}

}  // namespace treadle::eigen::small_gemm
