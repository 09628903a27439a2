// RMSprop (momentum, centered), Adagrad (lr_decay, initial accumulator) and the matrix-aware
// row-wise / column-wise AdaGrad. Element-wise ones are one fused pass over the flat buffers with
// torch.optim's single-tensor formulas; the matrix-aware ones walk the layout slot by slot.
#include <algorithm>
#include <cmath>

#include "backends/eigen/eigen_common.hpp"
#include "nn/optim_common.hpp"
#include "treadle/error.hpp"
#include "treadle/optim.hpp"

namespace treadle::optim {
namespace {

using detail::dispatch;
using detail::kUpdateGrain;
using detail::lerp;
using detail::require;
using eigen::parallel_chunks;

template <typename T>
struct RMSpropCoef {
  T lr, alpha, w, eps, wd, mom;
};

template <typename T, bool kDecay, bool kCentered, bool kMomentum>
void rmsprop_elements(int64_t b, int64_t e, T* __restrict p, const T* __restrict g, T* __restrict sq,
                      T* __restrict buf, T* __restrict gavg, const RMSpropCoef<T>& k) {
  for (int64_t i = b; i < e; ++i) {
    T gi = g[i];
    if constexpr (kDecay) gi = gi + k.wd * p[i];
    const T si = sq[i] * k.alpha + k.w * gi * gi;
    sq[i] = si;
    T avg;
    if constexpr (kCentered) {
      const T ai = lerp(gavg[i], gi, k.w);
      gavg[i] = ai;
      avg = std::sqrt(si - ai * ai);
    } else {
      avg = std::sqrt(si);
    }
    avg = avg + k.eps;
    if constexpr (kMomentum) {
      const T bi = buf[i] * k.mom + gi / avg;
      buf[i] = bi;
      p[i] = p[i] - k.lr * bi;
    } else {
      p[i] = p[i] - k.lr * gi / avg;
    }
  }
}

class RMSprop final : public detail::FusedOptimizer<RMSprop, RMSpropOptions> {
  friend class detail::FusedOptimizer<RMSprop, RMSpropOptions>;

 public:
  explicit RMSprop(const RMSpropOptions& o) : FusedOptimizer(o) {
    require(o.lr >= 0, "RMSprop", "lr (learning rate)", o.lr);
    check_options("RMSprop", o);
  }
  std::string name() const override { return "RMSprop"; }
  static void check_options(const char* who, const RMSpropOptions& o) {
    require(o.eps > 0, who, "eps (epsilon, must be > 0)", o.eps);
    require(o.momentum >= 0, who, "momentum", o.momentum);
    require(o.weight_decay >= 0, who, "weight_decay", o.weight_decay);
    require(o.alpha >= 0 && o.alpha <= 1, who, "alpha (must be in [0, 1])", o.alpha);
  }
  static bool set_option(RMSpropOptions& o, const std::string& key, double v) {
    if (key == "alpha") o.alpha = v;
    else if (key == "eps") o.eps = v;
    else if (key == "weight_decay") o.weight_decay = v;
    else if (key == "momentum") o.momentum = v;
    else if (key == "centered") o.centered = v != 0;
    else return false;
    return true;
  }
  static const char* option_names() { return "alpha, eps, weight_decay, momentum, centered"; }

 protected:
  std::vector<std::string> state_names() const override {
    std::vector<std::string> names{"square_avg"};
    if (any_group([](const RMSpropOptions& o) { return o.momentum > 0; })) names.push_back("momentum_buffer");
    if (any_group([](const RMSpropOptions& o) { return o.centered; })) names.push_back("grad_avg");
    return names;
  }

