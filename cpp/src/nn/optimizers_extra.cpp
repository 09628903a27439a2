// Adadelta, Adamax, NAdam and RAdam: one fused pass per parameter-group segment over the flat
// parameter, gradient and state buffers, with torch.optim's single-tensor formulas written element
// by element. Scalars are computed in double (as torch computes them in Python) and cast to the
// buffer's dtype; everything per element runs in that dtype.
#include <algorithm>
#include <cmath>

#include "nn/optim_common.hpp"
#include "treadle/error.hpp"
#include "treadle/optim.hpp"

namespace treadle::optim {
namespace {

using detail::dispatch;
using detail::lerp;
using detail::require;
using detail::segment_chunks;

void check_betas(const char* who, double beta1, double beta2) {
  require(beta1 >= 0 && beta1 < 1, who, "betas[0] (beta1, must be in [0, 1))", beta1);
  require(beta2 >= 0 && beta2 < 1, who, "betas[1] (beta2, must be in [0, 1))", beta2);
}

// ---- Adadelta ---------------------------------------------------------------------------------

template <typename T, bool kDecay>
void adadelta_elements(int64_t b, int64_t e, T* __restrict p, const T* __restrict g, T* __restrict sq,
                       T* __restrict acc, T rho, T w, T eps, T wd, T neg_lr) {
  for (int64_t i = b; i < e; ++i) {
    T gi = g[i];
    if constexpr (kDecay) gi = gi + wd * p[i];
    const T si = sq[i] * rho + w * gi * gi;
    const T std_i = std::sqrt(si + eps);
    const T delta = std::sqrt(acc[i] + eps) / std_i * gi;
    sq[i] = si;
    acc[i] = acc[i] * rho + w * delta * delta;
    p[i] = p[i] + neg_lr * delta;
  }
}

class Adadelta final : public detail::FusedOptimizer<Adadelta, AdadeltaOptions> {
  friend class detail::FusedOptimizer<Adadelta, AdadeltaOptions>;

 public:
  explicit Adadelta(const AdadeltaOptions& o) : FusedOptimizer(o) {
    require(o.lr >= 0, "Adadelta", "lr (learning rate)", o.lr);
    check_options("Adadelta", o);
  }
  std::string name() const override { return "Adadelta"; }
  static void check_options(const char* who, const AdadeltaOptions& o) {
    require(o.rho >= 0 && o.rho <= 1, who, "rho (must be in [0, 1])", o.rho);
    require(o.eps >= 0, who, "eps (epsilon)", o.eps);
    require(o.weight_decay >= 0, who, "weight_decay", o.weight_decay);
  }
  static bool set_option(AdadeltaOptions& o, const std::string& key, double v) {
    if (key == "rho") o.rho = v;
    else if (key == "eps") o.eps = v;
    else if (key == "weight_decay") o.weight_decay = v;
    else return false;
    return true;
  }
  static const char* option_names() { return "rho, eps, weight_decay"; }

 protected:
  std::vector<std::string> state_names() const override { return {"square_avg", "acc_delta"}; }

 private:
  template <typename T>
  void run(const Tensor& params, const Tensor& grads, int64_t b0, int64_t e0, const AdadeltaOptions& o, double lr,
           Executor& exec) {
    T* p = params.data_as<T>();
    const T* g = grads.data_as<T>();
    T* sq = state_buffer(0).data_as<T>();
    T* acc = state_buffer(1).data_as<T>();
    const T rho = T(o.rho), w = T(1 - o.rho), eps = T(o.eps), wd = T(o.weight_decay), neg_lr = T(-lr);
    dispatch(o.weight_decay != 0, [&](auto decay) {
      segment_chunks(exec, b0, e0, [&](int64_t b, int64_t e) {
        adadelta_elements<T, decltype(decay)::value>(b, e, p, g, sq, acc, rho, w, eps, wd, neg_lr);
      });
    });
  }
};

// ---- Adamax -----------------------------------------------------------------------------------

template <typename T, bool kDecay>
void adamax_elements(int64_t b, int64_t e, T* __restrict p, const T* __restrict g, T* __restrict m,
                     T* __restrict u, T w1, T b2, T eps, T wd, T neg_clr) {
  for (int64_t i = b; i < e; ++i) {
    T gi = g[i];
    if constexpr (kDecay) gi = gi + wd * p[i];
    const T mi = lerp(m[i], gi, w1);
    const T ui = std::max(u[i] * b2, std::abs(gi) + eps);
    m[i] = mi;
    u[i] = ui;
    p[i] = p[i] + neg_clr * (mi / ui);
  }
}

class Adamax final : public detail::FusedOptimizer<Adamax, AdamaxOptions> {
  friend class detail::FusedOptimizer<Adamax, AdamaxOptions>;

