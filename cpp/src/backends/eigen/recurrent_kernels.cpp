// Eigen reference kernels for the fused recurrent layer ops (see ops/recurrent.hpp for the slots).
//
// Forward: one GEMM projects the whole input sequence (x @ W_ih^T + b_ih) into the output or the
// saved buffer; then each step does one GEMM h @ W_hh^T over the samples still running (StepProduct:
// W_hh packed once per call) and the gate arithmetic row by row, in place. Backward walks the steps
// in reverse with one GEMM per step (dgates @ W_hh), keeping the gate gradients and previous states
// of the whole sequence in its scratch; dW_ih, dW_hh, the biases and dx are then one GEMM (or column
// sum) each. The time loops of both passes run in pieces of samples on the host's workers
// (over_sample_pieces); the products run on small_gemm where it beats Eigen's GEMM.
//
// Variable lengths: samples are run in order of decreasing length (ties by index), so the samples
// still running at step s are the prefix [0, active) of the run order and each step's GEMM touches
// only them. A sample's state is frozen once it ends, which leaves its final state in place; its
// outputs past its length are zeros. With `reverse`, sample n runs its valid steps len[n]-1 .. 0.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "backends/eigen/small_gemm.hpp"
#include "backends/eigen/transcendental.hpp"
#include "ops/recurrent.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {
using namespace eigen;
using rnn::Cell;
using rnn::CellInfo;

template <typename T>
using StridedMapR = Eigen::Map<MatrixR<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using RowVec = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;

// Rows per chunk of the whole-sequence input projection: as the linear kernels, at least 128 (an
// efficient GEMM each) and ~64k multiply-adds; it depends on the problem only, never on the workers.
int64_t row_grain(int64_t flops_per_row) {
  return std::max<int64_t>(128, (1 << 16) / std::max<int64_t>(1, flops_per_row));
}

// Dimensions and row addressing shared by forward and backward. Sequence tensors (x, y, saved and
// the backward's whole-sequence scratch) all use x's layout; row(t, n) is the (t, n) row's index.
struct Dims {
  int64_t T, N, I, H;
  bool batch_first, reverse;
  int64_t row(int64_t t, int64_t n) const { return batch_first ? n * T + t : t * N + n; }
};

// `seq` is a sequence input (x for forward, y for backward).
Dims dims_of(const KernelArgs& a, int seq, int w_hh) {
  const bool bf = a.attrs().i("batch_first") != 0;
  const TensorRef& xr = a.in[seq];
  return {bf ? xr.dim(1) : xr.dim(0), bf ? xr.dim(0) : xr.dim(1), xr.dim(2), a.in[w_hh].dim(1), bf,
          a.attrs().i("reverse") != 0};
}

// The run order of the samples and the time index of each sample's s-th step.
struct Schedule {
  const int64_t* perm;  // run position -> sample
  const int64_t* len;   // per sample; null: every sample runs all T steps
  int64_t T;
  bool reverse;
  int64_t length(int64_t n) const { return len ? len[n] : T; }
  int64_t time(int64_t s, int64_t n) const { return reverse ? length(n) - 1 - s : s; }
  // Number of samples that run step s (the prefix of the run order).
  int64_t active(int64_t s, int64_t N) const {
    if (!len) return N;
    int64_t lo = 0, hi = N;  // lengths decrease along the run order
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (len[perm[mid]] > s) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
};

Schedule make_schedule(const KernelArgs& a, int lengths, const Dims& d, int64_t* perm) {
  const int64_t* len = lengths >= 0 ? a.in[lengths].ptr<int64_t>() : nullptr;
  for (int64_t n = 0; n < d.N; ++n) perm[n] = n;
  if (len) {
    for (int64_t n = 0; n < d.N; ++n)
      if (len[n] < 1 || len[n] > d.T)
        throw_value_error(a.attrs().s("name"), ": lengths must be in [1, ", d.T, "] (the sequence length), got lengths[",
                          n, "] = ", len[n]);
    std::sort(perm, perm + d.N, [len](int64_t p, int64_t q) { return len[p] != len[q] ? len[p] > len[q] : p < q; });
  }
  return {perm, len, d.T, d.reverse};
}

// out(rows x n, row stride ldo) = in(rows x k) @ w(n x k)^T (+ bias), rows split over the executor.
template <typename T>
void gemm_nt(Executor& exec, const T* in, int64_t rows, int64_t k, const T* w, int64_t n, const T* bias, T* out,
             int64_t ldo) {
  parallel_chunks(exec, rows, row_grain(n * k), [&](int64_t r0, int64_t r1) {
    small_gemm::product<T>({in + r0 * k, k}, r1 - r0, {w, k, /*transposed=*/true}, k, n, out + r0 * ldo, ldo);
    if (bias) StridedMapR<T>(out + r0 * ldo, r1 - r0, n, Eigen::OuterStride<>(ldo)).rowwise() += RowVec<T>(bias, n);
  });
}

// The hidden-side product of every step, C (rows x N) = (or +=) A (rows x K) @ B, with B = W^T for
// W (N x K) in the forward and B = W (K x N) in the backward, W being W_hh. Where small_gemm beats
// Eigen's GEMM, B is packed once per call into `scratch` (the workspace's tail, see
// rnn::packed_hidden_weight_bytes) and every step reuses it.
template <typename T>
class StepProduct {
 public:
  StepProduct(const T* w, int64_t K, int64_t N, bool transposed, void* scratch)
      : b_{w, transposed ? K : N, transposed}, K_(K), N_(N) {
    if constexpr (!small_gemm::kBeatsEigen) return;
    const auto at = (reinterpret_cast<std::uintptr_t>(scratch) + 63) & ~std::uintptr_t{63};
    packed_ = reinterpret_cast<T*>(at);
    small_gemm::pack(b_, K, N, packed_);
  }

