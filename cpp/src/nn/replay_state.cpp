// ReplayBuffer checkpoint state: the storage, slot bookkeeping and counters as named tensors and
// metadata, checked completely against this buffer's layout before anything is restored.
#include <algorithm>
#include <limits>

#include "treadle/error.hpp"
#include "treadle/replay.hpp"

namespace treadle {

namespace {

Tensor int64_tensor(const std::vector<int64_t>& values, std::size_t n) {
  Tensor t({static_cast<int64_t>(n)}, DType::i64);
  std::copy(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n), t.data_as<int64_t>());
  return t;
}

uint64_t parse_count(const std::map<std::string, std::string>& md, const std::string& key, const std::string& who) {
  auto it = md.find(key);
  if (it == md.end()) throw_value_error(who, ": the replay state lacks '", key, "'");
  const std::string& v = it->second;
  if (v.empty() || v.size() > 20 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
    throw_value_error(who, ": '", key, "' is not a count: '", v, "'");
  return std::stoull(v);
}

}  // namespace

std::string ReplayBuffer::layout() const {
  std::string s = std::string(replay_policy_name(options_.policy)) + " capacity " + std::to_string(options_.capacity) +
                  " max_reuse " + std::to_string(max_reuse_) + " fields";
  for (const ReplayField& f : fields_) s += " " + f.name + ":" + dtype_name(f.dtype) + shape_str(f.shape);
  return s;
}

void ReplayBuffer::export_state(const std::string& prefix, const std::string& meta,
                                std::vector<std::pair<std::string, Tensor>>& tensors,
                                std::map<std::string, std::string>& metadata) const {
  for (std::size_t f = 0; f < fields_.size(); ++f) tensors.emplace_back(prefix + "field:" + fields_[f].name, storage_[f]);
  const auto cap = static_cast<std::size_t>(options_.capacity);
  tensors.emplace_back(prefix + "live", int64_tensor(live_, cap));
  tensors.emplace_back(prefix + "uses", int64_tensor(uses_, cap));
  tensors.emplace_back(prefix + "free", int64_tensor(free_, free_.size()));
  // firo's arrival order, from its head: (slot, stamp) entries, and the slots' stamps.
  std::vector<int64_t> order(static_cast<std::size_t>(2 * order_count_));
  for (int64_t i = 0; i < order_count_; ++i) {
    const int64_t at = (order_head_ + i) % options_.capacity;
    order[2 * i] = order_slot_[at], order[2 * i + 1] = order_stamp_[at];
  }
  tensors.emplace_back(prefix + "order", int64_tensor(order, order.size()));
  tensors.emplace_back(prefix + "stamp", int64_tensor(stamp_, cap));
  metadata[meta + "layout"] = layout();
  const std::pair<const char*, uint64_t> counts[] = {
      {"head", static_cast<uint64_t>(head_)},       {"count", static_cast<uint64_t>(count_)},
      {"pushed", static_cast<uint64_t>(pushed_)},   {"dropped", static_cast<uint64_t>(dropped_)},
      {"sampled", static_cast<uint64_t>(sampled_)}, {"seed", options_.seed},
      {"rng_counter", rng_counter_}, {"order_count", static_cast<uint64_t>(order_count_)}};
  for (const auto& [key, value] : counts) metadata[meta + key] = std::to_string(value);
}

void ReplayBuffer::import_state(const std::string& prefix, const std::string& meta,
                                const std::map<std::string, Tensor>& tensors,
                                const std::map<std::string, std::string>& metadata, bool check_only) {
  const std::string who = "ReplayBuffer state '" + prefix + "'";
  auto it = metadata.find(meta + "layout");
  if (it == metadata.end()) throw_value_error(who, ": no replay buffer state under this name");
  if (it->second != layout())
    throw_value_error(who, ": saved for a buffer '", it->second, "', this one is '", layout(), "'");
  const int64_t cap = options_.capacity;
  const auto count = static_cast<int64_t>(parse_count(metadata, meta + "count", who));
  const auto head = static_cast<int64_t>(parse_count(metadata, meta + "head", who));
  if (count > cap || head >= cap) throw_value_error(who, ": count ", count, " or head ", head, " out of range");
  const auto tensor = [&](const std::string& key, DType dtype, const Shape& shape) -> const Tensor& {
    auto t = tensors.find(prefix + key);
    if (t == tensors.end()) throw_value_error(who, ": the state lacks tensor '", prefix + key, "'");
    if (t->second.dtype() != dtype || t->second.shape() != shape)
      throw_value_error(who, ": tensor '", prefix + key, "' is ", dtype_name(t->second.dtype()), shape_str(t->second.shape()),
                        ", expected ", dtype_name(dtype), shape_str(shape));
    return t->second;
  };
  std::vector<const Tensor*> stored;
  for (std::size_t f = 0; f < fields_.size(); ++f)
    stored.push_back(&tensor("field:" + fields_[f].name, fields_[f].dtype, storage_[f].shape()));
  const bool fifo = options_.policy == ReplayPolicy::fifo;
  const Tensor& live = tensor("live", DType::i64, {cap});
  const Tensor& uses = tensor("uses", DType::i64, {cap});
  const Tensor& free = tensor("free", DType::i64, {fifo ? cap : cap - count});
  const auto order_count = static_cast<int64_t>(parse_count(metadata, meta + "order_count", who));
  if (order_count > cap) throw_value_error(who, ": order_count ", order_count, " out of range");
  const Tensor& order = tensor("order", DType::i64, {2 * order_count});
  const Tensor& stamp = tensor("stamp", DType::i64, {cap});
  for (int64_t i = 0; i < order_count; ++i)
    if (order.data_as<int64_t>()[2 * i] < 0 || order.data_as<int64_t>()[2 * i] >= cap)
      throw_value_error(who, ": the arrival order names a slot out of range");
  // The slots must be a partition: live ones (count of them) and free ones, each slot once.
  if (!fifo) {
    std::vector<char> seen(static_cast<std::size_t>(cap), 0);
    const int64_t* l = live.data_as<int64_t>();
    const int64_t* fr = free.data_as<int64_t>();
    for (int64_t i = 0; i < cap; ++i) {
      const int64_t slot = i < count ? l[i] : fr[i - count];
      if (slot < 0 || slot >= cap || seen[slot]++) throw_value_error(who, ": the slot lists are inconsistent");
    }
  }
  const uint64_t values[] = {parse_count(metadata, meta + "pushed", who), parse_count(metadata, meta + "dropped", who),
                             parse_count(metadata, meta + "sampled", who), parse_count(metadata, meta + "seed", who),
                             parse_count(metadata, meta + "rng_counter", who)};
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (values[0] > kMax || values[1] > kMax || values[2] > kMax) throw_value_error(who, ": a counter is out of range");
  if (check_only) return;
  // Everything checked: from here on nothing throws.
  for (std::size_t f = 0; f < fields_.size(); ++f) storage_[f].copy_from(*stored[f]);
  std::copy_n(live.data_as<int64_t>(), cap, live_.begin());
  std::copy_n(uses.data_as<int64_t>(), cap, uses_.begin());
  free_.assign(free.data_as<int64_t>(), free.data_as<int64_t>() + free.numel());
  for (int64_t i = 0; i < order_count; ++i)
    order_slot_[i] = order.data_as<int64_t>()[2 * i], order_stamp_[i] = order.data_as<int64_t>()[2 * i + 1];
  order_head_ = 0, order_count_ = order_count;
  std::copy_n(stamp.data_as<int64_t>(), cap, stamp_.begin());
  head_ = head, count_ = count;
  pushed_ = static_cast<int64_t>(values[0]), dropped_ = static_cast<int64_t>(values[1]);
  sampled_ = static_cast<int64_t>(values[2]);
  options_.seed = values[3], rng_counter_ = values[4];
}

}  // namespace treadle