 private:
  template <typename T>
  void run(const Tensor& params, const Tensor& grads, int64_t b0, int64_t e0, const RMSpropOptions& o, double lr,
           Executor& exec) {
    T* p = params.data_as<T>();
    const T* g = grads.data_as<T>();
    T* sq = state_buffer(0).data_as<T>();
    const bool has_mom = any_group([](const RMSpropOptions& x) { return x.momentum > 0; });
    const bool use_mom = o.momentum > 0;
    T* buf = use_mom ? state_buffer(1).data_as<T>() : nullptr;
    T* gavg = o.centered ? state_buffer(has_mom ? 2 : 1).data_as<T>() : nullptr;
    const RMSpropCoef<T> k{T(lr), T(o.alpha), T(1 - o.alpha), T(o.eps), T(o.weight_decay), T(o.momentum)};
    dispatch(o.weight_decay != 0, [&](auto decay) {
      dispatch(o.centered, [&](auto centered) {
        dispatch(use_mom, [&](auto mom) {
          detail::segment_chunks(exec, b0, e0, [&](int64_t b, int64_t e) {
            rmsprop_elements<T, decltype(decay)::value, decltype(centered)::value, decltype(mom)::value>(
                b, e, p, g, sq, buf, gavg, k);
          });
        });
      });
    });
  }
};

void check_adagrad(const char* who, const AdagradOptions& o) {
  require(o.lr >= 0, who, "lr (learning rate)", o.lr);
  require(o.lr_decay >= 0, who, "lr_decay", o.lr_decay);
  require(o.weight_decay >= 0, who, "weight_decay", o.weight_decay);
  require(o.initial_accumulator_value >= 0, who, "initial_accumulator_value", o.initial_accumulator_value);
  require(o.eps > 0, who, "eps (epsilon, must be > 0)", o.eps);
}

// Element-wise AdaGrad over [b, e) of p/g with accumulators `acc` aligned to p. Shared by Adagrad and
// by the matrix-aware variants' fallback, so that fallback is the same arithmetic bit for bit.
template <typename T>
inline void adagrad_elements(T* __restrict p, const T* __restrict g, T* __restrict acc, int64_t b, int64_t e,
                             T neg_clr, T wd, bool decay, T eps) {
  for (int64_t i = b; i < e; ++i) {
    T gi = g[i];
    if (decay) gi = gi + wd * p[i];
    acc[i] = acc[i] + gi * gi;
    p[i] = p[i] + neg_clr * gi / (std::sqrt(acc[i]) + eps);
  }
}

// What every AdaGrad update of step t needs, in the buffer's dtype.
template <typename T>
struct AdagradStep {
  T neg_clr, wd, eps;
  bool decay;
};

template <typename T>
AdagradStep<T> adagrad_step(const AdagradOptions& o, double lr, int64_t t) {
  const double clr = lr / (1 + static_cast<double>(t - 1) * o.lr_decay);
  return {T(-clr), T(o.weight_decay), T(o.eps), o.weight_decay != 0};
}

class Adagrad final : public detail::FusedOptimizer<Adagrad, AdagradOptions> {
  friend class detail::FusedOptimizer<Adagrad, AdagradOptions>;

 public:
  explicit Adagrad(const AdagradOptions& o) : FusedOptimizer(o) { check_adagrad("Adagrad", o); }
  std::string name() const override { return "Adagrad"; }
  static void check_options(const char* who, const AdagradOptions& o) { check_adagrad(who, o); }
  static bool set_option(AdagradOptions& o, const std::string& key, double v) {
    if (key == "lr_decay") o.lr_decay = v;
    else if (key == "weight_decay") o.weight_decay = v;
    else if (key == "initial_accumulator_value") o.initial_accumulator_value = v;
    else if (key == "eps") o.eps = v;
    else return false;
    return true;
  }
  static const char* option_names() { return "lr_decay, weight_decay, initial_accumulator_value, eps"; }

