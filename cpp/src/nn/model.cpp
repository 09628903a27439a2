#include "treadle/model.hpp"

#include <array>
#include <cstring>
#include <optional>
#include <set>
#include <span>

#include "backends/device_runtime.hpp"
#include "core/compile.hpp"
#include "ops/precision.hpp"
#include "treadle/error.hpp"

namespace treadle {

namespace {
constexpr int64_t kSlotAlignElements = 16;  // 64-byte alignment for float32 tensor starts
constexpr std::size_t kMaxOutputs = 8;      // outputs predict may compute in place

bool bytes_overlap(const void* a, std::size_t na, const void* b, std::size_t nb) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

// Whether the output buffers overlap neither each other, the inputs (as read: `in_ptrs`) nor the
// parameters; only then may the plan compute into them (predict(x, out=x) must read x whole first).
bool outputs_apart(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                   std::span<void* const> in_ptrs, const Tensor& params) {
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const void* o = outputs[k].data();
    const std::size_t n = outputs[k].nbytes();
    if (bytes_overlap(o, n, params.data(), params.nbytes())) return false;
    for (std::size_t j = 0; j < k; ++j)
      if (bytes_overlap(o, n, outputs[j].data(), outputs[j].nbytes())) return false;
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (bytes_overlap(o, n, in_ptrs[i], inputs[i].nbytes())) return false;
  }
  return true;
}
}  // namespace

Model::Model(std::shared_ptr<Module> root) : root_(std::move(root)) {
  if (!root_) throw_value_error("Model: module is null");
  params_ = root_->named_parameters();
  pack_parameters();
}

Model::Model(ForwardFn forward, std::vector<NamedParameter> params)
    : forward_(std::move(forward)), params_(std::move(params)) {
  if (!forward_) throw_value_error("Model: forward function is empty");
  pack_parameters();
}

Model::~Model() {
  for (auto& np : params_)
    if (np.second->owner() == this) np.second->set_owner(nullptr);
  delete spare_context_.load();
}

// Moves every parameter into one flat buffer (and sizes the gradient buffer to match), so the
// optimizer, the allreduce and checkpoints each touch one contiguous block.
void Model::pack_parameters() {
  std::set<Parameter*> seen;
  std::vector<NamedParameter> unique;
  for (auto& np : params_) {
    if (!np.second) throw_value_error("Model: parameter '", np.first, "' is null");
    np.second = Parameter::resolve(np.second);  // a tied parameter is its target
    if (seen.insert(np.second.get()).second) unique.push_back(np);  // shared weights: first name wins
  }
  params_ = std::move(unique);
  for (auto& [name, p] : params_)
    if (p->owner() && p->owner() != this)
      throw_value_error("Model: parameter '", name, "' already belongs to another model (a parameter lives in one ",
                        "model's flat buffer; build the model from the outermost module only)");
  if (!params_.empty()) dtype_ = params_[0].second->value().dtype();
  for (auto& [name, p] : params_)
    if (p->value().dtype() != dtype_)
      throw_type_error("Model: all parameters must share one dtype; '", name, "' is ", dtype_name(p->value().dtype()),
                       ", '", params_[0].first, "' is ", dtype_name(dtype_));
  // Trainable parameters first: the optimizer, clipping and the gradient allreduce see one
  // contiguous prefix and never touch state such as batch-norm running statistics.
  layout_.assign(params_.size(), ParamSlot{});
  trainable_layout_.clear();
  total_ = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& [name, p] = params_[i];
      if (p->requires_grad() != (pass == 0)) continue;
      layout_[i] = ParamSlot{name, p->value().shape(), total_, p->value().numel()};
      if (pass == 0) trainable_layout_.push_back(layout_[i]);
      total_ += (layout_[i].numel + kSlotAlignElements - 1) / kSlotAlignElements * kSlotAlignElements;
      if (pass == 0) trainable_total_ = total_;
    }
  if (trainable_layout_.empty()) trainable_total_ = 0;
  for (auto& np : params_) np.second->set_owner(this);  // only once every check has passed
  device_.reset();  // the layout changed: the device copies are made again on their next use
  flat_params_ = Tensor({total_}, dtype_);
  flat_grads_ = Tensor({total_}, dtype_);
  trainable_params_ = Tensor(flat_params_.storage(), 0, {trainable_total_}, dtype_);
  trainable_grads_ = Tensor(flat_grads_.storage(), 0, {trainable_total_}, dtype_);
  const std::size_t es = dtype_size(dtype_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor view(flat_params_.storage(), layout_[i].offset * es, layout_[i].shape, dtype_);
    view.copy_from(params_[i].second->value());
    params_[i].second->rebind(view);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.clear();
  ++generation_;
  ++layout_generation_;
}