  void operator()(const T* a, int64_t rows, T* c, bool accumulate) const {
    if (packed_) small_gemm::multiply<T>({a, K_}, rows, packed_, K_, N_, c, N_, accumulate);
    else small_gemm::eigen_product<T>({a, K_}, rows, b_, K_, N_, c, N_, accumulate);
  }

 private:
  small_gemm::View<T> b_;
  int64_t K_, N_;
  T* packed_ = nullptr;
};

// Runs piece(p0, p1) over pieces of the run order [0, N), one piece per worker. Samples are
// independent through the time loops, and each sample's row of a step product or a gate update is
// computed the same whatever piece holds it (small_gemm sums each element on its own, in order of
// k), so the results do not depend on the pieces: unlike parallel_chunks' fixed chunks, their number
// may follow the workers. Pieces hold >= 8 samples and >= 2^18 multiply-adds of step products each.
// Where Eigen's GEMM runs the step products (its blocking follows the row count) there is one piece.
template <typename F>
void over_sample_pieces(Executor& exec, const Dims& d, int64_t GH, F&& piece) {
  int64_t pieces = 1;
  if constexpr (small_gemm::kBeatsEigen) {
    const int64_t most = std::min(d.N / 8, d.T * d.N * GH * d.H >> 18);
    pieces = std::clamp<int64_t>(exec.num_workers(), 1, std::max<int64_t>(1, most));
  }
  parallel_chunks(exec, d.N, (d.N + pieces - 1) / pieces, piece);
}

// The samples of run positions [p0, p1) that run step s.
inline int64_t active_in(const Schedule& sch, int64_t s, int64_t N, int64_t p0, int64_t p1) {
  return std::max<int64_t>(0, std::min(sch.active(s, N), p1) - p0);
}

template <typename T>
void copy_row(T* dst, const T* src, int64_t n) {
  std::copy(src, src + n, dst);
}

// ---- forward -------------------------------------------------------------------------------

// Per-step state of the forward pass: states in run order and this step's hidden projection.
template <typename T>
struct ForwardStep {
  T* h;         // (N, H) in run order
  T* c;         // (N, H) in run order (LSTM)
  const T* a;   // (active, G*H): h @ W_hh^T for this step
  const T* b_hh;
};

// In place on the row `p` holding the input projection: LSTM gates (i, f, g, o), then the cell c
// and tanh(c) (saved for backward).
template <typename T>
void lstm_step(const ForwardStep<T>& st, int64_t k, int64_t H, T* p, T* y_row) {
  VecMap<T> pre(p, 4 * H);
  pre += ConstVecMap<T>(st.a + k * 4 * H, 4 * H);
  if (st.b_hh) pre += ConstVecMap<T>(st.b_hh, 4 * H);
  sigmoid_to(p, p, 2 * H);  // i, f
  tanh_to(p + 2 * H, p + 2 * H, H);
  sigmoid_to(p + 3 * H, p + 3 * H, H);
  VecMap<T> c(st.c + k * H, H), c_saved(p + 4 * H, H);
  c = VecMap<T>(p + H, H) * c + VecMap<T>(p, H) * VecMap<T>(p + 2 * H, H);
  c_saved = c;
  tanh_to(p + 4 * H, p + 5 * H, H);
  VecMap<T>(st.h + k * H, H) = VecMap<T>(p + 3 * H, H) * VecMap<T>(p + 5 * H, H);
  copy_row(y_row, st.h + k * H, H);
}

// In place on `p` (r, z, n input projections; the 4th block receives W_hn h + b_hn).
template <typename T>
void gru_step(const ForwardStep<T>& st, int64_t k, int64_t H, T* p, T* y_row) {
  const T* a = st.a + k * 3 * H;
  VecMap<T> rz(p, 2 * H), hn(p + 3 * H, H);
  rz += ConstVecMap<T>(a, 2 * H);
  hn = ConstVecMap<T>(a + 2 * H, H);
  if (st.b_hh) {
    rz += ConstVecMap<T>(st.b_hh, 2 * H);
    hn += ConstVecMap<T>(st.b_hh + 2 * H, H);
  }
  sigmoid_to(p, p, 2 * H);
  VecMap<T> n(p + 2 * H, H), z(p + H, H), h(st.h + k * H, H);
  n += VecMap<T>(p, H) * hn;
  tanh_to(p + 2 * H, p + 2 * H, H);
  h = (T(1) - z) * n + z * h;
  copy_row(y_row, st.h + k * H, H);
}

// In place on the output row `p` holding the input projection.
template <typename T>
void rnn_step(const ForwardStep<T>& st, int64_t k, int64_t H, bool relu, T* p) {
  VecMap<T> pre(p, H);
  pre += ConstVecMap<T>(st.a + k * H, H);
  if (st.b_hh) pre += ConstVecMap<T>(st.b_hh, H);
  if (relu) pre = pre.max(T(0));
  else tanh_to(p, p, H);
  copy_row(st.h + k * H, p, H);
}

template <typename T, Cell C>
void layer_forward(const KernelArgs& a) {
  const CellInfo ci = rnn::cell_info(C);
  const rnn::ForwardSlots s = rnn::forward_slots(ci, a.num_in);
  const Dims d = dims_of(a, s.x, s.w_hh);
  const int64_t H = d.H, GH = ci.gates * H, SW = ci.saved_width * H;
  int64_t* perm = static_cast<int64_t*>(a.workspace);
  T* h = reinterpret_cast<T*>(perm + d.N);
  T* c = h + d.N * H;
  T* gates = c + d.N * H;
  const Schedule sch = make_schedule(a, s.lengths, d, perm);
  const bool relu = C == Cell::rnn && a.attrs().s("nonlinearity") == "relu";

  T* y = a.out[0].ptr<T>();
  T* saved = SW ? a.out[a.num_out - 1].ptr<T>() : nullptr;
  T* proj = saved ? saved : y;
  const int64_t ldp = saved ? SW : H;
  const T* b_ih = s.b_ih >= 0 ? a.in[s.b_ih].ptr<T>() : nullptr;
  gemm_nt(a.exec, a.in[s.x].ptr<T>(), d.T * d.N, d.I, a.in[s.w_ih].ptr<T>(), GH, b_ih, proj, ldp);

  const T* h0 = a.in[s.h0].ptr<T>();
  const T* c0 = s.c0 >= 0 ? a.in[s.c0].ptr<T>() : nullptr;
  for (int64_t k = 0; k < d.N; ++k) {
    copy_row(h + k * H, h0 + perm[k] * H, H);
    if (c0) copy_row(c + k * H, c0 + perm[k] * H, H);
  }
  const StepProduct<T> hidden(a.in[s.w_hh].ptr<T>(), H, GH, /*transposed=*/true, gates + d.N * GH);
  const ForwardStep<T> st{h, c, gates, s.b_hh >= 0 ? a.in[s.b_hh].ptr<T>() : nullptr};
  over_sample_pieces(a.exec, d, GH, [&](int64_t p0, int64_t p1) {
    for (int64_t step = 0; step < d.T; ++step) {
      const int64_t active = active_in(sch, step, d.N, p0, p1);
      if (active == 0) break;  // the active prefix only shrinks
      hidden(h + p0 * H, active, gates + p0 * GH, /*accumulate=*/false);
      for (int64_t k = p0; k < p0 + active; ++k) {
        const int64_t n = perm[k], r = d.row(sch.time(step, n), n);
        if constexpr (C == Cell::lstm) lstm_step(st, k, H, proj + r * ldp, y + r * H);
        else if constexpr (C == Cell::gru) gru_step(st, k, H, proj + r * ldp, y + r * H);
        else rnn_step(st, k, H, relu, proj + r * ldp);
      }
    }
  });
  T* h_n = a.out[1].ptr<T>();
  T* c_n = ci.has_cell_state ? a.out[2].ptr<T>() : nullptr;
  for (int64_t k = 0; k < d.N; ++k) {
    copy_row(h_n + perm[k] * H, h + k * H, H);
    if (c_n) copy_row(c_n + perm[k] * H, c + k * H, H);
  }
  if (sch.len)  // outputs past each length are zeros (as pad_packed_sequence gives)
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t t = sch.len[n]; t < d.T; ++t) {
        std::fill_n(y + d.row(t, n) * H, H, T(0));
        if (saved) std::fill_n(saved + d.row(t, n) * SW, SW, T(0));
      }
}

