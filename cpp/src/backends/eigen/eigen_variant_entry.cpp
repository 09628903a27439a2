// The entry point of one Eigen kernel variant, compiled only into the variant objects of a portable
// build with TREADLE_EIGEN_VARIANT = v3 or v4 (cmake/TreadleEigenVariants.cmake): the one global
// symbol of the variant, through which eigen_backend.cpp reaches that variant's kernels.
#include "backends/eigen/eigen_backend.hpp"

#define TREADLE_EIGEN_ENTRY_CAT2(a, b) a##b
#define TREADLE_EIGEN_ENTRY_CAT(a, b) TREADLE_EIGEN_ENTRY_CAT2(a, b)

extern "C" void TREADLE_EIGEN_ENTRY_CAT(treadle_register_eigen_kernels_, TREADLE_EIGEN_VARIANT)(treadle::KernelTable& t) {
  treadle::register_eigen_kernels(t);
}
