#include "backends/eigen/eigen_backend.hpp"

#include <cstdlib>
#include <string>

#include "treadle/error.hpp"

#ifdef TREADLE_EIGEN_VARIANTS
// The Eigen kernels compiled for wider instruction sets (cmake/TreadleEigenVariants.cmake).
extern "C" void treadle_register_eigen_kernels_v3(treadle::KernelTable& t);
extern "C" void treadle_register_eigen_kernels_v4(treadle::KernelTable& t);
#endif

namespace treadle {
namespace {

// Which compilation of the kernels runs: the core's own ("built-in"), or in a portable build the
// widest variant this CPU supports. TREADLE_EIGEN_KERNELS=baseline|x86-64-v3|x86-64-v4 picks one
// (for tests and comparisons); a variant the CPU lacks is an error, never a SIGILL.
std::string register_kernels(KernelTable& table) {
#ifdef TREADLE_EIGEN_VARIANTS
  __builtin_cpu_init();
  const bool v4 = __builtin_cpu_supports("x86-64-v4"), v3 = __builtin_cpu_supports("x86-64-v3");
  const char* env = std::getenv("TREADLE_EIGEN_KERNELS");
  const std::string want = env && *env ? env : (v4 ? "x86-64-v4" : v3 ? "x86-64-v3" : "baseline");
  if ((want == "x86-64-v4" && !v4) || (want == "x86-64-v3" && !v3))
    throw_runtime_error("TREADLE_EIGEN_KERNELS=", want, ": this CPU does not support that instruction set");
  if (want == "x86-64-v4") {
    treadle_register_eigen_kernels_v4(table);
    return want;
  }
  if (want == "x86-64-v3") {
    treadle_register_eigen_kernels_v3(table);
    return want;
  }
  if (want != "baseline")
    throw_value_error("TREADLE_EIGEN_KERNELS must be baseline, x86-64-v3 or x86-64-v4, got '", want, "'");
  register_eigen_kernels(table);
  return "baseline";
#else
  register_eigen_kernels(table);
  return "built-in";
#endif
}

// Kernels by op and dtype (KernelTable::add(op, dtype, kernel)): the node's key dtype picks one.
class EigenBackend final : public TableBackend {
 public:
  EigenBackend() : kernels_(register_kernels(table_)) {}
  const char* name() const override { return "eigen"; }
  std::vector<std::pair<std::string, std::string>> build_info() const override { return {{"kernels", kernels_}}; }

 private:
  std::string kernels_;
};

}  // namespace

const Backend& eigen_backend() {
  static const EigenBackend backend;
  return backend;
}

}  // namespace treadle
