// Learning-rate schedules as closed forms of torch.optim.lr_scheduler (lr after t calls of .step()),
// and global-norm gradient clipping as torch.nn.utils.clip_grad_norm_.
#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <sstream>

#include "backends/eigen/eigen_common.hpp"
#include "treadle/error.hpp"
#include "treadle/optim.hpp"

namespace treadle {
namespace {

void check_step(const std::string& who, int64_t t) {
  if (t < 0) throw_value_error(who, ".lr_at: step must be >= 0, got ", t);
}

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

class ConstantSchedule final : public Schedule {
 public:
  ConstantSchedule(double factor, int64_t total_iters) : factor_(factor), total_iters_(total_iters) {
    if (!(factor >= 0 && factor <= 1))
      throw_value_error("ConstantLR: factor must be in [0, 1], got ", factor);
    if (total_iters < 0) throw_value_error("ConstantLR: total_iters must be >= 0, got ", total_iters);
  }
  double lr_at(int64_t t, double base_lr) const override {
    check_step(name(), t);
    return t < total_iters_ ? base_lr * factor_ : base_lr;
  }
  std::string name() const override {
    return "ConstantLR(factor=" + fmt(factor_) + ", total_iters=" + std::to_string(total_iters_) + ")";
  }

 private:
  double factor_;
  int64_t total_iters_;
};

class StepSchedule final : public Schedule {
 public:
  StepSchedule(int64_t step_size, double gamma) : step_size_(step_size), gamma_(gamma) {
    if (step_size <= 0) throw_value_error("StepLR: step_size must be > 0, got ", step_size);
    if (!(gamma > 0) || !std::isfinite(gamma)) throw_value_error("StepLR: gamma must be > 0, got ", gamma);
  }
  double lr_at(int64_t t, double base_lr) const override {
    check_step(name(), t);
    return base_lr * std::pow(gamma_, static_cast<double>(t / step_size_));
  }
  std::string name() const override {
    return "StepLR(step_size=" + std::to_string(step_size_) + ", gamma=" + fmt(gamma_) + ")";
  }

 private:
  int64_t step_size_;
  double gamma_;
};

class ExponentialSchedule final : public Schedule {
 public:
  explicit ExponentialSchedule(double gamma) : gamma_(gamma) {
    if (!(gamma > 0) || !std::isfinite(gamma)) throw_value_error("ExponentialLR: gamma must be > 0, got ", gamma);
  }
  double lr_at(int64_t t, double base_lr) const override {
    check_step(name(), t);
    return base_lr * std::pow(gamma_, static_cast<double>(t));
  }
  std::string name() const override { return "ExponentialLR(gamma=" + fmt(gamma_) + ")"; }

 private:
  double gamma_;
};

double cosine_at(double base_lr, double eta_min, int64_t t, int64_t t_max) {
  const double phase = std::numbers::pi * static_cast<double>(t) / static_cast<double>(t_max);
  return eta_min + (base_lr - eta_min) * (1 + std::cos(phase)) / 2;
}

class CosineSchedule final : public Schedule {
 public:
  CosineSchedule(int64_t t_max, double eta_min) : t_max_(t_max), eta_min_(eta_min) {
    if (t_max <= 0) throw_value_error("CosineAnnealingLR: T_max must be > 0, got ", t_max);
    if (!(eta_min >= 0) || !std::isfinite(eta_min))
      throw_value_error("CosineAnnealingLR: eta_min must be >= 0, got ", eta_min);
  }
  double lr_at(int64_t t, double base_lr) const override {
    check_step(name(), t);
    return cosine_at(base_lr, eta_min_, t, t_max_);
  }
  std::string name() const override {
    return "CosineAnnealingLR(T_max=" + std::to_string(t_max_) + ", eta_min=" + fmt(eta_min_) + ")";
  }

 private:
  int64_t t_max_;
  double eta_min_;
};

class WarmupCosineSchedule final : public Schedule {
 public:
  WarmupCosineSchedule(int64_t warmup, int64_t total, double eta_min, double start_factor)
      : warmup_(warmup), total_(total), eta_min_(eta_min), start_factor_(start_factor) {
    if (warmup < 0) throw_value_error("WarmupCosineLR: warmup must be >= 0, got ", warmup);
    if (total <= warmup)
      throw_value_error("WarmupCosineLR: total must be > warmup, got total=", total, ", warmup=", warmup);
    if (!(eta_min >= 0) || !std::isfinite(eta_min))
      throw_value_error("WarmupCosineLR: eta_min must be >= 0, got ", eta_min);
    if (!(start_factor >= 0 && start_factor <= 1))
      throw_value_error("WarmupCosineLR: start_factor must be in [0, 1], got ", start_factor);
  }
  double lr_at(int64_t t, double base_lr) const override {
    check_step(name(), t);
    if (t < warmup_) {
      const double frac = static_cast<double>(t) / static_cast<double>(warmup_);
      return base_lr * (start_factor_ + (1 - start_factor_) * frac);
    }
    return cosine_at(base_lr, eta_min_, t - warmup_, total_ - warmup_);
  }
  std::string name() const override {
    return "WarmupCosineLR(warmup=" + std::to_string(warmup_) + ", total=" + std::to_string(total_) +
           ", eta_min=" + fmt(eta_min_) + ", start_factor=" + fmt(start_factor_) + ")";
  }

