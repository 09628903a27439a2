// ReplayBuffer: preallocated storage per field, slots handed out by the policy, a counter-based
// generator (splitmix64 of seed and counter) whose whole state is two integers.
#include "treadle/replay.hpp"

#include <algorithm>
#include <cstring>

#include "treadle/error.hpp"

namespace treadle {

ReplayPolicy replay_policy_from_name(const std::string& name) {
  if (name == "fifo") return ReplayPolicy::fifo;
  if (name == "firo") return ReplayPolicy::firo;
  if (name == "reservoir") return ReplayPolicy::reservoir;
  throw_value_error("ReplayBuffer: policy must be 'fifo', 'firo' or 'reservoir', got '", name, "'");
}

const char* replay_policy_name(ReplayPolicy policy) {
  switch (policy) {
    case ReplayPolicy::fifo: return "fifo";
    case ReplayPolicy::firo: return "firo";
    case ReplayPolicy::reservoir: break;
  }
  return "reservoir";
}

ReplayBuffer::ReplayBuffer(std::vector<ReplayField> fields, ReplayOptions options)
    : fields_(std::move(fields)), options_(options) {
  const int64_t cap = options_.capacity;
  if (cap <= 0) throw_value_error("ReplayBuffer: capacity must be positive, got ", cap);
  if (options_.min_size < 0 || options_.min_size > cap)
    throw_value_error("ReplayBuffer: min_size must be in [0, capacity = ", cap, "], got ", options_.min_size);
  if (fields_.empty()) throw_value_error("ReplayBuffer: give at least one field");
  const int64_t fallback = options_.policy == ReplayPolicy::reservoir ? 0 : 1;
  max_reuse_ = options_.max_reuse < 0 ? fallback : options_.max_reuse;
  if (options_.policy == ReplayPolicy::fifo && max_reuse_ != 1)
    throw_value_error("ReplayBuffer: a fifo buffer hands each sample out once (max_reuse 1), got ", max_reuse_);
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    const ReplayField& f = fields_[i];
    if (f.name.empty()) throw_value_error("ReplayBuffer: field ", i, " has no name");
    for (std::size_t j = 0; j < i; ++j)
      if (fields_[j].name == f.name) throw_value_error("ReplayBuffer: field '", f.name, "' is given twice");
    for (int64_t d : f.shape)
      if (d < 0) throw_value_error("ReplayBuffer: field '", f.name, "' has a negative dimension in ", shape_str(f.shape));
    if (f.dtype != DType::f32 && f.dtype != DType::f64 && f.dtype != DType::i64 && f.dtype != DType::i32)
      throw_value_error("ReplayBuffer: field '", f.name, "' must be float32, float64, int64 or int32, got ",
                        dtype_name(f.dtype));
    Shape full{cap};
    full.insert(full.end(), f.shape.begin(), f.shape.end());
    storage_.emplace_back(full, f.dtype);
    std::memset(storage_.back().data(), 0, storage_.back().nbytes());
  }
  live_.assign(static_cast<std::size_t>(cap), 0);
  uses_.assign(static_cast<std::size_t>(cap), 0);
  order_slot_.assign(static_cast<std::size_t>(cap), 0);
  order_stamp_.assign(static_cast<std::size_t>(cap), 0);
  stamp_.assign(static_cast<std::size_t>(cap), -1);
  free_.reserve(static_cast<std::size_t>(cap));
  for (int64_t s = cap - 1; s >= 0; --s) free_.push_back(s);
}

