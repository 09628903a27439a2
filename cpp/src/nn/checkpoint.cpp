// Model files and training checkpoints on top of the safetensors format (treadle/serialize.hpp).
// Loading follows one rule: check the whole file against the model (and optimizer) first, then
// write, so a file that does not fit changes nothing.
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include "nn/serialize_common.hpp"
#include "treadle/error.hpp"
#include "treadle/serialize.hpp"

namespace treadle {

using namespace serialize_detail;

namespace {

constexpr const char* kOptimizerPrefix = "optimizer:";
constexpr const char* kReserved[] = {"treadle.version", "treadle.kind", "treadle.dtype", "treadle.checksum",
                                     "treadle.optimizer", "treadle.step", "treadle.lr", "treadle.rng_seed",
                                     "treadle.rng_counter", "treadle.loss_scale",
                                     "treadle.loss_scale_growth_tracker", "treadle.group_lrs"};

void check_user_metadata(const Metadata& m, const std::string& who) {
  for (const char* k : kReserved)
    if (m.count(k)) throw_value_error(who, ": metadata key '", k, "' is reserved (treadle writes it)");
}

std::string who_for(const char* fn, const std::string& source) { return std::string(fn) + "('" + source + "')"; }

std::string format_double(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest text that reads back to the same bits
  return std::string(buf, r.ptr);
}

const std::string& required(const Metadata& m, const std::string& key, const std::string& who) {
  auto it = m.find(key);
  if (it == m.end()) throw_value_error(who, ": the checkpoint has no '", key, "' entry");
  return it->second;
}

uint64_t parse_uint(const Metadata& m, const std::string& key, const std::string& who, uint64_t max) {
  const std::string& s = required(m, key, who);
  uint64_t x = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), x);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || x > max)
    throw_value_error(who, ": '", key, "' = '", s, "' is not an integer in [0, ", max, "]");
  return x;
}

double parse_lr(const Metadata& m, const std::string& who) {
  const std::string& s = required(m, "treadle.lr", who);
  double x = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), x);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || !(x >= 0) ||
      x == std::numeric_limits<double>::infinity())
    throw_value_error(who, ": 'treadle.lr' = '", s, "' is not a finite non-negative number");
  return x;
}

// The learning rates of parameter groups 1, 2, ... ("treadle.group_lrs", space-separated; group 0's
// is "treadle.lr"). Absent (a checkpoint of an optimizer without groups): the current ones are kept.
std::vector<double> parse_group_lrs(const Metadata& m, const Optimizer& o, const std::string& who) {
  std::vector<double> lrs;
  auto it = m.find("treadle.group_lrs");
  if (it == m.end()) return lrs;
  std::istringstream in(it->second);
  for (std::string tok; in >> tok;) {
    double x = 0;
    auto r = std::from_chars(tok.data(), tok.data() + tok.size(), x);
    if (r.ec != std::errc() || r.ptr != tok.data() + tok.size() || !(x >= 0) || !std::isfinite(x))
      throw_value_error(who, ": 'treadle.group_lrs' holds '", tok, "', not a finite non-negative number");
    lrs.push_back(x);
  }
  if (static_cast<int>(lrs.size()) + 1 != o.num_groups())
    throw_value_error(who, ": the checkpoint has ", lrs.size() + 1, " parameter groups, the optimizer has ",
                      o.num_groups());
  return lrs;
}

std::string kind_of(const TensorFile& f) {
  auto it = f.metadata.find("treadle.kind");
  return it == f.metadata.end() ? std::string() : it->second;
}

constexpr const char* kReplayPrefix = "replay:";
bool is_optimizer_entry(const std::string& name) { return name.rfind(kOptimizerPrefix, 0) == 0; }
// Entries of a checkpoint that are not parameters: optimizer state and replay buffer state.
bool is_state_entry(const std::string& name) { return is_optimizer_entry(name) || name.rfind(kReplayPrefix, 0) == 0; }