void Model::to(DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f64)
    throw_type_error("Model.to: dtype must be float32 or float64, got ", dtype_name(dtype));
  if (dtype != DType::f32 && precision_ != "float32")
    throw_type_error("Model.to: precision '", precision_, "' needs float32 parameters, got ", dtype_name(dtype),
                     "; call set_precision(\"float32\") first");
  host_access();  // the conversion reads the current values
  for (auto& [name, p] : params_) p->rebind(p->value().to(dtype));
  dtype_ = dtype;
  pack_parameters();
}

void Model::zero_grad() {
  std::memset(flat_grads_.data(), 0, flat_grads_.nbytes());
  if (device_) device_->zero_grad();
}

void Model::set_backend(const std::string& name) {
  if (!name.empty() && name != "auto") backend_by_name(name);  // validates; "auto": the measured dispatch table
  if (device_ && !(plan_device(name) == device_->device())) {  // leaving the device: its values come home
    device_to_host(false);
    device_.reset();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  backend_ = name;
  plans_.clear();
  ++generation_;
}

void Model::set_deterministic(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  deterministic_ = on;
  plans_.clear();
  ++generation_;
}

void Model::set_fusion(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  fusion_ = on;
  plans_.clear();
  ++generation_;
}

void Model::set_precision(const std::string& name) {
  check_precision_name("Model.set_precision", name);
  if (name != "float32" && dtype_ != DType::f32)
    throw_type_error("Model.set_precision: precision '", name, "' needs a float32 model, got ", dtype_name(dtype_));
  std::lock_guard<std::mutex> lock(mutex_);
  precision_ = name;
  plans_.clear();
  ++generation_;
}

std::vector<Value> Model::trace(Graph& g, const std::vector<Value>& inputs) const {
  if (forward_) return forward_(g, inputs);
  if (inputs.size() != 1) throw_value_error("model: expected 1 input, got ", inputs.size());
  return {root_->forward(inputs[0])};
}

PlanKey Model::infer_key(const std::vector<Tensor>& inputs) const {
  PlanKey key;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) throw_value_error("model: input ", i, " is undefined");
    // Integer inputs are indices (e.g. for an Embedding); an op that needs floats rejects them when traced.
    if (t.dtype() != dtype_ && !is_integer(t.dtype()))
      throw_type_error("model: expected input", inputs.size() > 1 ? " " + std::to_string(i) : std::string(),
                       " of dtype ", dtype_name(dtype_), " (or integer indices), got ", dtype_name(t.dtype()),
                       "; convert the data (x.astype(np.", dtype_name(dtype_), "))",
                       t.dtype() == DType::f64 || t.dtype() == DType::f32
                           ? std::string(" or the model (model.to(\"") + dtype_name(t.dtype()) + "\"))"
                           : std::string());
    if (t.ndim() == 0) throw_value_error("model: input ", i, " is a scalar; expected a batch");
    if (t.dim(0) == 0) throw_value_error("model: empty batch (input of shape ", shape_str(t.shape()), ")");
    key.input_shapes.push_back(t.shape());
    key.input_dtypes.push_back(t.dtype());
  }
  std::lock_guard<std::mutex> lock(mutex_);  // the setters write these under the lock, from any thread
  key.backend = backend_;
  key.deterministic = deterministic_;
  key.fuse = fusion_;
  if (precision_ != "float32") key.precision = precision_;
  return key;
}

// Lock order (docs/architecture.md, "Locks"): the GIL, then a model's mutex_, never the other way.
// Tracing runs the host's forward, which takes the GIL in Python, so a plan compiles with no lock
// of the model held: a thread holding the GIL and waiting for mutex_ (a setter) would deadlock
// against it otherwise. The key carries every setting the plan depends on, so a setter that runs
// meanwhile does not make it wrong (it only empties the cache); a re-pack of the flat buffers does
// (layout_generation_), and the plan is then compiled again. Two threads compiling one key both
// trace (tracing state is per thread) and the first to publish wins.
std::shared_ptr<const Plan> Model::plan(const PlanKey& key, const Loss* loss) {
  for (;;) {
    uint64_t layout_generation = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) {
        it->second.last_use = ++plan_clock_;
        return it->second.plan;
      }
      layout_generation = layout_generation_;
    }
    std::shared_ptr<Plan> plan = compile(key, loss);
    plan->owner = this;
    plan->owner_generation = layout_generation;
    std::lock_guard<std::mutex> lock(mutex_);
    if (layout_generation_ != layout_generation) continue;  // re-packed while tracing: offsets changed
    auto [it, fresh] = plans_.emplace(key, CachedPlan{std::move(plan), 0});
    it->second.last_use = ++plan_clock_;
    std::shared_ptr<const Plan> result = it->second.plan;
    if (fresh) evict_plans_over_limit();
    return result;
  }
}