uint64_t ReplayBuffer::next_random() {
  uint64_t z = options_.seed + (++rng_counter_) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Lemire's multiply-and-reject: exactly uniform.
int64_t ReplayBuffer::below(int64_t n) {
  const auto range = static_cast<uint64_t>(n);
  unsigned __int128 m = static_cast<unsigned __int128>(next_random()) * range;
  if (static_cast<uint64_t>(m) < range) {
    const uint64_t threshold = (0 - range) % range;
    while (static_cast<uint64_t>(m) < threshold) m = static_cast<unsigned __int128>(next_random()) * range;
  }
  return static_cast<int64_t>(m >> 64);
}

void ReplayBuffer::remember(int64_t slot) {
  const int64_t cap = options_.capacity;
  if (order_count_ == cap) {  // full of entries, some stale (fewer than cap samples are live): compact
    int64_t kept = 0;
    for (int64_t i = 0; i < order_count_; ++i) {
      const int64_t at = (order_head_ + i) % cap;
      if (stamp_[order_slot_[at]] != order_stamp_[at]) continue;
      order_slot_[kept] = order_slot_[at], order_stamp_[kept] = order_stamp_[at];
      ++kept;
    }
    order_head_ = 0, order_count_ = kept;
  }
  stamp_[slot] = pushed_;
  const int64_t at = (order_head_ + order_count_++) % cap;
  order_slot_[at] = slot, order_stamp_[at] = pushed_;
}

int64_t ReplayBuffer::oldest() {
  const int64_t cap = options_.capacity;
  for (;;) {  // count_ == cap here: a live entry exists
    const int64_t slot = order_slot_[order_head_], stamp = order_stamp_[order_head_];
    order_head_ = (order_head_ + 1) % cap;
    --order_count_;
    if (stamp_[slot] == stamp) return slot;
  }
}

int64_t ReplayBuffer::take_slot() {
  const int64_t cap = options_.capacity;
  if (options_.policy == ReplayPolicy::fifo) {
    if (count_ < cap) return (head_ + count_++) % cap;
    const int64_t oldest = head_;
    head_ = (head_ + 1) % cap;
    ++dropped_;
    return oldest;
  }
  const bool firo = options_.policy == ReplayPolicy::firo;
  int64_t slot = -1;
  if (count_ < cap) {
    slot = free_.back();
    free_.pop_back();
    live_[count_++] = slot;
  } else {
    ++dropped_;  // the new sample, or the one it replaces
    if (firo) {
      slot = oldest();
    } else {
      const int64_t j = below(pushed_);  // algorithm R: pushed_ counts this sample already
      slot = j < cap ? live_[j] : -1;
    }
  }
  if (firo) remember(slot);
  return slot;
}

void ReplayBuffer::copy_in(int64_t slot, const std::vector<Tensor>& batch, int64_t row) {
  for (std::size_t f = 0; f < fields_.size(); ++f) {
    const std::size_t bytes = storage_[f].nbytes() / static_cast<std::size_t>(options_.capacity);
    std::memcpy(static_cast<char*>(storage_[f].data()) + static_cast<std::size_t>(slot) * bytes,
                static_cast<const char*>(batch[f].data()) + static_cast<std::size_t>(row) * bytes, bytes);
  }
  uses_[slot] = 0;
}

namespace {
// Whether t holds samples of shape `sample` (n of them when n >= 0), compared without building a Shape:
// push and sample allocate nothing.
bool holds(const Tensor& t, const Shape& sample, int64_t n) {
  if (!t.defined() || t.ndim() != static_cast<int>(sample.size()) + 1 || (n >= 0 && t.dim(0) != n)) return false;
  for (std::size_t d = 0; d < sample.size(); ++d)
    if (t.shape()[d + 1] != sample[d]) return false;
  return true;
}

std::string batch_shape(const Shape& sample) {  // "(n, 3, 2)" for samples of shape (3, 2)
  std::string s = "(n";
  for (int64_t d : sample) s += ", " + std::to_string(d);
  return s + ")";
}
}  // namespace

void ReplayBuffer::push(const std::vector<Tensor>& batch) {
  if (batch.size() != fields_.size())
    throw_value_error("ReplayBuffer.push: expected ", fields_.size(), " fields, got ", batch.size());
  int64_t n = -1;
  for (std::size_t f = 0; f < fields_.size(); ++f) {
    const ReplayField& field = fields_[f];
    const Tensor& t = batch[f];
    if (!holds(t, field.shape, -1) || t.dtype() != field.dtype)
      throw_value_error("ReplayBuffer.push: field '", field.name, "' must be ", dtype_name(field.dtype), " of shape ",
                        batch_shape(field.shape), ", got ",
                        t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape()) : "nothing");
    if (n >= 0 && t.dim(0) != n)
      throw_value_error("ReplayBuffer.push: the fields hold different numbers of samples (", n, " and ", t.dim(0), ")");
    n = t.dim(0);
  }
  std::vector<Tensor> contiguous;  // strided host arrays are copied once; contiguous ones are read in place
  const std::vector<Tensor>* src = &batch;
  if (std::any_of(batch.begin(), batch.end(), [](const Tensor& t) { return !t.is_contiguous(); })) {
    for (const Tensor& t : batch) contiguous.push_back(t.is_contiguous() ? t : t.clone());
    src = &contiguous;
  }
  for (int64_t row = 0; row < n; ++row) {
    ++pushed_;
    const int64_t slot = take_slot();
    if (slot >= 0) copy_in(slot, *src, row);
  }
}