// The file's parameters (optimizer entries of checkpoints skipped), checked against the model's
// names, shapes and (when `exact_dtype`) dtype; every mismatch is listed in one message.
std::map<std::string, Tensor> checked_parameters(const TensorFile& f, const Model& m, bool exact_dtype,
                                                 const std::string& who) {
  const bool checkpoint = kind_of(f) == "checkpoint";
  std::optional<DType> declared;
  if (auto it = f.metadata.find("treadle.dtype"); it != f.metadata.end()) {
    if (it->second == "float32") declared = DType::f32;
    else if (it->second == "float64") declared = DType::f64;
    else throw_value_error(who, ": the file declares dtype '", it->second, "' (expected float32 or float64)");
  }
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : f.tensors) {
    if (checkpoint && is_state_entry(name)) continue;
    if (!is_floating(t.dtype()))
      throw_value_error(who, ": tensor '", name, "' holds ", dtype_name(t.dtype()), " data; parameters are floating point");
    if (declared && t.dtype() != *declared)
      throw_value_error(who, ": tensor '", name, "' is ", dtype_name(t.dtype()), " but the file declares ",
                        dtype_name(*declared), " (corrupt or mislabelled file)");
    if (exact_dtype && t.dtype() != m.dtype())
      throw_value_error(who, ": the checkpoint holds ", dtype_name(t.dtype()), " parameters but the model is ",
                        dtype_name(m.dtype()), "; resuming bit for bit needs the same dtype (convert the model first)");
    state.emplace(name, t);
  }
  std::vector<std::string> problems;
  std::set<std::string> known;
  for (const ParamSlot& s : m.layout()) {
    known.insert(s.name);
    auto it = state.find(s.name);
    if (it == state.end()) problems.push_back("missing '" + s.name + "'");
    else if (it->second.shape() != s.shape)
      problems.push_back("'" + s.name + "' has shape " + shape_str(it->second.shape()) + " in the file but " +
                         shape_str(s.shape) + " in the model");
  }
  for (const auto& kv : state)
    if (!known.count(kv.first)) problems.push_back("unexpected '" + kv.first + "'");
  if (!problems.empty()) {
    std::string list;
    for (std::size_t i = 0; i < problems.size() && i < 8; ++i) list += (i ? "; " : "") + problems[i];
    if (problems.size() > 8) list += "; and " + std::to_string(problems.size() - 8) + " more";
    throw_value_error(who, ": the file does not match the model's architecture: ", list);
  }
  return state;
}

NamedTensors parameter_tensors(const Model& m) {
  NamedTensors out;
  for (const auto& [name, p] : m.named_parameters()) out.emplace_back(name, p->value());
  return out;
}

// The optimizer's state buffers in the file, in the optimizer's order, after checking names,
// dtypes and sizes.
std::vector<const Tensor*> checked_optimizer_state(const TensorFile& f, Optimizer& o, const std::string& who) {
  const std::string& name = required(f.metadata, "treadle.optimizer", who);
  if (name != o.name())
    throw_value_error(who, ": the checkpoint holds ", name, " state but the trainer's optimizer is ", o.name());
  if (!o.bound()) throw_value_error(who, ": the optimizer is not bound to the model");
  std::vector<const Tensor*> out;
  for (auto& [sname, buf] : o.state()) {
    const Tensor* t = f.find(kOptimizerPrefix + sname);
    if (!t) throw_value_error(who, ": the checkpoint has no optimizer state '", sname, "'");
    if (t->dtype() != buf.dtype())
      throw_value_error(who, ": optimizer state '", sname, "' is ", dtype_name(t->dtype()), ", the optimizer's is ",
                        dtype_name(buf.dtype()));
    if (t->shape() != buf.shape())
      throw_value_error(who, ": optimizer state '", sname, "' has shape ", shape_str(t->shape()),
                        ", the optimizer's has ", shape_str(buf.shape()));
    out.push_back(t);
  }
  std::size_t in_file = 0;
  for (const auto& kv : f.tensors) in_file += is_optimizer_entry(kv.first);
  if (in_file != out.size())
    throw_value_error(who, ": the checkpoint has ", in_file, " optimizer state buffers, ", o.name(), " has ",
                      out.size());
  return out;
}

