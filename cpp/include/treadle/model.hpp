#pragma once
// A model: a traced forward (a module, or a function over symbolic values) plus its parameters
// packed into one flat buffer, and a cache of plans compiled per input signature.
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "treadle/context.hpp"
#include "treadle/loss.hpp"
#include "treadle/module.hpp"
#include "treadle/optim.hpp"

namespace treadle {

class Plan;
class ParameterMirror;  // a device backend's copy of the flat buffers (internal: backends/device_runtime.hpp)

// infer: forward only, eval mode. eval_loss: forward + loss, eval mode, no backward.
// train_seeded: forward + backward from a host-given output gradient. train_loss: forward + loss + backward.
enum class PlanMode : uint8_t { infer, eval_loss, train_seeded, train_loss };

// What a plan is compiled for: input signatures, mode, and for loss plans the loss and target.
struct PlanKey {
  std::vector<Shape> input_shapes;
  std::vector<DType> input_dtypes;
  PlanMode mode = PlanMode::infer;
  bool input_grad = false;
  std::string loss_key;
  Shape target_shape;
  DType target_dtype = DType::f32;
  std::string backend;  // "" = automatic dispatch
  bool deterministic = false;
  std::string precision;  // of the forward's matrix products: "" (float32), "bf16" or "fp16"
  bool fuse = true;       // activation fusion into the products before them
  // train_loss plans: the loss gradient's seed is a scalar input of the loss's dtype bound at run
  // time (Bindings::seeds[0]) instead of the constant 1, e.g. a loss scale.
  bool loss_seed_input = false;
  auto operator<=>(const PlanKey&) const = default;
};

// Memory one input signature needs, in bytes. activations: the plan's arena (intermediate values
// and kernel workspace), which the context running it grows to once.
struct MemoryReport {
  std::size_t parameters = 0, gradients = 0, optimizer_state = 0, activations = 0;
  std::size_t total() const { return parameters + gradients + optimizer_state + activations; }
};

class TREADLE_API Model {
 public:
  using ForwardFn = std::function<std::vector<Value>(Graph& g, const std::vector<Value>& inputs)>;

