// SGD (momentum, dampening, Nesterov, weight decay), Adam (AMSGrad) and AdamW: one fused pass over
// the flat parameter, gradient and state buffers, with torch.optim's single-tensor formulas written
// element by element. Scalar coefficients are computed in double (as torch computes them in Python)
// and cast to the buffer's dtype; everything per element runs in that dtype.
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

template <typename T>
struct SGDCoef {
  T lr, wd, mom, keep;
  bool first;
};

template <typename T, bool kDecay, bool kMomentum, bool kNesterov>
void sgd_elements(int64_t b, int64_t e, T* __restrict p, const T* __restrict g, T* __restrict buf,
                  const SGDCoef<T>& k) {
  for (int64_t i = b; i < e; ++i) {
    T d = g[i];
    if constexpr (kDecay) d = d + k.wd * p[i];
    if constexpr (kMomentum) {
      const T bi = k.first ? d : buf[i] * k.mom + k.keep * d;
      buf[i] = bi;
      d = kNesterov ? d + k.mom * bi : bi;
    }
    p[i] = p[i] - k.lr * d;
  }
}

class SGD final : public detail::FusedOptimizer<SGD, SGDOptions> {
  friend class detail::FusedOptimizer<SGD, SGDOptions>;

 public:
  explicit SGD(const SGDOptions& o) : FusedOptimizer(o) {
    require(o.lr >= 0, "SGD", "lr (learning rate)", o.lr);
    check_options("SGD", o);
  }
  std::string name() const override { return "SGD"; }
  static void check_options(const char* who, const SGDOptions& o) {
    require(o.momentum >= 0, who, "momentum", o.momentum);
    require(o.weight_decay >= 0, who, "weight_decay", o.weight_decay);
    require(std::isfinite(o.dampening), who, "dampening", o.dampening);
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
      throw_value_error(who, ": nesterov momentum requires a momentum > 0 and zero dampening (momentum=", o.momentum,
                        ", dampening=", o.dampening, ")");
  }
  static bool set_option(SGDOptions& o, const std::string& key, double v) {
    if (key == "momentum") o.momentum = v;
    else if (key == "dampening") o.dampening = v;
    else if (key == "weight_decay") o.weight_decay = v;
    else if (key == "nesterov") o.nesterov = v != 0;
    else return false;
    return true;
  }
  static const char* option_names() { return "momentum, dampening, weight_decay, nesterov"; }
  std::optional<UpdateRule> update_rule() const override {
    if (opts_.empty()) return std::nullopt;
    const SGDOptions& o = opts_[0];
    return UpdateRule{UpdateRule::Family::sgd, false,
                      {{"momentum", o.momentum}, {"dampening", o.dampening}, {"weight_decay", o.weight_decay},
                       {"nesterov", o.nesterov ? 1.0 : 0.0}}};
  }

 protected:
  std::vector<std::string> state_names() const override {
    if (!any_group([](const SGDOptions& o) { return o.momentum != 0; })) return {};
    return {"momentum_buffer"};
  }

 private:
  template <typename T>
  void run(const Tensor& params, const Tensor& grads, int64_t b0, int64_t e0, const SGDOptions& o, double lr,
           Executor& exec) {
    T* p = params.data_as<T>();
    const T* g = grads.data_as<T>();
    T* buf = o.momentum != 0 ? state_buffer(0).data_as<T>() : nullptr;
    // torch creates the momentum buffer as a copy of the first (decayed) gradient.
    const SGDCoef<T> k{T(lr), T(o.weight_decay), T(o.momentum), T(1 - o.dampening), t_ == 1};
    dispatch(o.weight_decay != 0, [&](auto decay) {
      dispatch(o.momentum != 0, [&](auto momentum) {
        dispatch(o.nesterov, [&](auto nesterov) {
          detail::segment_chunks(exec, b0, e0, [&](int64_t b, int64_t e) {
            sgd_elements<T, decltype(decay)::value, decltype(momentum)::value, decltype(nesterov)::value>(
                b, e, p, g, buf, k);
          });
        });
      });
    });
  }
};

// Per-step scalars of one Adam update, in the buffer's dtype.
template <typename T>
struct AdamCoef {
  T shrink, wd, w1, b2, w2, bc2_sqrt, eps, neg_step;
};

