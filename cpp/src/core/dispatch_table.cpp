#include "core/dispatch_table.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

#include "core/op_registry.hpp"
#include "nn/json.hpp"
#include "treadle/dispatch.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {

constexpr const char* kFormat = "treadle-dispatch-table";
constexpr uint64_t kVersion = 1;
// Backends a table may name: those treadle has or plans. A table written on a machine with more
// backends than this build still loads; rules naming a backend not built here are passed over.
constexpr const char* kKnownBackends[] = {"eigen", "onednn", "cuda"};

bool is_product(const std::string& op) {
  return op == "linear" || op == "matmul" || op == "bmm" || op == "conv" || op == "conv_backward_data";
}

bool op_exists(const std::string& name) {
  const OpRegistry& reg = OpRegistry::instance();
  for (int k = 0; k < reg.size(); ++k)
    if (reg.at(k).name == name) return true;
  return false;
}

const std::string& member_string(const json::Value& rule, const char* key, const std::string& where) {
  const json::Value* v = rule.find(key);
  if (!v || v->kind != json::Kind::string)
    throw_value_error(where, ": '", key, "' must be a string, got ", v ? json::kind_name(v->kind) : "nothing");
  return v->text;
}

}  // namespace

const char* size_measure(const std::string& op) { return is_product(op) ? "macs" : "elements"; }

int64_t node_size(const Graph& g, const Node& node) {
  const std::string& op = OpRegistry::instance().at(node.op).name;
  auto numel = [&](int id) { return shape_numel(g.info(id).shape); };
  auto dims = [&](int id) -> const Shape& { return g.info(id).shape; };
  if (op == "linear") return numel(node.outputs[0]) * dims(node.inputs[0]).back();  // rows x out x in
  if (op == "matmul" || op == "bmm") {
    const Shape& a = dims(node.inputs[0]);
    const int64_t k = node.attrs.i_or("trans_a", 0) ? a[a.size() - 2] : a.back();
    return numel(node.outputs[0]) * k;
  }
  if (op == "conv" || op == "conv_backward_data") {  // output x (in channels / groups x kernel volume)
    const Shape& w = dims(node.inputs[1]);
    return numel(node.outputs[0]) * (w[0] > 0 ? shape_numel(w) / w[0] : 0);
  }
  int64_t largest = 0;
  for (int id : node.inputs) largest = std::max(largest, numel(id));
  for (int id : node.outputs) largest = std::max(largest, numel(id));
  return largest;
}

std::size_t DispatchTable::num_rules() const {
  std::size_t n = 0;
  for (const auto& [key, ranges] : rules_) n += ranges.size();
  return n;
}

const std::string& DispatchTable::lookup(const std::string& op, DType dtype, int64_t size) const {
  static const std::string none;
  auto it = rules_.find({op, dtype});
  if (it == rules_.end()) return none;
  const std::vector<Range>& ranges = it->second;
  // The last range starting at or below `size`.
  auto r = std::upper_bound(ranges.begin(), ranges.end(), size, [](int64_t s, const Range& x) { return s < x.from; });
  return r == ranges.begin() ? none : std::prev(r)->backend;
}

DispatchTable DispatchTable::parse(std::string_view text, const std::string& source) {
  const std::string who = "dispatch table " + source;
  const json::Value doc = json::parse(text, who);
  if (doc.kind != json::Kind::object) throw_value_error(who, ": expected a JSON object, got ", json::kind_name(doc.kind));
  const json::Value* format = doc.find("format");
  if (!format || format->kind != json::Kind::string || format->text != kFormat)
    throw_value_error(who, ": 'format' must be \"", kFormat, "\"", format ? "" : " (missing)");
  const json::Value* version = doc.find("version");
  if (!version || json::as_uint(*version) != kVersion)
    throw_value_error(who, ": 'version' must be ", kVersion, version ? ", got " + version->text : " (missing)");
  const json::Value* rules = doc.find("rules");
  if (!rules || rules->kind != json::Kind::array)
    throw_value_error(who, ": 'rules' must be an array, got ", rules ? json::kind_name(rules->kind) : "nothing");

  DispatchTable table;
  table.source_ = source;
  for (std::size_t k = 0; k < rules->items.size(); ++k) {
    const json::Value& rule = rules->items[k];
    const std::string where = who + ": rule " + std::to_string(k);
    if (rule.kind != json::Kind::object) throw_value_error(where, ": expected an object, got ", json::kind_name(rule.kind));
    const std::string& op = member_string(rule, "op", where);
    if (!op_exists(op)) throw_value_error(where, ": unknown op '", op, "'");
    const std::string& dtype_text = member_string(rule, "dtype", where);
    DType dtype;
    try {
      dtype = dtype_from_name(dtype_text);
    } catch (const std::exception&) {
      throw_value_error(where, ": unknown dtype '", dtype_text, "'");
    }
    const std::string& measure = member_string(rule, "measure", where);
    if (measure != size_measure(op))
      throw_value_error(where, ": op '", op, "' is measured in ", size_measure(op), ", the rule says '", measure, "'");
    const std::string& backend = member_string(rule, "backend", where);
    if (std::none_of(std::begin(kKnownBackends), std::end(kKnownBackends), [&](const char* b) { return backend == b; }))
      throw_value_error(where, ": unknown backend '", backend, "' (known: eigen, onednn, cuda)");
    const json::Value* from = rule.find("from");
    std::optional<uint64_t> start = from ? json::as_uint(*from) : std::nullopt;
    if (!start || *start > static_cast<uint64_t>(INT64_MAX))
      throw_value_error(where, ": 'from' must be a non-negative integer size, got ", from ? from->text : "nothing");
    std::vector<Range>& ranges = table.rules_[{op, dtype}];
    const int64_t at = static_cast<int64_t>(*start);
    auto pos = std::lower_bound(ranges.begin(), ranges.end(), at, [](const Range& r, int64_t s) { return r.from < s; });
    if (pos != ranges.end() && pos->from == at)
      throw_value_error(where, ": a second rule for ", op, " ", dtype_text, " from ", at);
    ranges.insert(pos, Range{at, backend});
  }
  return table;
}