  explicit Model(std::shared_ptr<Module> root);
  Model(ForwardFn forward, std::vector<NamedParameter> params);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Held by every Trainer call that runs a plan or touches the gradients: the gradients (shared by
  // all trainers of this model) and a trainer's activations are used by one thread at a time. A
  // call from a second thread while one runs raises RuntimeError naming both; a thread may nest.
  class TREADLE_API TrainingCall {
   public:
    TrainingCall(Model& m, const char* who);
    ~TrainingCall();
    TrainingCall(const TrainingCall&) = delete;
    TrainingCall& operator=(const TrainingCall&) = delete;

   private:
    Model& m_;
    bool outer_ = false;
  };

  DType dtype() const { return dtype_; }
  int64_t num_parameters() const { return total_; }
  const std::vector<ParamSlot>& layout() const { return layout_; }
  // With backend "cuda" these accessors first copy newer device values back (see device_buffers).
  const std::vector<NamedParameter>& named_parameters() const { host_access(); return params_; }
  const Tensor& flat_parameters() const { host_access(); return flat_params_; }
  const Tensor& flat_gradients() const { host_access(); return flat_grads_; }
  // The trainable prefix of the flat buffers (parameters with requires_grad, packed first) and its
  // layout: what optimizers, clipping and gradient allreduces work on. Frozen state (batch-norm
  // running statistics, fixed output transforms) follows it.
  const std::vector<ParamSlot>& trainable_layout() const { return trainable_layout_; }
  int64_t num_trainable() const { return trainable_total_; }
  const Tensor& trainable_parameters() const { host_access(); return trainable_params_; }
  const Tensor& trainable_gradients() const { host_access(); return trainable_grads_; }
  // Converts parameters to `dtype` (f32 or f64); drops compiled plans.
  void to(DType dtype);
  void zero_grad();

  // Pin every plan to one backend ("eigen", "onednn", ...; a device backend's name may carry the
  // device index: "cuda:1"), "auto" for the measured dispatch table (treadle/dispatch.hpp) or "" for
  // automatic dispatch in priority order.
  void set_backend(const std::string& name);
  const std::string& backend() const { return backend_; }
  // Deterministic mode: every plan gives bitwise the same results run after run, whatever the
  // environment: kernels a backend marks non-deterministic are skipped, and "auto" ignores the
  // measured dispatch table (which a user's run or TREADLE_DISPATCH_TABLE may change) in favour of
  // the fixed priority order. Drops compiled plans. docs/hardening.md lists what else matters.
  void set_deterministic(bool on);
  bool deterministic() const { return deterministic_; }
  // Compute precision of the matrix products (linear, matmul, bmm) and convolutions of the forward
  // and of their gradients: "float32" (default), "bf16" or "fp16" (operands rounded to bfloat16 or
  // IEEE binary16, float32 accumulation and results; parameters stay float32). fp16 training needs
  // loss scaling (TrainerOptions::loss_scaling). Only for float32 models; drops compiled plans.
  void set_precision(const std::string& name);
  const std::string& precision() const { return precision_; }
  // Activation fusion (on by default): a linear whose output only a relu, tanh or sigmoid reads
  // computes that activation itself (docs/architecture.md). Off: every node runs as traced, e.g. to
  // see pre-activations under check_numerics. Drops compiled plans.
  void set_fusion(bool on);
  bool fusion() const { return fusion_; }
  // Compiled plans kept (one per input signature and mode), least recently used evicted first: a
  // host that feeds a new batch size every step stays within a bounded memory (a plan holds its
  // kernels, oneDNN's JIT code included: ~0.7 MB for a 3-layer MLP). At least 1.
  static constexpr std::size_t kDefaultPlanCacheLimit = 64;
  void set_plan_cache_limit(std::size_t limit);
  std::size_t plan_cache_limit() const;

  // Inference on shared weights; thread-safe (each call takes its own context unless given one).
  std::vector<Tensor> predict(const std::vector<Tensor>& inputs, Context* ctx = nullptr);
  Tensor predict(const Tensor& x, Context* ctx = nullptr) { return predict(std::vector<Tensor>{x}, ctx).at(0); }
  // The allocation-free form: writes into caller-owned outputs of the right shapes and dtypes
  // (output_shapes() tells them). Thread-safe like predict.
  void predict_into(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, Context* ctx = nullptr);
  std::vector<std::pair<Shape, DType>> output_shapes(const std::vector<Tensor>& inputs);
  // The same two steps with the inference plan looked up once (the batch-1 path of bindings):
  // infer_plan validates the inputs and returns their plan (opaque outside the library).
  std::shared_ptr<const Plan> infer_plan(const std::vector<Tensor>& inputs);
  // The plan of the last prediction if `inputs` have its signature, else null; never compiles and
  // never waits for another thread (null then), so a binding may call it holding the GIL and release
  // the GIL only to call infer_plan.
  std::shared_ptr<const Plan> last_infer_plan(const std::vector<Tensor>& inputs);
  static std::vector<std::pair<Shape, DType>> output_shapes(const Plan& plan);
  // The same, one output at a time and without copies (the binding's per-call path).
  static std::size_t num_outputs(const Plan& plan);
  static const Shape& output_shape(const Plan& plan, std::size_t k);
  static DType output_dtype(const Plan& plan, std::size_t k);
  void predict_into(const Plan& plan, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                    Context* ctx = nullptr);

  // Copies of the parameters by name (PyTorch state_dict keys), and loading them back.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  // The plan for `key`, compiled on first request. Thread-safe.
  std::shared_ptr<const Plan> plan(const PlanKey& key, const Loss* loss = nullptr);
  std::size_t num_plans() const;
  // Memory for inputs of these signatures (data unread): a training (forward + backward from a
  // host-given output gradient) or inference plan, compiled if new. optimizer_state is 0 here.
  MemoryReport memory_report(const std::vector<Tensor>& inputs, bool training);
  // Every compiled plan, one line per step: node, op, the backend that runs it, output shapes.
  std::string describe_plans() const;
  // Changes whenever compiled plans are dropped (dtype change, backend pin): caches compare it.
  uint64_t generation() const { return generation_.load(); }
  // Checks inputs against the model's dtype and layout rules; builds the inference key.
  PlanKey infer_key(const std::vector<Tensor>& inputs) const;

  // A device backend ("cuda": cuda:0; "cuda:N": device N): the flat parameter and gradient buffers have copies on the
  // device, made on the first device step or prediction (its runtime's ParameterMirror). The host buffers stay the
  // model's state as seen from outside: every accessor above, state_dict, load_state_dict, to() and
  // checkpoints first copy values the device holds newer back to the host, and values handed out
  // for writing are uploaded again before the next device use. Parameter objects a module still
  // holds view the host buffer without that copy: read them after one of the accessors.
  struct DeviceBuffers {
    void* params = nullptr;
    void* grads = nullptr;
  };
  // The device copies, current for work enqueued on `stream` (a cudaStream_t) from now on: the
  // stream waits for the last use's work, host values written since are uploaded, the gradients
  // zeroed after zero_grad(). Creates the copies on first use, on the device of the model's backend
  // (ValueError without a device, or in a build without a device backend).
  DeviceBuffers device_buffers(void* stream);
  // Marks the end of a use whose work is enqueued on `stream` (the next use waits for it); `params`
  // / `grads`: that work writes them, so the host's copies are stale until read.
  void device_written(void* stream, bool params, bool grads);
  // Device allocations made for the device copies and predictions' inputs: constant once steady.
  uint64_t device_allocations() const;

 private:
  // Copies device-newer values back into the host buffers; `will_write`: the host may change them,
  // so the next device use uploads them again.
  void device_to_host(bool will_write) const;
  void host_access() const {
    if (device_) device_to_host(true);
  }
  struct MirrorDeleter {
    void operator()(ParameterMirror* m) const noexcept;
  };
  std::unique_ptr<ParameterMirror, MirrorDeleter> device_;  // null until the first device use
  ParameterMirror& device_mirror();  // made on first use, for the device of the model's backend
  void pack_parameters();
  std::shared_ptr<Plan> compile(const PlanKey& key, const Loss* loss) const;  // no lock held: it traces
  std::vector<Value> trace(Graph& g, const std::vector<Value>& inputs) const;

  std::shared_ptr<Module> root_;
  ForwardFn forward_;
  std::vector<NamedParameter> params_;
  std::vector<ParamSlot> layout_, trainable_layout_;
  int64_t total_ = 0, trainable_total_ = 0;
  Tensor trainable_params_, trainable_grads_;
  DType dtype_ = DType::f32;
  Tensor flat_params_, flat_grads_;
  std::string backend_;
  bool deterministic_ = false;
  bool fusion_ = true;
  std::string precision_ = "float32";
  mutable std::mutex mutex_;  // guards plans_ and contexts_
  struct CachedPlan {
    std::shared_ptr<const Plan> plan;
    uint64_t last_use = 0;  // plan_clock_ at the last lookup
  };
  std::map<PlanKey, CachedPlan> plans_;
  uint64_t plan_clock_ = 0;
  std::size_t plan_cache_limit_ = kDefaultPlanCacheLimit;
  void evict_plans_over_limit();  // mutex_ held
  std::vector<std::unique_ptr<Context>> free_contexts_;
  // One pooled context held outside the lock: a single caller's predictions (the batch-1 loop) take
  // and return it with one atomic exchange each; concurrent callers fall back to free_contexts_.
  std::atomic<Context*> spare_context_{nullptr};
  std::atomic<uint64_t> generation_{0};
  // Changes only when the flat buffers are re-packed (a dtype change): a plan compiled before a
  // setting changed still runs correctly, one compiled before a re-pack does not.
  std::atomic<uint64_t> layout_generation_{0};
  std::atomic<std::thread::id> training_thread_{};  // see TrainingCall
  std::atomic<const char*> training_call_{nullptr};
  // The inference plan used last, answered without building a key (guarded by mutex_).
  struct LastInfer {
    uint64_t generation = ~uint64_t{0};
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    std::shared_ptr<const Plan> plan;
  } last_infer_;
  std::shared_ptr<const Plan> last_infer_hit(const std::vector<Tensor>& inputs) const;  // mutex_ held
  std::unique_ptr<Context> take_context();
  void return_context(std::unique_ptr<Context> c);
};

}  // namespace treadle
