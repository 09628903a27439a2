#pragma once
// Which compute backends this build has, fastest first; "eigen" (the reference) is always last.
#include <string>
#include <vector>

#include "treadle/export.hpp"

namespace treadle {
TREADLE_API std::vector<std::string> backend_names();
}  // namespace treadle