// The dynamic loss scaler's state in a checkpoint: both keys or neither (files from trainers without
// dynamic loss scaling, and older files, have neither).
struct ScalerState {
  bool present = false;
  double scale = 0;
  int64_t growth_tracker = 0;
};

ScalerState parse_scaler_state(const Metadata& m, const std::string& who) {
  constexpr const char* kScale = "treadle.loss_scale";
  constexpr const char* kTracker = "treadle.loss_scale_growth_tracker";
  ScalerState st;
  const bool has_scale = m.count(kScale) > 0, has_tracker = m.count(kTracker) > 0;
  if (has_scale != has_tracker)
    throw_value_error(who, ": the checkpoint has '", has_scale ? kScale : kTracker, "' without '",
                      has_scale ? kTracker : kScale, "'");
  if (!has_scale) return st;
  const std::string& s = m.at(kScale);
  auto r = std::from_chars(s.data(), s.data() + s.size(), st.scale);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || !(st.scale > 0) ||
      st.scale > std::numeric_limits<float>::max() || static_cast<double>(static_cast<float>(st.scale)) != st.scale)
    throw_value_error(who, ": '", kScale, "' = '", s, "' is not a positive finite float32 value");
  constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  st.growth_tracker = static_cast<int64_t>(parse_uint(m, kTracker, who, kMaxInt64));
  st.present = true;
  return st;
}

}  // namespace

void save_model(const std::string& path, const Model& model, const Metadata& metadata) {
  const std::string who = who_for("save_model", path);
  check_user_metadata(metadata, who);
  Metadata md = metadata;
  md["treadle.kind"] = "model";
  md["treadle.dtype"] = dtype_name(model.dtype());
  write_safetensors(path, parameter_tensors(model), md, who);
}

void load_model(const TensorFile& file, Model& model) {
  const std::string who = who_for("load_model", file.source);
  const std::string kind = kind_of(file);
  if (!kind.empty() && kind != "model" && kind != "checkpoint")
    throw_value_error(who, ": unknown treadle.kind '", kind, "' (expected model or checkpoint)");
  std::map<std::string, Tensor> state = checked_parameters(file, model, false, who);
  model.load_state_dict(state, true);
}

Metadata load_model(const std::string& path, Model& model) {
  TensorFile f = read_safetensors(path, who_for("load_model", path));
  load_model(f, model);
  return std::move(f.metadata);
}

namespace {
// The checkpoint's metadata: the user's, plus the optimizer's and the trainer's state.
Metadata checkpoint_metadata(Trainer& trainer, const Metadata& metadata) {
  Model& m = trainer.model();
  Optimizer& o = trainer.optimizer();
  Metadata md = metadata;
  md["treadle.kind"] = "checkpoint";
  md["treadle.dtype"] = dtype_name(m.dtype());
  md["treadle.optimizer"] = o.name();
  md["treadle.step"] = std::to_string(o.step_count());
  md["treadle.lr"] = format_double(o.lr());
  if (o.num_groups() > 1) {
    std::string lrs;
    for (int g = 1; g < o.num_groups(); ++g) lrs += (g > 1 ? " " : "") + format_double(o.group_lr(g));
    md["treadle.group_lrs"] = lrs;
  }
  md["treadle.rng_seed"] = std::to_string(trainer.context().seed());
  md["treadle.rng_counter"] = std::to_string(trainer.context().rng_counter());
  if (trainer.options().loss_scaling.mode == LossScaling::Mode::dynamic) {
    md["treadle.loss_scale"] = format_double(trainer.loss_scale());
    md["treadle.loss_scale_growth_tracker"] = std::to_string(trainer.loss_scale_growth_tracker());
  }
  return md;
}
}  // namespace

void save_checkpoint(const std::string& path, Trainer& trainer, const Metadata& metadata) {
  save_checkpoint(path, trainer, metadata, ReplayBuffers{});
}