// ---- backward ------------------------------------------------------------------------------

// Per-step state of the backward pass.
template <typename T>
struct BackwardStep {
  T* dh;         // (N, H) in run order: gradient reaching h from later steps
  T* dc;         // (N, H) in run order (LSTM)
  T* dg;         // (active, G*H): hidden-side gate gradients of this step
};

// Writes the gate gradients to st.dg row k and to `dgi` (the input and hidden sides agree for
// LSTM); leaves dc -> dc * f for the previous step.
template <typename T>
void lstm_back(const BackwardStep<T>& st, int64_t k, int64_t H, const T* sv, const T* c_prev, const T* dy, T* dgi) {
  ConstVecMap<T> i(sv, H), f(sv + H, H), g(sv + 2 * H, H), o(sv + 3 * H, H), tc(sv + 5 * H, H), cp(c_prev, H);
  VecMap<T> dh(st.dh + k * H, H), dc(st.dc + k * H, H);
  dh += ConstVecMap<T>(dy, H);
  dc += dh * o * (T(1) - tc * tc);
  T* out = st.dg + k * 4 * H;
  VecMap<T>(out, H) = dc * g * i * (T(1) - i);
  VecMap<T>(out + H, H) = dc * cp * f * (T(1) - f);
  VecMap<T>(out + 2 * H, H) = dc * i * (T(1) - g * g);
  VecMap<T>(out + 3 * H, H) = dh * tc * o * (T(1) - o);
  dc *= f;
  copy_row(dgi, out, 4 * H);
}