bool ReplayBuffer::ready(int64_t batch_size) const {
  return batch_size > 0 && count_ >= std::max(options_.min_size, batch_size);
}

void ReplayBuffer::retire(int64_t position) {
  const int64_t slot = live_[position];
  stamp_[slot] = -1;  // its arrival entry turns stale
  live_[position] = live_[count_ - 1];
  --count_;
  free_.push_back(slot);
}

void ReplayBuffer::prefetch_slot(int64_t slot) const {
#if defined(__GNUC__) || defined(__clang__)
  constexpr std::size_t kLine = 64, kMostBytes = 4096;  // longer rows: the hardware prefetcher follows the stream
  for (const Tensor& store : storage_) {
    const std::size_t bytes = store.nbytes() / static_cast<std::size_t>(options_.capacity);
    const char* row = static_cast<const char*>(store.data()) + static_cast<std::size_t>(slot) * bytes;
    for (std::size_t offset = 0; offset < std::min(bytes, kMostBytes); offset += kLine)
      __builtin_prefetch(row + offset);
  }
#else
  (void)slot;
#endif
}

void ReplayBuffer::sample(int64_t batch_size, const std::vector<Tensor>& out) {
  if (batch_size <= 0) throw_value_error("ReplayBuffer.sample: batch_size must be positive, got ", batch_size);
  if (!ready(batch_size))
    throw_value_error("ReplayBuffer.sample: ", count_, " samples held, ", std::max(options_.min_size, batch_size),
                      " needed (batch_size ", batch_size, ", min_size ", options_.min_size, "): push more first");
  if (out.size() != fields_.size())
    throw_value_error("ReplayBuffer.sample: expected ", fields_.size(), " output arrays, got ", out.size());
  for (std::size_t f = 0; f < fields_.size(); ++f)
    if (!holds(out[f], fields_[f].shape, batch_size) || out[f].dtype() != fields_[f].dtype || !out[f].is_contiguous())
      throw_value_error("ReplayBuffer.sample: output for field '", fields_[f].name, "' must be a contiguous ",
                        dtype_name(fields_[f].dtype), " array of shape ",
                        batch_shape(fields_[f].shape).replace(1, 1, std::to_string(batch_size)));
  const auto copy_out = [&](int64_t slot, int64_t row) {
    for (std::size_t f = 0; f < fields_.size(); ++f) {
      const std::size_t bytes = storage_[f].nbytes() / static_cast<std::size_t>(options_.capacity);
      std::memcpy(static_cast<char*>(out[f].data()) + static_cast<std::size_t>(row) * bytes,
                  static_cast<const char*>(storage_[f].data()) + static_cast<std::size_t>(slot) * bytes, bytes);
    }
  };
  sampled_ += batch_size;
  if (options_.policy == ReplayPolicy::fifo) {
    for (int64_t i = 0; i < batch_size; ++i) copy_out((head_ + i) % options_.capacity, i);
    head_ = (head_ + batch_size) % options_.capacity;
    count_ -= batch_size;
    return;
  }
  // Distinct samples: a partial Fisher-Yates shuffle of the live slots brings the batch to the front.
  for (int64_t i = 0; i < batch_size; ++i) std::swap(live_[i], live_[i + below(count_ - i)]);
  // Random rows of a store larger than the caches wait on memory latency, not bandwidth: the rows a few
  // samples ahead are requested while this one is copied.
  constexpr int64_t kAhead = 4;
  for (int64_t i = 0; i < std::min(kAhead, batch_size); ++i) prefetch_slot(live_[i]);
  for (int64_t i = 0; i < batch_size; ++i) {
    if (i + kAhead < batch_size) prefetch_slot(live_[i + kAhead]);
    copy_out(live_[i], i);
    ++uses_[live_[i]];
  }
  if (max_reuse_ == 0) return;
  for (int64_t i = batch_size - 1; i >= 0; --i)  // back to front: a swapped-in slot is never revisited
    if (uses_[live_[i]] >= max_reuse_) retire(i);
}

}  // namespace treadle
