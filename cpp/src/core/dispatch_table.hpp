#pragma once
// The measured dispatch table behind backend "auto" (public entry points: treadle/dispatch.hpp).
//
// A table maps (op, dtype) to size ranges, each naming the backend that was fastest there. A rule
// holds from its `from` size up to the next rule's `from` for the same op and dtype; sizes below
// the first rule have no entry. The size of a node is measured as `size_measure(op)` says:
// multiply-adds for the products (linear: rows x in x out), the element count of the largest
// operand for everything else.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/kernel.hpp"
#include "treadle/dtype.hpp"

namespace treadle {

class DispatchTable {
 public:
  // Parses the JSON text of a table; errors are ValueErrors that start with "dispatch table <source>:".
  static DispatchTable parse(std::string_view text, const std::string& source);
  // Reads and parses a file; a missing or unreadable file is a ValueError naming it.
  static DispatchTable load_file(const std::string& path);

  // The backend named for (op, dtype, size), or "" where no rule covers it.
  const std::string& lookup(const std::string& op, DType dtype, int64_t size) const;
  const std::string& source() const { return source_; }
  std::size_t num_rules() const;

 private:
  struct Range {
    int64_t from;
    std::string backend;
  };
  std::map<std::pair<std::string, DType>, std::vector<Range>> rules_;  // each vector sorted by `from`
  std::string source_;
};

// "macs" or "elements": how the table measures the size of a node of this op.
const char* size_measure(const std::string& op);
// The size of `node` in the measure of its op.
int64_t node_size(const Graph& g, const Node& node);

// The table plans use now (see treadle/dispatch.hpp for the order of sources); never null.
std::shared_ptr<const DispatchTable> active_dispatch_table();

// Backends to try for `node` under "auto": the table's choice first (when built), then the
// priority order. Plan::select_kernels takes the first that supports the node.
std::vector<const Backend*> auto_backend_order(const Graph& g, const Node& node);

// The backend name that asks for measured dispatch.
inline constexpr const char* kAutoBackend = "auto";

}  // namespace treadle
