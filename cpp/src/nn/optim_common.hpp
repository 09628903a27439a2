#pragma once
// Helpers shared by the fused optimizer kernels (optimizers_basic.cpp, optimizers_adaptive.cpp,
// optimizers_extra.cpp).
// Element loops call std::sqrt: it is the correctly rounded IEEE root (unlike Eigen's EIGEN_FAST_MATH
// packet sqrt on AVX-512), and it vectorises when the build passes -fno-math-errno.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/eigen/eigen_common.hpp"
#include "treadle/error.hpp"
#include "treadle/optim.hpp"

namespace treadle::optim::detail {

// Elements per chunk of a fused update when the host lends workers. An update streams three or
// four buffers and does a few flops per element, so a chunk handed to another core costs more in
// moving its cache lines there (and the parameters back for the next forward) than it saves
// below ~64K elements (measured: a 26K-parameter MLP's Adam split in two made each step ~15% slower).
// Each element is updated alone, so the chunking never changes a result.
inline constexpr int64_t kUpdateGrain = int64_t{1} << 16;

inline void require(bool ok, const char* who, const char* what, double value) {
  if (!ok) throw_value_error(who, ": invalid ", what, " value: ", value);
}

// torch.lerp's formula (exact at both ends): start + w * (end - start), or from the end when w >= 0.5.
template <typename T>
inline T lerp(T start, T end, T w) {
  return std::abs(w) < T(0.5) ? start + w * (end - start) : end - (end - start) * (T(1) - w);
}

// Calls f(std::bool_constant<b>{}): options become compile-time constants, so the element loops
// are branch-free and vectorise.
template <typename F>
void dispatch(bool b, F&& f) {
  if (b)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// The option overrides of one parameter group applied to `defaults` through Derived::set_option
// (false: unknown key) and checked by Derived::check_options; "lr" is kept by the Optimizer base.
template <typename Derived, typename Options>
Options group_options(const std::string& who, const Options& defaults, const ParamGroup& group) {
  Options o = defaults;
  for (const auto& [key, value] : group.options) {
    if (key == "lr") continue;
    if (!std::isfinite(value)) throw_value_error(who, ": invalid ", key, " value: ", value, " (must be finite)");
    if (!Derived::set_option(o, key, value))
      throw_value_error(who, ": unknown parameter-group option '", key, "' (known: lr, ", Derived::option_names(), ")");
  }
  Derived::check_options(who.c_str(), o);
  return o;
}

// Base of the fused optimizers: per-group options (group g's in opts_[g]; opts_[0] the defaults
// without groups), and update() dispatching on the buffers' dtype to, for each segment,
// Derived::run<T>(params, grads, begin, end, options, lr, exec) (private in Derived, which
// befriends this class).
template <typename Derived, typename Options>
class FusedOptimizer : public Optimizer {
 public:
  explicit FusedOptimizer(const Options& o) : Optimizer(o.lr), opts_{o}, defaults_(o) {}

 protected:
  void configure_groups(const std::vector<ParamGroup>& groups) override {
    std::vector<Options> opts;
    for (const ParamGroup& g : groups) opts.push_back(group_options<Derived>(name(), opts_defaults(), g));
    if (opts.empty()) opts.push_back(opts_defaults());
    opts_ = std::move(opts);
  }
  // A refused change (unknown key, invalid value, different state buffers) leaves the group as it was.
  void change_group_option(int g, const std::string& key, double value) override {
    Options& current = opts_[static_cast<std::size_t>(g)];
    Options o = current;
    if (!Derived::set_option(o, key, value))
      throw_value_error(name(), ": unknown parameter-group option '", key, "' (known: lr, ", Derived::option_names(),
                        ")");
    Derived::check_options(name().c_str(), o);
    const std::vector<std::string> before = state_names();
    const Options saved = current;
    current = o;
    if (state_names() != before) {
      current = saved;
      throw_value_error(name(), ": changing ", key, " to ", value, " in parameter group ", g,
                        " would change the optimizer's state buffers; create the optimizer with that value");
    }
  }
  void update(const Tensor& params, const Tensor& grads, Executor& exec) override {
    auto& self = static_cast<Derived&>(*this);
    self.before_update();
    for (const Segment& s : segments_) {
      const Options& o = opts_[static_cast<std::size_t>(s.group)];
      const double lr = step_lrs_[static_cast<std::size_t>(s.group)];
      if (dtype_ == DType::f32)
        self.template run<float>(params, grads, s.begin, s.end, o, lr, exec);
      else
        self.template run<double>(params, grads, s.begin, s.end, o, lr, exec);
    }
  }
  // Hook before the segments run (per-step scalars shared by a group); default: nothing.
  void before_update() {}
  // True when any group satisfies `pred` (which state buffers exist).
  template <typename Pred>
  bool any_group(Pred pred) const {
    return std::any_of(opts_.begin(), opts_.end(), pred);
  }
  const Options& opts_defaults() const { return defaults_; }

  std::vector<Options> opts_;

 private:
  Options defaults_;
};

// Runs f(b, e) over [begin, end) in chunks of at most kUpdateGrain elements on `exec` (absolute
// indices, so element loops index the flat buffers directly).
template <typename F>
void segment_chunks(Executor& exec, int64_t begin, int64_t end, F&& f) {
  eigen::parallel_chunks(exec, end - begin, kUpdateGrain, [&](int64_t b, int64_t e) { f(begin + b, begin + e); });
}

}  // namespace treadle::optim::detail