void load_checkpoint(const TensorFile& file, Trainer& trainer) {
  const std::string who = who_for("load_checkpoint", file.source);
  const std::string kind = kind_of(file);
  if (kind != "checkpoint")
    throw_value_error(who, ": not a treadle training checkpoint (treadle.kind is '", kind,
                      "'); load model weights with load_model");
  Model& m = trainer.model();
  Optimizer& o = trainer.optimizer();
  std::map<std::string, Tensor> state = checked_parameters(file, m, true, who);
  std::vector<const Tensor*> opt_state = checked_optimizer_state(file, o, who);
  constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const auto step = static_cast<int64_t>(parse_uint(file.metadata, "treadle.step", who, kMaxInt64));
  const double lr = parse_lr(file.metadata, who);
  const std::vector<double> group_lrs = parse_group_lrs(file.metadata, o, who);
  const uint64_t seed = parse_uint(file.metadata, "treadle.rng_seed", who, std::numeric_limits<uint64_t>::max());
  const uint64_t counter =
      parse_uint(file.metadata, "treadle.rng_counter", who, std::numeric_limits<uint64_t>::max());
  const ScalerState scaler = parse_scaler_state(file.metadata, who);
  // Everything checked: from here on nothing throws.
  m.load_state_dict(state, true);
  for (std::size_t i = 0; i < opt_state.size(); ++i) o.state()[i].second.copy_from(*opt_state[i]);
  o.set_step_count(step);
  o.set_lr(lr);
  for (std::size_t g = 0; g < group_lrs.size(); ++g) o.set_group_lr(static_cast<int>(g) + 1, group_lrs[g]);
  trainer.context().set_rng_state(seed, counter);
  // A trainer without dynamic loss scaling ignores the state.
  if (scaler.present) trainer.set_loss_scale_state(scaler.scale, scaler.growth_tracker);
}

Metadata load_checkpoint(const std::string& path, Trainer& trainer) {
  return load_checkpoint(path, trainer, ReplayBuffers{});
}

namespace {
std::string replay_tensor_prefix(const std::string& name) { return std::string(kReplayPrefix) + name + ":"; }
std::string replay_meta_prefix(const std::string& name) { return "treadle.replay." + name + "."; }

void check_buffer_names(const ReplayBuffers& buffers, const std::string& who) {
  std::set<std::string> names;
  for (const auto& [name, buffer] : buffers) {
    if (name.empty() || name.find(':') != std::string::npos || !buffer)
      throw_value_error(who, ": replay buffer names must be non-empty without ':' (and the buffers not null), got '",
                        name, "'");
    if (!names.insert(name).second) throw_value_error(who, ": replay buffer '", name, "' is given twice");
  }
}
}  // namespace

void save_checkpoint(const std::string& path, Trainer& trainer, const Metadata& metadata, const ReplayBuffers& buffers) {
  const std::string who = who_for("save_checkpoint", path);
  check_buffer_names(buffers, who);
  check_user_metadata(metadata, who);
  Model& m = trainer.model();
  Optimizer& o = trainer.optimizer();
  if (!o.bound()) throw_value_error(who, ": the optimizer is not bound to the model");
  NamedTensors tensors = parameter_tensors(m);
  for (auto& [name, buf] : o.state()) tensors.emplace_back(kOptimizerPrefix + name, buf);
  Metadata md = checkpoint_metadata(trainer, metadata);
  for (const auto& [name, buffer] : buffers)
    buffer->export_state(replay_tensor_prefix(name), replay_meta_prefix(name), tensors, md);
  write_safetensors(path, tensors, md, who);
}

Metadata load_checkpoint(const std::string& path, Trainer& trainer, const ReplayBuffers& buffers) {
  const std::string who = who_for("load_checkpoint", path);
  check_buffer_names(buffers, who);
  TensorFile f = read_safetensors(path, who);
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, t] : f.tensors)
    if (name.rfind(kReplayPrefix, 0) == 0) tensors.emplace(name, t);
  for (const auto& [name, buffer] : buffers)  // every buffer checked before the trainer changes
    buffer->import_state(replay_tensor_prefix(name), replay_meta_prefix(name), tensors, f.metadata, true);
  load_checkpoint(f, trainer);  // checks everything of its own before it changes anything
  for (const auto& [name, buffer] : buffers)
    buffer->import_state(replay_tensor_prefix(name), replay_meta_prefix(name), tensors, f.metadata);
  return std::move(f.metadata);
}

}  // namespace treadle