// GRU: the input-side n gradient is dn, the hidden side's is r * dn; dh keeps the direct z * dh.
template <typename T>
void gru_back(const BackwardStep<T>& st, int64_t k, int64_t H, const T* sv, const T* h_prev, const T* dy, T* dgi) {
  ConstVecMap<T> r(sv, H), z(sv + H, H), n(sv + 2 * H, H), hn(sv + 3 * H, H), hp(h_prev, H);
  VecMap<T> dh(st.dh + k * H, H);
  dh += ConstVecMap<T>(dy, H);
  VecMap<T> dr(dgi, H), dz(dgi + H, H), dn(dgi + 2 * H, H);
  dn = dh * (T(1) - z) * (T(1) - n * n);
  dz = dh * (hp - n) * z * (T(1) - z);
  dr = dn * hn * r * (T(1) - r);
  T* out = st.dg + k * 3 * H;
  copy_row(out, dgi, 2 * H);
  VecMap<T>(out + 2 * H, H) = dn * r;
  dh *= z;
}

template <typename T>
void rnn_back(const BackwardStep<T>& st, int64_t k, int64_t H, bool relu, const T* h, const T* dy, T* dgi) {
  ConstVecMap<T> hv(h, H);
  VecMap<T> out(st.dg + k * H, H);
  const auto dh = ConstVecMap<T>(st.dh + k * H, H) + ConstVecMap<T>(dy, H);
  if (relu) out = (hv > T(0)).select(dh, T(0));
  else out = dh * (T(1) - hv * hv);
  copy_row(dgi, st.dg + k * H, H);
}

// Where the backward time loop writes: scratch carved as ops/recurrent.hpp sizes it.
template <typename T>
struct BackwardBuffers {
  int64_t* perm;
  T *dh, *dc, *dg;              // (N, H), (N, H), (N, G*H)
  T *dg_ih, *dg_hh, *h_prev;    // over the whole sequence, in x's layout
};

