#pragma once
// The oneDNN CPU backend (optional, TREADLE_WITH_ONEDNN): float32 matrix products, activations and
// softmax on oneDNN primitives built once per plan. Nodes it does not take fall back to Eigen.
#include "backends/kernel.hpp"

namespace treadle {

const Backend& onednn_backend();

}  // namespace treadle
