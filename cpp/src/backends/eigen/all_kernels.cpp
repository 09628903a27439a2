// Every Eigen kernel family, registered in one table. Compiled into the core (the kernels built for
// the core's own target) and, in a portable build, into each x86-64-v3 / v4 variant, where this
// function reaches that variant's kernels (cmake/TreadleEigenVariants.cmake).
#include "backends/eigen/eigen_backend.hpp"

namespace treadle {

void register_eigen_kernels(KernelTable& t) {
  register_eigen_linear(t);
  register_eigen_elementwise(t);
  register_eigen_math(t);
  register_eigen_shape(t);
  register_eigen_activation(t);
  register_eigen_softmax(t);
  register_eigen_dropout(t);
  register_eigen_loss(t);
  register_eigen_recurrent(t);
  register_eigen_attention(t);
  register_eigen_norm(t);
  register_eigen_embedding(t);
  register_eigen_misc(t);
  register_eigen_conv(t);
  register_eigen_pool(t);
  register_eigen_select(t);
}

}  // namespace treadle