template <typename T>
BackwardBuffers<T> backward_buffers(const KernelArgs& a, Cell cell, const Dims& d) {
  const int64_t GH = rnn::cell_info(cell).gates * d.H, rows = d.T * d.N;
  BackwardBuffers<T> b;
  b.perm = static_cast<int64_t*>(a.workspace);
  b.dh = reinterpret_cast<T*>(b.perm + d.N);
  b.dc = b.dh + d.N * d.H;
  b.dg = b.dc + d.N * d.H;
  b.dg_ih = b.dg + d.N * GH;
  b.dg_hh = cell == Cell::gru ? b.dg_ih + rows * GH : b.dg_ih;
  b.h_prev = b.dg_hh + rows * GH;
  return b;
}

// The time loop of backward: fills dh/dc (run order) and the whole-sequence outputs.
template <typename T, Cell C>
void backward_steps(const KernelArgs& a, const rnn::BackwardSlots& s, const Dims& d, const Schedule& sch,
                    const BackwardBuffers<T>& b) {
  const CellInfo ci = rnn::cell_info(C);
  const int64_t H = d.H, GH = ci.gates * H, SW = ci.saved_width * H;
  const bool relu = C == Cell::rnn && a.attrs().s("nonlinearity") == "relu";
  const T* y = a.in[s.y].ptr<T>();
  const T* dy = a.in[s.dy].ptr<T>();
  const T* saved = s.saved >= 0 ? a.in[s.saved].ptr<T>() : nullptr;
  const T* h0 = a.in[s.h0].ptr<T>();
  const T* c0 = s.c0 >= 0 ? a.in[s.c0].ptr<T>() : nullptr;
  const StepProduct<T> hidden(a.in[s.w_hh].ptr<T>(), GH, H, /*transposed=*/false, b.h_prev + d.T * d.N * H);
  const BackwardStep<T> st{b.dh, b.dc, b.dg};
  over_sample_pieces(a.exec, d, GH, [&](int64_t p0, int64_t p1) {
    for (int64_t step = d.T - 1; step >= 0; --step) {
      const int64_t active = active_in(sch, step, d.N, p0, p1);
      for (int64_t k = p0; k < p0 + active; ++k) {
        const int64_t n = b.perm[k], r = d.row(sch.time(step, n), n);
        const int64_t rp = step > 0 ? d.row(sch.time(step - 1, n), n) : -1;
        const T* h_prev = rp >= 0 ? y + rp * H : h0 + n * H;
        copy_row(b.h_prev + r * H, h_prev, H);
        if constexpr (C == Cell::lstm) {
          const T* c_prev = rp >= 0 ? saved + rp * SW + 4 * H : c0 + n * H;
          lstm_back(st, k, H, saved + r * SW, c_prev, dy + r * H, b.dg_ih + r * GH);
        } else if constexpr (C == Cell::gru) {
          gru_back(st, k, H, saved + r * SW, h_prev, dy + r * H, b.dg_ih + r * GH);
          copy_row(b.dg_hh + r * GH, b.dg + k * GH, GH);
        } else {
          rnn_back(st, k, H, relu, y + r * H, dy + r * H, b.dg_ih + r * GH);
        }
      }
      if (active > 0) hidden(b.dg + p0 * GH, active, b.dh + p0 * H, /*accumulate=*/C == Cell::gru);
    }
  });
}

// dW (rows of g x cols of `in`) = g^T in, over the whole sequence; chunks of dW's rows.
template <typename T>
void weight_grad(Executor& exec, const T* g, int64_t rows, int64_t GH, const T* in, int64_t cols, T* dw) {
  parallel_chunks(exec, GH, row_grain(rows * cols), [&](int64_t g0, int64_t g1) {
    small_gemm::product<T>({g + g0, GH, /*transposed=*/true}, g1 - g0, {in, cols}, rows, cols, dw + g0 * cols, cols);
  });
}

// db = the column sums of g (rows x GH), in row order for every column.
template <typename T>
void bias_grad(const T* g, int64_t rows, int64_t GH, T* db) {
  VecMap<T> out(db, GH);
  out.setZero();
  for (int64_t r = 0; r < rows; ++r) out += ConstVecMap<T>(g + r * GH, GH);
}