 private:
  int64_t warmup_, total_;
  double eta_min_, start_factor_;
};

// Sum of squares of [b, e), accumulated in double with four lanes (vectorisable, fixed order).
template <typename T>
double sum_squares(const T* x, int64_t b, int64_t e) {
  double lane[4] = {0, 0, 0, 0};
  int64_t i = b;
  for (; i + 4 <= e; i += 4) {
    for (int k = 0; k < 4; ++k) lane[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
  }
  for (; i < e; ++i) lane[0] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

// At most this many partial sums: blocks grow with the buffer, so nothing is allocated and the
// block boundaries (hence the rounding) depend only on the buffer's size.
constexpr int64_t kMaxNormBlocks = 256;

template <typename T>
double clip_impl(const Tensor& grads, double max_norm, Executor& exec) {
  T* g = grads.data_as<T>();
  const int64_t n = grads.numel();
  const int64_t block = std::max(eigen::kElementGrain, (n + kMaxNormBlocks - 1) / kMaxNormBlocks);
  const int64_t blocks = n == 0 ? 0 : (n + block - 1) / block;
  std::array<double, kMaxNormBlocks> partial{};
  auto body = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) partial[b] = sum_squares(g, b * block, std::min(n, (b + 1) * block));
  };
  if (blocks > 1 && exec.num_workers() > 1)  // one captured reference: std::function stores it inline
    exec.parallel_for(blocks, [&body](int64_t b0, int64_t b1) { body(b0, b1); });
  else
    body(0, blocks);
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) total += partial[b];
  const double norm = std::sqrt(total);
  // torch multiplies by the clamped coefficient unconditionally (so NaN/Inf norms poison the grads).
  const T coef = static_cast<T>(std::min(max_norm / (norm + 1e-6), 1.0));
  if (coef == T(1)) return norm;  // a NaN coefficient (NaN norm) fails this and spreads like torch's
  eigen::parallel_chunks(exec, n, eigen::kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) g[i] = g[i] * coef;
  });
  return norm;
}

}  // namespace

namespace schedule {
std::shared_ptr<Schedule> constant(double factor, int64_t total_iters) {
  return std::make_shared<ConstantSchedule>(factor, total_iters);
}
std::shared_ptr<Schedule> step(int64_t step_size, double gamma) {
  return std::make_shared<StepSchedule>(step_size, gamma);
}
std::shared_ptr<Schedule> exponential(double gamma) { return std::make_shared<ExponentialSchedule>(gamma); }
std::shared_ptr<Schedule> cosine(int64_t t_max, double eta_min) {
  return std::make_shared<CosineSchedule>(t_max, eta_min);
}
std::shared_ptr<Schedule> warmup_cosine(int64_t warmup, int64_t total, double eta_min, double start_factor) {
  return std::make_shared<WarmupCosineSchedule>(warmup, total, eta_min, start_factor);
}
}  // namespace schedule

double clip_grad_norm(const Tensor& grads, double max_norm) {
  return clip_grad_norm(grads, max_norm, serial_executor());
}

double clip_grad_norm(const Tensor& grads, double max_norm, Executor& exec) {
  if (!(max_norm >= 0)) throw_value_error("clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  if (!grads.defined()) throw_value_error("clip_grad_norm: grads is an undefined tensor");
  if (grads.device().kind != DeviceKind::cpu)
    throw_type_error("clip_grad_norm: grads must be on the CPU, got ", device_name(grads.device()));
  if (!grads.is_contiguous()) throw_type_error("clip_grad_norm: grads must be contiguous");
  if (grads.dtype() == DType::f32) return clip_impl<float>(grads, max_norm, exec);
  if (grads.dtype() == DType::f64) return clip_impl<double>(grads, max_norm, exec);
  throw_type_error("clip_grad_norm: grads must be float32 or float64, got ", dtype_name(grads.dtype()));
}

}  // namespace treadle
