#pragma once
// The Eigen reference backend: every op, float32 and float64. Other backends are checked against it.
#include "backends/kernel.hpp"

namespace treadle {

const Backend& eigen_backend();

// Each kernel family file provides one of these; eigen_backend.cpp calls them all.
void register_eigen_linear(KernelTable& t);
void register_eigen_elementwise(KernelTable& t);
void register_eigen_math(KernelTable& t);
void register_eigen_shape(KernelTable& t);
void register_eigen_activation(KernelTable& t);
void register_eigen_softmax(KernelTable& t);
void register_eigen_dropout(KernelTable& t);
void register_eigen_loss(KernelTable& t);
void register_eigen_recurrent(KernelTable& t);
void register_eigen_attention(KernelTable& t);
void register_eigen_norm(KernelTable& t);
void register_eigen_embedding(KernelTable& t);
void register_eigen_misc(KernelTable& t);
void register_eigen_conv(KernelTable& t);
void register_eigen_pool(KernelTable& t);
void register_eigen_select(KernelTable& t);
// All of the above (all_kernels.cpp).
void register_eigen_kernels(KernelTable& t);

}  // namespace treadle