 public:
  explicit Adamax(const AdamaxOptions& o) : FusedOptimizer(o) {
    require(o.lr >= 0, "Adamax", "lr (learning rate)", o.lr);
    check_options("Adamax", o);
  }
  std::string name() const override { return "Adamax"; }
  static void check_options(const char* who, const AdamaxOptions& o) {
    check_betas(who, o.beta1, o.beta2);
    require(o.eps >= 0, who, "eps (epsilon)", o.eps);
    require(o.weight_decay >= 0, who, "weight_decay", o.weight_decay);
  }
  static bool set_option(AdamaxOptions& o, const std::string& key, double v) {
    if (key == "beta1") o.beta1 = v;
    else if (key == "beta2") o.beta2 = v;
    else if (key == "eps") o.eps = v;
    else if (key == "weight_decay") o.weight_decay = v;
    else return false;
    return true;
  }
  static const char* option_names() { return "betas (beta1, beta2), eps, weight_decay"; }

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_inf"}; }

 private:
  template <typename T>
  void run(const Tensor& params, const Tensor& grads, int64_t b0, int64_t e0, const AdamaxOptions& o, double lr,
           Executor& exec) {
    T* p = params.data_as<T>();
    const T* g = grads.data_as<T>();
    T* m = state_buffer(0).data_as<T>();
    T* u = state_buffer(1).data_as<T>();
    const double clr = lr / (1 - std::pow(o.beta1, static_cast<double>(t_)));
    const T w1 = T(1 - o.beta1), b2 = T(o.beta2), eps = T(o.eps), wd = T(o.weight_decay), neg_clr = T(-clr);
    dispatch(o.weight_decay != 0, [&](auto decay) {
      segment_chunks(exec, b0, e0, [&](int64_t b, int64_t e) {
        adamax_elements<T, decltype(decay)::value>(b, e, p, g, m, u, w1, b2, eps, wd, neg_clr);
      });
    });
  }
};

// ---- NAdam ------------------------------------------------------------------------------------

template <typename T>
struct NAdamCoef {
  T shrink, wd, w1, b2, w2, bc2, eps, c_grad, c_avg;
};

template <typename T, bool kCoupled>
void nadam_elements(int64_t b, int64_t e, T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
                    const NAdamCoef<T>& k) {
  for (int64_t i = b; i < e; ++i) {
    const T pi = p[i] * k.shrink;
    T gi = g[i];
    if constexpr (kCoupled) gi = gi + k.wd * pi;
    const T mi = lerp(m[i], gi, k.w1);
    const T vi = v[i] * k.b2 + k.w2 * gi * gi;
    const T denom = std::sqrt(vi / k.bc2) + k.eps;
    m[i] = mi;
    v[i] = vi;
    const T q = pi + k.c_grad * (gi / denom);
    p[i] = q + k.c_avg * (mi / denom);
  }
}

// torch keeps mu_product, the running product of the momentum factors mu_t, as a scalar tensor of
// its default dtype and reads it back with .item(): here one per group, rounded to the buffers'
// dtype after each product. It follows from the step count alone, so it is recomputed (not
// stored) after a checkpoint restores step_count().
class NAdam final : public detail::FusedOptimizer<NAdam, NAdamOptions> {
  friend class detail::FusedOptimizer<NAdam, NAdamOptions>;