 protected:
  std::vector<std::string> state_names() const override { return {"sum"}; }
  // As torch, every accumulator starts at the constructor's initial_accumulator_value (torch fills
  // the state when the optimizer is created; a group's own value is not read).
  void initialize_state() override {
    const double value = opts_defaults().initial_accumulator_value;
    for (const Segment& seg : segments_) {
      Tensor& s = state_buffer(0);
      if (dtype_ == DType::f32)
        std::fill(s.data_as<float>() + seg.begin, s.data_as<float>() + seg.end, static_cast<float>(value));
      else
        std::fill(s.data_as<double>() + seg.begin, s.data_as<double>() + seg.end, value);
    }
  }

 private:
  template <typename T>
  void run(const Tensor& params, const Tensor& grads, int64_t b0, int64_t e0, const AdagradOptions& o, double lr,
           Executor& exec) {
    T* p = params.data_as<T>();
    const T* g = grads.data_as<T>();
    T* acc = state_buffer(0).data_as<T>();
    const AdagradStep<T> k = adagrad_step<T>(o, lr, t_);
    detail::segment_chunks(exec, b0, e0, [&](int64_t b, int64_t e) {
      adagrad_elements(p, g, acc, b, e, k.neg_clr, k.wd, k.decay, k.eps);
    });
  }
};

// Mean of squared (decayed) gradients along the matrix axis: per row (contiguous) or per column.
enum class Axis { rows, cols };

// The row/column-wise AdaGrad documented in optim.hpp. Squares are formed in the buffer's dtype and
// summed in double: a row of C equal float32 squares then averages back to that square exactly, so
// row-constant gradients reproduce element-wise AdaGrad (up to the compiler fusing its multiply-add).
// Parameter groups are refused (Optimizer::configure_groups): the update walks slots, not segments.
class MatrixAdagrad final : public Optimizer {
 public:
  MatrixAdagrad(const AdagradOptions& o, Axis axis) : Optimizer(o.lr), o_(o), axis_(axis) { check_adagrad(who(), o); }
  std::string name() const override { return who(); }

 protected:
  std::vector<std::string> state_names() const override { return {"sum"}; }
  int64_t state_numel(int) const override {
    int64_t n = 0;
    for (const ParamSlot& s : layout_) n += slot_state_numel(s);
    return n;
  }
  void initialize_state() override;
  void update(const Tensor& params, const Tensor& grads, Executor& exec) override {
    if (dtype_ == DType::f32)
      run<float>(params, grads, step_lrs_[0], exec);
    else
      run<double>(params, grads, step_lrs_[0], exec);
  }

 private:
  const char* who() const { return axis_ == Axis::rows ? "RowWiseAdagrad" : "ColumnWiseAdagrad"; }
  int64_t slot_state_numel(const ParamSlot& s) const {
    if (s.shape.size() != 2) return s.numel;
    return axis_ == Axis::rows ? s.shape[0] : s.shape[1];
  }
  template <typename T>
  void run(const Tensor& params, const Tensor& grads, double lr, Executor& exec);
  template <typename T>
  void rows(T* p, const T* g, T* acc, int64_t R, int64_t C, const AdagradStep<T>& k, Executor& exec);
  template <typename T>
  void cols(T* p, const T* g, T* acc, int64_t R, int64_t C, const AdagradStep<T>& k, Executor& exec);