// The layer's gradients from the time loop's whole-sequence buffers (one GEMM or sum each).
template <typename T, Cell C>
void parameter_and_input_grads(const KernelArgs& a, const rnn::BackwardSlots& s, const Dims& d,
                               const BackwardBuffers<T>& b) {
  const int64_t GH = rnn::cell_info(C).gates * d.H, rows = d.T * d.N;
  if (a.attrs().i("needs_dx") != 0) {
    const T* w_ih = a.in[s.w_ih].ptr<T>();
    T* dx = a.out[s.dx].ptr<T>();
    parallel_chunks(a.exec, rows, row_grain(GH * d.I), [&](int64_t r0, int64_t r1) {
      small_gemm::product<T>({b.dg_ih + r0 * GH, GH}, r1 - r0, {w_ih, d.I}, GH, d.I, dx + r0 * d.I, d.I);
    });
  }
  weight_grad(a.exec, b.dg_ih, rows, GH, a.in[s.x].ptr<T>(), d.I, a.out[s.dw_ih].ptr<T>());
  weight_grad(a.exec, b.dg_hh, rows, GH, b.h_prev, d.H, a.out[s.dw_hh].ptr<T>());
  if (s.db_ih >= 0) {
    bias_grad(b.dg_ih, rows, GH, a.out[s.db_ih].ptr<T>());
    bias_grad(b.dg_hh, rows, GH, a.out[s.db_hh].ptr<T>());
  }
}

template <typename T, Cell C>
void layer_backward(const KernelArgs& a) {
  const CellInfo ci = rnn::cell_info(C);
  const rnn::BackwardSlots s = rnn::backward_slots(ci, a.num_in);
  Dims d = dims_of(a, s.y, s.w_hh);
  d.I = a.in[s.x].dim(2);
  const int64_t H = d.H, GH = ci.gates * H;
  const BackwardBuffers<T> b = backward_buffers<T>(a, C, d);
  const Schedule sch = make_schedule(a, s.lengths, d, b.perm);

  const T* dh_n = a.in[s.dh_n].ptr<T>();
  const T* dc_n = s.dc_n >= 0 ? a.in[s.dc_n].ptr<T>() : nullptr;
  for (int64_t k = 0; k < d.N; ++k) {
    copy_row(b.dh + k * H, dh_n + b.perm[k] * H, H);
    if (dc_n) copy_row(b.dc + k * H, dc_n + b.perm[k] * H, H);
  }
  if (sch.len)  // rows past a sample's length enter the weight gradients as zeros
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t t = sch.len[n]; t < d.T; ++t) {
        const int64_t r = d.row(t, n);
        std::fill_n(b.dg_ih + r * GH, GH, T(0));
        std::fill_n(b.h_prev + r * H, H, T(0));
        if (C == Cell::gru) std::fill_n(b.dg_hh + r * GH, GH, T(0));
      }
  backward_steps<T, C>(a, s, d, sch, b);

  T* dh0 = a.out[s.dh0].ptr<T>();
  T* dc0 = s.dc0 >= 0 ? a.out[s.dc0].ptr<T>() : nullptr;
  for (int64_t k = 0; k < d.N; ++k) {
    copy_row(dh0 + b.perm[k] * H, b.dh + k * H, H);
    if (dc0) copy_row(dc0 + b.perm[k] * H, b.dc + k * H, H);
  }
  parameter_and_input_grads<T, C>(a, s, d, b);
}

template <typename T>
void rnn_forward(const KernelArgs& a) { layer_forward<T, Cell::rnn>(a); }
template <typename T>
void gru_forward(const KernelArgs& a) { layer_forward<T, Cell::gru>(a); }
template <typename T>
void lstm_forward(const KernelArgs& a) { layer_forward<T, Cell::lstm>(a); }
template <typename T>
void rnn_backward(const KernelArgs& a) { layer_backward<T, Cell::rnn>(a); }
template <typename T>
void gru_backward(const KernelArgs& a) { layer_backward<T, Cell::gru>(a); }
template <typename T>
void lstm_backward(const KernelArgs& a) { layer_backward<T, Cell::lstm>(a); }

}  // namespace

void register_eigen_recurrent(KernelTable& t) {
  TREADLE_EIGEN_REGISTER_FLOATS(t, "rnn_layer", rnn_forward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "gru_layer", gru_forward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "lstm_layer", lstm_forward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "rnn_layer_backward", rnn_backward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "gru_layer_backward", gru_backward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "lstm_layer_backward", lstm_backward);
}

}  // namespace treadle