 public:
  explicit NAdam(const NAdamOptions& o) : FusedOptimizer(o) {
    require(o.lr >= 0, "NAdam", "lr (learning rate)", o.lr);
    check_options("NAdam", o);
  }
  std::string name() const override { return "NAdam"; }
  static void check_options(const char* who, const NAdamOptions& o) {
    check_betas(who, o.beta1, o.beta2);
    require(o.eps >= 0, who, "eps (epsilon)", o.eps);
    require(o.weight_decay >= 0, who, "weight_decay", o.weight_decay);
    require(o.momentum_decay >= 0, who, "momentum_decay", o.momentum_decay);
  }
  static bool set_option(NAdamOptions& o, const std::string& key, double v) {
    if (key == "beta1") o.beta1 = v;
    else if (key == "beta2") o.beta2 = v;
    else if (key == "eps") o.eps = v;
    else if (key == "weight_decay") o.weight_decay = v;
    else if (key == "momentum_decay") o.momentum_decay = v;
    else if (key == "decoupled_weight_decay") o.decoupled_weight_decay = v != 0;
    else return false;
    return true;
  }
  static const char* option_names() {
    return "betas (beta1, beta2), eps, weight_decay, momentum_decay, decoupled_weight_decay";
  }

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void initialize_state() override { mu_product_.assign(opts_.size(), 1.0); }

 private:
  static double mu(const NAdamOptions& o, double t) {
    return o.beta1 * (1.0 - 0.5 * std::pow(0.96, t * o.momentum_decay));
  }
  double rounded(double x) const { return dtype_ == DType::f32 ? static_cast<double>(static_cast<float>(x)) : x; }
  // Brings every group's mu_product to step t_ (t_ - 1 products done before this update).
  void before_update() {
    if (mu_product_.size() != opts_.size() || mu_step_ != t_ - 1) {
      mu_product_.assign(opts_.size(), 1.0);
      for (std::size_t g = 0; g < opts_.size(); ++g)
        for (int64_t s = 1; s < t_; ++s) mu_product_[g] = advance(mu_product_[g], mu(opts_[g], static_cast<double>(s)));
    }
    for (std::size_t g = 0; g < opts_.size(); ++g)
      mu_product_[g] = advance(mu_product_[g], mu(opts_[g], static_cast<double>(t_)));
    mu_step_ = t_;
  }
  // torch multiplies its float32 scalar tensor by the float mu in float32.
  double advance(double product, double m) const {
    if (dtype_ == DType::f32) return static_cast<double>(static_cast<float>(product) * static_cast<float>(m));
    return product * m;
  }

  template <typename T>
  void run(const Tensor& params, const Tensor& grads, int64_t b0, int64_t e0, const NAdamOptions& o, double lr,
           Executor& exec) {
    const std::size_t group = static_cast<std::size_t>(&o - opts_.data());
    const double t = static_cast<double>(t_);
    const double mu_t = mu(o, t), mu_next = mu(o, t + 1);
    const double product = rounded(mu_product_[group]), product_next = product * mu_next;
    NAdamCoef<T> k;
    const bool decoupled = o.decoupled_weight_decay && o.weight_decay != 0;
    k.shrink = decoupled ? T(1 - lr * o.weight_decay) : T(1);
    k.wd = T(o.weight_decay);
    k.w1 = T(1 - o.beta1);
    k.b2 = T(o.beta2);
    k.w2 = T(1 - o.beta2);
    k.bc2 = T(1 - std::pow(o.beta2, t));
    k.eps = T(o.eps);
    k.c_grad = T(-lr * (1.0 - mu_t) / (1.0 - product));
    k.c_avg = T(-lr * mu_next / (1.0 - product_next));
    T* p = params.data_as<T>();
    const T* g = grads.data_as<T>();
    T* m = state_buffer(0).data_as<T>();
    T* v = state_buffer(1).data_as<T>();
    dispatch(!o.decoupled_weight_decay && o.weight_decay != 0, [&](auto coupled) {
      segment_chunks(exec, b0, e0, [&](int64_t b, int64_t e) {
        nadam_elements<T, decltype(coupled)::value>(b, e, p, g, m, v, k);
      });
    });
  }