  AdagradOptions o_;
  Axis axis_;
  std::vector<int64_t> state_offsets_;  // per slot, into the compact "sum"
  std::vector<double> scratch_;         // column sums (column-wise), sized at bind
};

void MatrixAdagrad::initialize_state() {
  state_offsets_.clear();
  int64_t off = 0, widest = 0;
  for (const ParamSlot& s : layout_) {
    state_offsets_.push_back(off);
    off += slot_state_numel(s);
    if (s.shape.size() == 2) widest = std::max(widest, s.shape[1]);
  }
  scratch_.assign(axis_ == Axis::cols ? static_cast<std::size_t>(widest) : 0, 0.0);
  Tensor& sum = state_buffer(0);
  if (dtype_ == DType::f32)
    std::fill_n(sum.data_as<float>(), sum.numel(), static_cast<float>(o_.initial_accumulator_value));
  else
    std::fill_n(sum.data_as<double>(), sum.numel(), o_.initial_accumulator_value);
}

template <typename T>
void MatrixAdagrad::run(const Tensor& params, const Tensor& grads, double lr, Executor& exec) {
  const AdagradStep<T> k = adagrad_step<T>(o_, lr, t_);
  T* acc_all = state_buffer(0).data_as<T>();
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const ParamSlot& s = layout_[i];
    T* p = params.data_as<T>() + s.offset;
    const T* g = grads.data_as<T>() + s.offset;
    T* acc = acc_all + state_offsets_[i];
    if (s.shape.size() != 2) {
      parallel_chunks(exec, s.numel, kUpdateGrain, [&](int64_t b, int64_t e) {
        adagrad_elements(p, g, acc, b, e, k.neg_clr, k.wd, k.decay, k.eps);
      });
    } else if (axis_ == Axis::rows) {
      rows(p, g, acc, s.shape[0], s.shape[1], k, exec);
    } else {
      cols(p, g, acc, s.shape[0], s.shape[1], k, exec);
    }
  }
}

template <typename T>
void MatrixAdagrad::rows(T* p, const T* g, T* acc, int64_t R, int64_t C, const AdagradStep<T>& k, Executor& exec) {
  if (C == 0) return;
  const int64_t grain = std::max<int64_t>(1, kUpdateGrain / C);
  parallel_chunks(exec, R, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* pr = p + r * C;
      const T* gr = g + r * C;
      double sum = 0;
      for (int64_t c = 0; c < C; ++c) {
        const T gi = k.decay ? gr[c] + k.wd * pr[c] : gr[c];
        sum += static_cast<double>(gi * gi);
      }
      acc[r] = acc[r] + static_cast<T>(sum / static_cast<double>(C));
      const T den = std::sqrt(acc[r]) + k.eps;
      for (int64_t c = 0; c < C; ++c) {
        const T gi = k.decay ? gr[c] + k.wd * pr[c] : gr[c];
        pr[c] = pr[c] + k.neg_clr * gi / den;
      }
    }
  });
}

template <typename T>
void MatrixAdagrad::cols(T* p, const T* g, T* acc, int64_t R, int64_t C, const AdagradStep<T>& k, Executor& exec) {
  if (R == 0) return;
  double* sc = scratch_.data();
  // Chunks own disjoint column ranges and walk all rows, so each column's sum has one fixed order.
  const int64_t grain = std::max<int64_t>(16, kUpdateGrain / R);
  parallel_chunks(exec, C, grain, [&](int64_t c0, int64_t c1) {
    std::fill(sc + c0, sc + c1, 0.0);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        const T gi = k.decay ? g[r * C + c] + k.wd * p[r * C + c] : g[r * C + c];
        sc[c] += static_cast<double>(gi * gi);
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      acc[c] = acc[c] + static_cast<T>(sc[c] / static_cast<double>(R));
      sc[c] = static_cast<double>(std::sqrt(acc[c]) + k.eps);  // the denominator, exact in double
    }
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        const T gi = k.decay ? g[r * C + c] + k.wd * p[r * C + c] : g[r * C + c];
        p[r * C + c] = p[r * C + c] + k.neg_clr * gi / static_cast<T>(sc[c]);
      }
    }
  });
}

}  // namespace

std::shared_ptr<Optimizer> rmsprop(const RMSpropOptions& o) { return std::make_shared<RMSprop>(o); }
std::shared_ptr<Optimizer> adagrad(const AdagradOptions& o) { return std::make_shared<Adagrad>(o); }
std::shared_ptr<Optimizer> rowwise_adagrad(const AdagradOptions& o) {
  return std::make_shared<MatrixAdagrad>(o, Axis::rows);
}
std::shared_ptr<Optimizer> columnwise_adagrad(const AdagradOptions& o) {
  return std::make_shared<MatrixAdagrad>(o, Axis::cols);
}

}  // namespace treadle::optim