template <typename T, bool kCoupled, bool kAmsgrad>
void adam_elements(int64_t b, int64_t e, T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
                   T* __restrict vmax, const AdamCoef<T>& k) {
  for (int64_t i = b; i < e; ++i) {
    const T pi = p[i] * k.shrink;
    T gi = g[i];
    if constexpr (kCoupled) gi = gi + k.wd * pi;
    const T mi = lerp(m[i], gi, k.w1);
    const T vi = v[i] * k.b2 + k.w2 * gi * gi;
    T second = vi;
    if constexpr (kAmsgrad) second = vmax[i] = std::max(vmax[i], vi);
    const T denom = std::sqrt(second) / k.bc2_sqrt + k.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + k.neg_step * mi / denom;
  }
}

class Adam final : public detail::FusedOptimizer<Adam, AdamOptions> {
  friend class detail::FusedOptimizer<Adam, AdamOptions>;

 public:
  Adam(const AdamOptions& o, bool decoupled) : FusedOptimizer(o), decoupled_(decoupled) {
    require(o.lr >= 0, name().c_str(), "lr (learning rate)", o.lr);
    check_options(name().c_str(), o);
  }
  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  static void check_options(const char* who, const AdamOptions& o) {
    require(o.eps > 0, who, "eps (epsilon, must be > 0)", o.eps);
    require(o.beta1 >= 0 && o.beta1 < 1, who, "betas[0] (beta1, must be in [0, 1))", o.beta1);
    require(o.beta2 >= 0 && o.beta2 < 1, who, "betas[1] (beta2, must be in [0, 1))", o.beta2);
    require(o.weight_decay >= 0, who, "weight_decay", o.weight_decay);
  }
  static bool set_option(AdamOptions& o, const std::string& key, double v) {
    if (key == "beta1") o.beta1 = v;
    else if (key == "beta2") o.beta2 = v;
    else if (key == "eps") o.eps = v;
    else if (key == "weight_decay") o.weight_decay = v;
    else if (key == "amsgrad") o.amsgrad = v != 0;
    else return false;
    return true;
  }
  static const char* option_names() { return "betas (beta1, beta2), eps, weight_decay, amsgrad"; }
  std::optional<UpdateRule> update_rule() const override {
    if (opts_.empty()) return std::nullopt;
    const AdamOptions& o = opts_[0];
    return UpdateRule{UpdateRule::Family::adam, decoupled_,
                      {{"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay},
                       {"amsgrad", o.amsgrad ? 1.0 : 0.0}}};
  }

 protected:
  std::vector<std::string> state_names() const override {
    if (any_group([](const AdamOptions& o) { return o.amsgrad; })) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    return {"exp_avg", "exp_avg_sq"};
  }

 private:
  template <typename T>
  void run(const Tensor& params, const Tensor& grads, int64_t b0, int64_t e0, const AdamOptions& o, double lr,
           Executor& exec) {
    T* p = params.data_as<T>();
    const T* g = grads.data_as<T>();
    T* m = state_buffer(0).data_as<T>();
    T* v = state_buffer(1).data_as<T>();
    T* vmax = o.amsgrad ? state_buffer(2).data_as<T>() : nullptr;
    const double t = static_cast<double>(t_);
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    AdamCoef<T> k;
    // AdamW shrinks the parameters before the Adam step; a factor of exactly 1 changes nothing.
    k.shrink = decoupled_ ? T(1 - lr * o.weight_decay) : T(1);
    k.wd = T(o.weight_decay);
    k.w1 = T(1 - o.beta1);
    k.b2 = T(o.beta2);
    k.w2 = T(1 - o.beta2);
    k.bc2_sqrt = T(std::sqrt(bc2));
    k.eps = T(o.eps);
    k.neg_step = T(-(lr / bc1));
    dispatch(!decoupled_ && o.weight_decay != 0, [&](auto coupled) {
      dispatch(o.amsgrad, [&](auto amsgrad) {
        detail::segment_chunks(exec, b0, e0, [&](int64_t b, int64_t e) {
          adam_elements<T, decltype(coupled)::value, decltype(amsgrad)::value>(b, e, p, g, m, v, vmax, k);
        });
      });
    });
  }

  bool decoupled_;
};

}  // namespace

std::shared_ptr<Optimizer> sgd(const SGDOptions& o) { return std::make_shared<SGD>(o); }
std::shared_ptr<Optimizer> adam(const AdamOptions& o) { return std::make_shared<Adam>(o, false); }
std::shared_ptr<Optimizer> adamw(const AdamOptions& o) { return std::make_shared<Adam>(o, true); }

}  // namespace treadle::optim
