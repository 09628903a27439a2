#pragma once
// Replay buffers for online training inside a running simulation: the host pushes samples between its
// own time steps and the trainer samples batches from them, in the same process, with no thread and no
// allocation after construction.
//
// Policies (as in online-training systems such as Melissa):
//   fifo       first in, first out: a batch is the oldest samples, each used once;
//   firo       first in, random out: a batch is drawn uniformly at random (distinct samples), and a
//              sample leaves after max_reuse uses (default 1);
//   reservoir  keeps a uniform random subset of everything pushed (Vitter's algorithm R: once full,
//              the n-th sample enters with probability capacity / n, replacing a random one); batches
//              are drawn uniformly at random, and samples stay (max_reuse 0) unless a limit is set.
// A full fifo or firo buffer drops its oldest sample for a new one; dropped() counts the samples that
// left unsampled. A sample has named fields of fixed shape and dtype (input, target, a weight, a
// simulation id ...). Everything random comes from the buffer's own seeded generator, whose state is
// part of the buffer's checkpoint state: a resumed run samples the same batches.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "treadle/export.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

enum class ReplayPolicy { fifo, firo, reservoir };
TREADLE_API ReplayPolicy replay_policy_from_name(const std::string& name);  // "fifo", "firo", "reservoir"
TREADLE_API const char* replay_policy_name(ReplayPolicy policy);

struct ReplayField {
  std::string name;
  Shape shape;  // of one sample
  DType dtype = DType::f32;
};

struct ReplayOptions {
  ReplayPolicy policy = ReplayPolicy::firo;
  int64_t capacity = 0;   // samples held at most
  int64_t min_size = 0;   // watermark: sampling is refused while fewer samples are held
  int64_t max_reuse = -1; // uses before a sample leaves: -1 the policy's default (fifo, firo: 1;
                          // reservoir: 0 = unlimited); fifo takes 1 only
  uint64_t seed = 0;
};

class TREADLE_API ReplayBuffer {
 public:
  ReplayBuffer(std::vector<ReplayField> fields, ReplayOptions options);

  // Copies n samples: one tensor per field, in the fields' order, each of shape (n, *field.shape) and the
  // field's dtype (any strides). Everything is checked before anything is copied.
  void push(const std::vector<Tensor>& batch);
  // Whether sample(batch_size) may run: at least max(min_size, batch_size) samples are held.
  bool ready(int64_t batch_size) const;
  // Fills out (one contiguous tensor per field, of shape (batch_size, *field.shape)) with batch_size
  // samples by the policy, then retires the samples that reached max_reuse. ValueError below the
  // watermark, with nothing changed.
  void sample(int64_t batch_size, const std::vector<Tensor>& out);

  int64_t size() const { return count_; }
  int64_t capacity() const { return options_.capacity; }
  int64_t min_size() const { return options_.min_size; }
  int64_t max_reuse() const { return max_reuse_; }
  int64_t pushed() const { return pushed_; }    // samples offered to push, ever
  int64_t dropped() const { return dropped_; }  // samples that left unsampled (overflow, reservoir)
  int64_t sampled() const { return sampled_; }  // samples handed out, ever (with repeats)
  ReplayPolicy policy() const { return options_.policy; }
  // "firo capacity 64 max_reuse 1 fields x:float32(3) ...": what a checkpoint state or an exchange partner
  // must match.
  std::string layout() const;
  const std::vector<ReplayField>& fields() const { return fields_; }

  // Checkpoint state: tensors named "<tensor_prefix><key>" and metadata "<meta_prefix><key>" (strings).
  // import_state checks that the state is this buffer's layout (policy, capacity, max_reuse, fields)
  // and consistent before it changes anything, and throws ValueError naming the difference otherwise;
  // with check_only it only checks.
  void export_state(const std::string& tensor_prefix, const std::string& meta_prefix,
                    std::vector<std::pair<std::string, Tensor>>& tensors,
                    std::map<std::string, std::string>& metadata) const;
  void import_state(const std::string& tensor_prefix, const std::string& meta_prefix,
                    const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& metadata,
                    bool check_only = false);

 private:
  uint64_t next_random();
  int64_t below(int64_t n);  // uniform in [0, n)
  int64_t take_slot();       // a slot for one new sample (evicting by the policy when full); -1: skip it
  void copy_in(int64_t slot, const std::vector<Tensor>& batch, int64_t row);
  void prefetch_slot(int64_t slot) const;
  void retire(int64_t position);
  void remember(int64_t slot);  // firo: the slot's new sample joins the arrival order
  int64_t oldest();             // firo: the live slot that arrived first

  std::vector<ReplayField> fields_;
  ReplayOptions options_;
  int64_t max_reuse_ = 0;
  std::vector<Tensor> storage_;   // per field: (capacity, *shape)
  std::vector<int64_t> live_;     // slots holding samples: fifo in arrival order from head_, else unordered
  std::vector<int64_t> uses_;     // per slot
  std::vector<int64_t> free_;     // free slots (a stack)
  int64_t head_ = 0, count_ = 0;  // fifo: live_ is a ring starting at head_
  // firo's arrival order: a ring of (slot, stamp) entries; an entry is stale once its slot's stamp
  // changed (the sample was retired or replaced). Stamps are push sequence numbers; -1: free.
  std::vector<int64_t> order_slot_, order_stamp_, stamp_;
  int64_t order_head_ = 0, order_count_ = 0;
  int64_t pushed_ = 0, dropped_ = 0, sampled_ = 0;
  uint64_t rng_counter_ = 0;
};

}  // namespace treadle