void Model::evict_plans_over_limit() {
  // A linear scan per insertion over at most limit + 1 entries; callers hold their plans by
  // shared_ptr, so an evicted plan lives on until its last run ends.
  while (plans_.size() > plan_cache_limit_) {
    auto oldest = plans_.begin();
    for (auto it = plans_.begin(); it != plans_.end(); ++it)
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    plans_.erase(oldest);
  }
}

void Model::set_plan_cache_limit(std::size_t limit) {
  if (limit < 1) throw_value_error("Model.set_plan_cache_limit: the limit must be at least 1, got ", limit);
  std::lock_guard<std::mutex> lock(mutex_);
  plan_cache_limit_ = limit;
  evict_plans_over_limit();
}

std::size_t Model::plan_cache_limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plan_cache_limit_;
}

std::shared_ptr<Plan> Model::compile(const PlanKey& key, const Loss* loss) const {
  const std::size_t es = dtype_size(dtype_);
  auto offset_of = [&](const std::shared_ptr<Parameter>& p) -> int64_t {
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (params_[i].second == p) return layout_[i].offset * static_cast<int64_t>(es);
    throw_value_error("model: the forward uses a parameter that is not registered with the model");
  };
  return compile_plan(key, [this](Graph& g, const std::vector<Value>& in) { return trace(g, in); }, loss, offset_of);
}

std::size_t Model::num_plans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plans_.size();
}

MemoryReport Model::memory_report(const std::vector<Tensor>& inputs, bool training) {
  PlanKey key = infer_key(inputs);
  key.mode = training ? PlanMode::train_seeded : PlanMode::infer;
  MemoryReport r;
  r.parameters = flat_params_.nbytes();
  r.gradients = training ? flat_grads_.nbytes() : 0;
  r.activations = plan(key)->arena_bytes();
  return r;
}

std::string Model::describe_plans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string text;
  for (const auto& [key, cached] : plans_) text += cached.plan->describe();
  return text;
}

// The last prediction's plan if `inputs` have its signature, else null; mutex_ held.
std::shared_ptr<const Plan> Model::last_infer_hit(const std::vector<Tensor>& inputs) const {
  const LastInfer& c = last_infer_;
  bool hit = c.plan && c.generation == generation_ && c.shapes.size() == inputs.size();
  for (std::size_t i = 0; hit && i < inputs.size(); ++i)
    hit = inputs[i].defined() && c.shapes[i] == inputs[i].shape() && c.dtypes[i] == inputs[i].dtype();
  return hit ? c.plan : nullptr;
}

std::shared_ptr<const Plan> Model::last_infer_plan(const std::vector<Tensor>& inputs) {
  // Never waits: a caller holding the GIL must not block on mutex_, whose holder may be destroying
  // a plan whose tensors release Python objects (which takes the GIL). Busy: no answer.
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  return lock.owns_lock() ? last_infer_hit(inputs) : nullptr;
}

std::shared_ptr<const Plan> Model::infer_plan(const std::vector<Tensor>& inputs) {
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::shared_ptr<const Plan> p = last_infer_hit(inputs)) return p;
    generation = generation_;  // read under the lock: a setter may be bumping it
  }
  PlanKey key = infer_key(inputs);  // settings read after the generation: a setter in between only forces a recompile
  std::shared_ptr<const Plan> p = plan(key);
  std::lock_guard<std::mutex> lock(mutex_);
  last_infer_ = LastInfer{generation, key.input_shapes, key.input_dtypes, p};
  return p;
}

std::unique_ptr<Context> Model::take_context() {
  if (Context* spare = spare_context_.exchange(nullptr, std::memory_order_acquire))
    return std::unique_ptr<Context>(spare);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_contexts_.empty()) {
      std::unique_ptr<Context> c = std::move(free_contexts_.back());
      free_contexts_.pop_back();
      return c;
    }
  }
  return std::make_unique<Context>();
}

