#pragma once
// The whole public C++ API.
#include "treadle/context.hpp"
#include "treadle/dtype.hpp"
#include "treadle/error.hpp"
#include "treadle/executor.hpp"
#include "treadle/graph.hpp"
#include "treadle/loss.hpp"
#include "treadle/model.hpp"
#include "treadle/module.hpp"
#include "treadle/ops.hpp"
#include "treadle/optim.hpp"
#include "treadle/tensor.hpp"
#include "treadle/trainer.hpp"