DispatchTable DispatchTable::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_value_error("dispatch table ", path, ": cannot read the file (", std::strerror(errno), ")");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw_value_error("dispatch table ", path, ": reading the file failed");
  return parse(text.str(), path);
}

// -- which table is in use ------------------------------------------------------------------------
namespace {

struct TableState {
  std::mutex mutex;
  std::shared_ptr<const DispatchTable> loaded;  // load_dispatch_table
  std::string default_path;                     // set_default_dispatch_table
  std::shared_ptr<const DispatchTable> cached;  // the environment's or default file, parsed once
  std::string cached_key;                       // the source `cached` was read from
};

TableState& state() {
  static TableState s;
  return s;
}

// The table from a file named by the environment or the default; parsed on first use and kept
// while the name stays the same. Called with the state's mutex held.
std::shared_ptr<const DispatchTable> file_table(TableState& s, const std::string& path, const std::string& origin) {
  const std::string key = path + " (" + origin + ")";
  if (!s.cached || s.cached_key != key) {
    std::shared_ptr<DispatchTable> table;
    try {
      table = std::make_shared<DispatchTable>(DispatchTable::load_file(path));
    } catch (const ValueError& e) {
      throw_value_error(e.what(), " [", origin, "]");
    }
    s.cached = std::move(table);
    s.cached_key = key;
  }
  return s.cached;
}

}  // namespace

std::shared_ptr<const DispatchTable> active_dispatch_table() {
  static const auto empty = std::make_shared<const DispatchTable>();
  TableState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.loaded) return s.loaded;
  const char* env = std::getenv("TREADLE_DISPATCH_TABLE");
  if (env && *env) return file_table(s, env, "TREADLE_DISPATCH_TABLE");
  if (!s.default_path.empty()) return file_table(s, s.default_path, "default");
  return empty;
}

std::vector<const Backend*> auto_backend_order(const Graph& g, const Node& node) {
  const std::vector<const Backend*>& priority = available_backends();
  const DType dt = node.inputs.empty() ? g.info(node.outputs[0]).dtype : g.info(node.inputs[0]).dtype;
  const std::string& name = active_dispatch_table()->lookup(OpRegistry::instance().at(node.op).name, dt,
                                                           node_size(g, node));
  std::vector<const Backend*> order;
  for (const Backend* b : priority)
    if (name == b->name()) order.push_back(b);
  for (const Backend* b : priority)
    if (order.empty() || b != order.front()) order.push_back(b);
  return order;
}

void load_dispatch_table(const std::string& path) {
  auto table = std::make_shared<const DispatchTable>(DispatchTable::load_file(path));
  TableState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.loaded = std::move(table);
}

void clear_dispatch_table() {
  TableState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.loaded.reset();
}

void set_default_dispatch_table(const std::string& path) {
  TableState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.default_path = path;
}

std::string dispatch_table_source() {
  std::shared_ptr<const DispatchTable> t = active_dispatch_table();
  TableState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (t == s.loaded && t) return t->source() + " (loaded)";
  if (t == s.cached && t) return s.cached_key;
  return "none";
}

std::string dispatch_table_lookup(const std::string& op, DType dtype, int64_t size) {
  return active_dispatch_table()->lookup(op, dtype, size);
}

}  // namespace treadle