void Model::return_context(std::unique_ptr<Context> c) {
  Context* expected = nullptr;
  if (spare_context_.compare_exchange_strong(expected, c.get(), std::memory_order_release)) {
    c.release();  // owned through spare_context_ now
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  free_contexts_.push_back(std::move(c));
}

std::vector<std::pair<Shape, DType>> Model::output_shapes(const std::vector<Tensor>& inputs) {
  return output_shapes(*infer_plan(inputs));
}

std::vector<std::pair<Shape, DType>> Model::output_shapes(const Plan& plan) {
  std::vector<std::pair<Shape, DType>> out;
  for (std::size_t k = 0; k < num_outputs(plan); ++k) out.emplace_back(output_shape(plan, k), output_dtype(plan, k));
  return out;
}

std::size_t Model::num_outputs(const Plan& plan) { return plan.outputs.size(); }
const Shape& Model::output_shape(const Plan& plan, std::size_t k) { return plan.graph.info(plan.outputs.at(k)).shape; }
DType Model::output_dtype(const Plan& plan, std::size_t k) { return plan.graph.info(plan.outputs.at(k)).dtype; }

Model::TrainingCall::TrainingCall(Model& m, const char* who) : m_(m) {
  const std::thread::id me = std::this_thread::get_id();
  if (m.training_thread_.load(std::memory_order_acquire) == me) return;  // nested on this thread
  std::thread::id none{};
  if (!m.training_thread_.compare_exchange_strong(none, me, std::memory_order_acq_rel)) {
    const char* other = m.training_call_.load(std::memory_order_relaxed);
    throw_runtime_error(who, ": another thread is inside ", other ? other : "a training call",
                        " on this model; a model trains on one thread at a time (one thread per Trainer, and the ",
                        "trainers of one model, which share its gradients, take turns)");
  }
  m.training_call_.store(who, std::memory_order_relaxed);
  outer_ = true;
}

Model::TrainingCall::~TrainingCall() {
  if (!outer_) return;
  m_.training_call_.store(nullptr, std::memory_order_relaxed);
  m_.training_thread_.store(std::thread::id{}, std::memory_order_release);
}

void Model::predict_into(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, Context* ctx) {
  predict_into(*infer_plan(inputs), inputs, outputs, ctx);
}

void Model::predict_into(const Plan& plan, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                         Context* ctx) {
  const Plan* p = &plan;
  if (p->owner != this || p->owner_generation != layout_generation_)
    throw_value_error("predict: the plan belongs to another model or to this model before a dtype change");
  if (inputs.size() != p->inputs.size())
    throw_value_error("predict: expected ", p->inputs.size(), " inputs, got ", inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const ValueInfo& info = p->graph.info(p->inputs[i]);
    if (!inputs[i].defined() || inputs[i].shape() != info.shape || inputs[i].dtype() != info.dtype)
      throw_value_error("predict: input ", i, " must be ", dtype_name(info.dtype), shape_str(info.shape),
                        " for this plan");
  }
  if (outputs.size() != p->outputs.size())
    throw_value_error("predict: expected ", p->outputs.size(), " output buffers, got ", outputs.size());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const ValueInfo& info = p->graph.info(p->outputs[k]);
    if (!outputs[k].defined() || outputs[k].shape() != info.shape || outputs[k].dtype() != info.dtype ||
        !outputs[k].is_contiguous())
      throw_value_error("predict: output ", k, " must be a contiguous ", dtype_name(info.dtype), shape_str(info.shape),
                        " buffer");
  }
  constexpr std::size_t kMaxInputs = 8;
  if (inputs.size() > kMaxInputs) throw_value_error("predict: at most ", kMaxInputs, " inputs");
  const bool on_device = p->device().kind != DeviceKind::cpu;
  if (!on_device) {  // a host plan reads every buffer on the host
    for (const Tensor& t : inputs) t.require_cpu("predict (input of a model on a CPU backend)");
    for (const Tensor& t : outputs) t.require_cpu("predict (output of a model on a CPU backend)");
  }
  std::array<Tensor, kMaxInputs> copies;  // only for non-contiguous inputs
  std::array<void*, kMaxInputs> ptrs{};
  for (std::size_t i = 0; i < inputs.size() && !on_device; ++i)
    ptrs[i] = inputs[i].is_contiguous() ? inputs[i].data() : (copies[i] = inputs[i].clone()).data();
  std::optional<Context::Use> in_use;  // a caller's context: one thread at a time
  if (ctx) in_use.emplace(*ctx, "predict");
  std::unique_ptr<Context> pooled = ctx ? nullptr : take_context();
  Context& c = ctx ? *ctx : *pooled;
  Bindings b{flat_params_.data(), std::span<void* const>(ptrs.data(), inputs.size()), {}, {}};
  std::array<void*, kMaxOutputs> out_ptrs{};  // outputs computed in place where they do not overlap
  if (!on_device && outputs.size() <= kMaxOutputs && outputs_apart(outputs, inputs, std::span<void* const>(ptrs.data(), inputs.size()), flat_params_)) {
    for (std::size_t k = 0; k < outputs.size(); ++k) out_ptrs[k] = outputs[k].data();
    b.outputs = std::span<void* const>(out_ptrs.data(), outputs.size());
  }
  try {
    if (on_device) {  // host inputs uploaded, device ones copied on the device; outputs likewise
      device_mirror().predict(*p, inputs, outputs, c);
      if (pooled) return_context(std::move(pooled));
      return;
    }
    p->run(c, b, 0, p->forward_end);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const void* computed = p->address(c, b, p->outputs[k]);
      if (computed != outputs[k].data()) std::memcpy(outputs[k].data(), computed, outputs[k].nbytes());
    }
  } catch (...) {
    if (pooled) return_context(std::move(pooled));
    throw;
  }
  if (pooled) return_context(std::move(pooled));
}