  std::vector<double> mu_product_;  // per group, after update mu_step_
  int64_t mu_step_ = -1;
};

// ---- RAdam ------------------------------------------------------------------------------------

template <typename T>
struct RAdamCoef {
  T shrink, wd, w1, b2, w2, bc1, lr, bc2_sqrt, eps, rect;
};

template <typename T, bool kCoupled, bool kRectified>
void radam_elements(int64_t b, int64_t e, T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
                    const RAdamCoef<T>& k) {
  for (int64_t i = b; i < e; ++i) {
    const T pi = p[i] * k.shrink;
    T gi = g[i];
    if constexpr (kCoupled) gi = gi + k.wd * pi;
    const T mi = lerp(m[i], gi, k.w1);
    const T vi = v[i] * k.b2 + k.w2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    T step = mi / k.bc1 * k.lr;
    if constexpr (kRectified) step = step * (k.bc2_sqrt / (std::sqrt(vi) + k.eps)) * k.rect;
    p[i] = pi - step;
  }
}

class RAdam final : public detail::FusedOptimizer<RAdam, RAdamOptions> {
  friend class detail::FusedOptimizer<RAdam, RAdamOptions>;

 public:
  explicit RAdam(const RAdamOptions& o) : FusedOptimizer(o) {
    require(o.lr >= 0, "RAdam", "lr (learning rate)", o.lr);
    check_options("RAdam", o);
  }
  std::string name() const override { return "RAdam"; }
  static void check_options(const char* who, const RAdamOptions& o) {
    check_betas(who, o.beta1, o.beta2);
    require(o.eps >= 0, who, "eps (epsilon)", o.eps);
    require(o.weight_decay >= 0, who, "weight_decay", o.weight_decay);
  }
  static bool set_option(RAdamOptions& o, const std::string& key, double v) {
    if (key == "beta1") o.beta1 = v;
    else if (key == "beta2") o.beta2 = v;
    else if (key == "eps") o.eps = v;
    else if (key == "weight_decay") o.weight_decay = v;
    else if (key == "decoupled_weight_decay") o.decoupled_weight_decay = v != 0;
    else return false;
    return true;
  }
  static const char* option_names() { return "betas (beta1, beta2), eps, weight_decay, decoupled_weight_decay"; }

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  template <typename T>
  void run(const Tensor& params, const Tensor& grads, int64_t b0, int64_t e0, const RAdamOptions& o, double lr,
           Executor& exec) {
    const double t = static_cast<double>(t_);
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    // The length of the approximated simple moving average decides whether the variance is rectified.
    const double rho_inf = 2 / (1 - o.beta2) - 1;
    const double rho_t = rho_inf - 2 * t * std::pow(o.beta2, t) / bc2;
    const bool rectified = rho_t > 5.0;
    RAdamCoef<T> k;
    const bool decoupled = o.decoupled_weight_decay && o.weight_decay != 0;
    k.shrink = decoupled ? T(1 - lr * o.weight_decay) : T(1);
    k.wd = T(o.weight_decay);
    k.w1 = T(1 - o.beta1);
    k.b2 = T(o.beta2);
    k.w2 = T(1 - o.beta2);
    k.bc1 = T(bc1);
    k.lr = T(lr);
    k.bc2_sqrt = T(std::sqrt(bc2));
    k.eps = T(o.eps);
    k.rect = rectified ? T(std::sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)))
                       : T(1);
    T* p = params.data_as<T>();
    const T* g = grads.data_as<T>();
    T* m = state_buffer(0).data_as<T>();
    T* v = state_buffer(1).data_as<T>();
    dispatch(!o.decoupled_weight_decay && o.weight_decay != 0, [&](auto coupled) {
      dispatch(rectified, [&](auto rect) {
        segment_chunks(exec, b0, e0, [&](int64_t b, int64_t e) {
          radam_elements<T, decltype(coupled)::value, decltype(rect)::value>(b, e, p, g, m, v, k);
        });
      });
    });
  }
};

}  // namespace

std::shared_ptr<Optimizer> adadelta(const AdadeltaOptions& o) { return std::make_shared<Adadelta>(o); }
std::shared_ptr<Optimizer> adamax(const AdamaxOptions& o) { return std::make_shared<Adamax>(o); }
std::shared_ptr<Optimizer> nadam(const NAdamOptions& o) { return std::make_shared<NAdam>(o); }
std::shared_ptr<Optimizer> radam(const RAdamOptions& o) { return std::make_shared<RAdam>(o); }

}  // namespace treadle::optim
