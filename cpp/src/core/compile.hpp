#pragma once
// Builds a plan for a key: trace the forward, add the loss or the host's seed, derive the backward
// pass, then place memory and pick kernels.
#include <functional>
#include <memory>

#include "core/plan.hpp"
#include "treadle/loss.hpp"
#include "treadle/model.hpp"

namespace treadle {

using TraceFn = std::function<std::vector<Value>(Graph&, const std::vector<Value>&)>;
using ParamOffsetFn = std::function<int64_t(const std::shared_ptr<Parameter>&)>;  // bytes into the flat buffer

std::shared_ptr<Plan> compile_plan(const PlanKey& key, const TraceFn& trace, const Loss* loss,
                                   const ParamOffsetFn& param_offset);

}  // namespace treadle
