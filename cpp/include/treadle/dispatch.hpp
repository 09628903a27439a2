#pragma once
// Backend "auto" (Model::set_backend("auto")): each node of a plan goes to the backend that a
// measured dispatch table names for its op, dtype and problem size, and to the usual priority
// order where the table has no rule. The table is a JSON file written by the crossover study
// (`python -m treadle bench crossover --write-table PATH`); see bench/README.md for its format.
//
// Which table plans use, first match wins: the one given to load_dispatch_table; the file named by
// the environment variable TREADLE_DISPATCH_TABLE; the default set by set_default_dispatch_table
// (the Python package sets the table it ships); none (every node in priority order).
// The table is read when a plan is compiled: plans compiled earlier keep their kernels (call
// Model::set_backend("auto") again to recompile).
#include <cstdint>
#include <string>

#include "treadle/dtype.hpp"
#include "treadle/export.hpp"

namespace treadle {

// Reads and installs the user's table; throws ValueError naming `path` when it is missing or invalid.
TREADLE_API void load_dispatch_table(const std::string& path);
// Forgets the table given to load_dispatch_table (back to the environment variable or the default).
TREADLE_API void clear_dispatch_table();
// The file used when neither load_dispatch_table nor TREADLE_DISPATCH_TABLE gives one ("" = none).
// Read lazily, at the first "auto" plan.
TREADLE_API void set_default_dispatch_table(const std::string& path);
// Where the table in use comes from: "<path> (loaded|TREADLE_DISPATCH_TABLE|default)" or "none".
TREADLE_API std::string dispatch_table_source();
// The backend the table in use names for an op at this problem size ("" = no rule: priority order).
TREADLE_API std::string dispatch_table_lookup(const std::string& op, DType dtype, int64_t size);

}  // namespace treadle