std::vector<Tensor> Model::predict(const std::vector<Tensor>& inputs, Context* ctx) {
  std::vector<Tensor> outs;
  for (auto& [shape, dtype] : output_shapes(inputs)) outs.emplace_back(shape, dtype);
  predict_into(inputs, outs, ctx);
  return outs;
}

std::map<std::string, Tensor> Model::state_dict() const {
  if (device_) device_to_host(false);
  std::map<std::string, Tensor> out;
  for (const auto& [name, p] : params_) out.emplace(name, p->value().clone());
  return out;
}

void Model::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  // Validate everything first so a bad entry changes nothing.
  for (const auto& [name, p] : params_) {
    auto it = state.find(name);
    if (it == state.end()) {
      if (strict) throw_value_error("load_state_dict: missing key '", name, "'");
      continue;
    }
    if (it->second.shape() != p->value().shape())
      throw_value_error("load_state_dict: '", name, "' has shape ", shape_str(it->second.shape()), ", expected ",
                        shape_str(p->value().shape()));
    // Integers load only into non-trained state (a counter such as torch's int64 num_batches_tracked).
    const DType dt = it->second.dtype();
    if (!is_floating(dt) && !(is_integer(dt) && !p->requires_grad()))
      throw_type_error("load_state_dict: '", name, "' has dtype ", dtype_name(it->second.dtype()));
  }
  if (strict)
    for (const auto& [name, t] : state) {
      bool known = false;
      for (const auto& np : params_) known = known || np.first == name;
      if (!known) throw_value_error("load_state_dict: unexpected key '", name, "'");
    }
  host_access();  // keys not in `state` keep their current (possibly device) values
  for (const auto& [name, p] : params_) {
    auto it = state.find(name);
    if (it == state.end()) continue;
    Tensor src = it->second.dtype() == dtype_ ? it->second : it->second.to(dtype_);
    Tensor dst = p->value();
    dst.copy_from(src);
  }
}

// The device copies (a device backend's ParameterMirror), made on first use for the device of the
// model's backend.
void Model::MirrorDeleter::operator()(ParameterMirror* m) const noexcept { delete m; }

ParameterMirror& Model::device_mirror() {
  if (!device_) {
    std::lock_guard<std::mutex> lock(mutex_);  // concurrent first predictions make them once
    if (!device_) {
      const Device d = plan_device(backend_);
      device_.reset(require_device_runtime(d, "Model").make_mirror(d, flat_params_, flat_grads_).release());
    }
  }
  return *device_;
}

Model::DeviceBuffers Model::device_buffers(void* stream) { return device_mirror().buffers(stream); }

void Model::device_written(void* stream, bool params, bool grads) {
  if (!device_) throw_runtime_error("Model: device copies written before they were made");
  device_->written(stream, params, grads);
}

uint64_t Model::device_allocations() const { return device_ ? device_->allocations() : 0; }

void Model::device_to_host(bool will_write) const { device_->to_host(will_write); }

}  // namespace treadle
