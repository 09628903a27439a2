// A small convolutional classifier trained on the device by the kernels alone, with fp16-style
// dynamic loss scaling: conv 3x3 (+bias) -> batch norm -> relu -> max pool 2x2 -> linear -> cross-
// entropy, Adam. The loss gradient is seeded with the device-resident scale; the flat gradient
// buffer is unscaled with the non-finite flag, and the host reads flag and loss together (one copy
// each per step). One step gets a NaN injected into its gradients: it must be skipped (parameters
// bit for bit unchanged) and the scale halved. The loss must fall below half its start, and after
// the first step the allocator must not call cudaMalloc again.
#include <cmath>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/cudnn_norm.hpp"
#include "backends/cuda/cudnn_pool.hpp"
#include "backends/cuda/linear_lt.hpp"
#include "backends/cuda/loss_scale.hpp"
#include "test_cuda_cudnn.hpp"

namespace treadle::cuda::test {
namespace {

constexpr int64_t kN = 64, kC = 3, kHw = 16, kK = 16, kPooled = 8, kClasses = 10;
constexpr int64_t kFeatures = kK * kPooled * kPooled;

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }  // 256-byte aligned parameter offsets

struct Offsets {
  int64_t conv_w = 0, conv_b, bn_w, bn_b, lin_w, lin_b, total;
  Offsets() {
    conv_b = align64(conv_w + kK * kC * 9);
    bn_w = align64(conv_b + kK);
    bn_b = align64(bn_w + kK);
    lin_w = align64(bn_b + kK);
    lin_b = align64(lin_w + kClasses * kFeatures);
    total = align64(lin_b + kClasses);
  }
};

std::vector<int64_t> teacher_labels(Env& env, const std::vector<float>& x) {
  const int64_t in = kC * kHw * kHw;
  const std::vector<float> t = uniform(env, kClasses * in, -1, 1);
  std::vector<int64_t> labels(kN);
  for (int64_t i = 0; i < kN; ++i) {
    double best = -INFINITY;
    for (int64_t c = 0; c < kClasses; ++c) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * t[c * in + k];
      if (s > best) best = s, labels[i] = c;
    }
  }
  return labels;
}

struct Layers {
  CudnnConv2d conv;
  CudnnBatchNorm bn;
  CudnnPool2d pool;
  LtLinear lin;
  Layers(Env& env, cudnnHandle_t dnn)
      : conv(dnn, [] {
          Conv2dConfig c;
          c.batch = kN, c.in_channels = kC, c.height = c.width = kHw, c.out_channels = kK;
          c.kernel = {3, 3}, c.padding = {1, 1};
          return c;
        }()),
        bn(BatchNormConfig{kN, kK, kHw * kHw, 1e-5, true}),
        pool([] {
          Pool2dConfig p;
          p.batch = kN, p.channels = kK, p.height = p.width = kHw, p.kernel = {2, 2};
          return p;
        }()),
        lin(env.lt.get(), LinearConfig{kN, kFeatures, kClasses, LinearEpilogue::bias}) {}
};

constexpr int64_t kAct = kN * kK * kHw * kHw, kPooledN = kN * kFeatures;

// One step's activations and gradients, all from the step's allocator (so the test sees whether the
// allocator reaches a steady state).
struct StepBuffers {
  DeviceBuffer conv_out, bn_out, relu_out, mean, rstd, pooled, logits, loss, dlogits, dpooled, drelu, dbn, dconv, flag,
      ws;
  StepBuffers(CachingDeviceAllocator& a, cudaStream_t s, std::size_t ws_bytes)
      : conv_out(a.buffer(kAct * 4, s)), bn_out(a.buffer(kAct * 4, s)), relu_out(a.buffer(kAct * 4, s)),
        mean(a.buffer(kK * 4, s)), rstd(a.buffer(kK * 4, s)), pooled(a.buffer(kPooledN * 4, s)),
        logits(a.buffer(kN * kClasses * 4, s)), loss(a.buffer(4, s)), dlogits(a.buffer(kN * kClasses * 4, s)),
        dpooled(a.buffer(kPooledN * 4, s)), drelu(a.buffer(kAct * 4, s)), dbn(a.buffer(kAct * 4, s)),
        dconv(a.buffer(kAct * 4, s)), flag(a.buffer(4, s)), ws(a.buffer(ws_bytes, s)) {}
};

// Forward, loss, and the gradients of every parameter into G, all multiplied by *scale.
void scaled_gradients(Env& env, cudnnHandle_t dnn, const Layers& L, const Offsets& o, StepBuffers& b, const float* x,
                      const int64_t* labels, const float* scale, const float* P, float* G) {
  const cudaStream_t s = env.s();
  L.conv.forward(dnn, x, P + o.conv_w, P + o.conv_b, b.conv_out.ptr<float>(), b.ws.data());
  L.bn.forward_training(dnn, b.conv_out.ptr<float>(), P + o.bn_w, P + o.bn_b, b.bn_out.ptr<float>(),
                        b.mean.ptr<float>(), b.rstd.ptr<float>(), nullptr, nullptr, 0.0, nullptr);
  activation_forward(Activation::relu, b.bn_out.ptr<float>(), b.relu_out.ptr<float>(), kAct, s);
  L.pool.forward(dnn, b.relu_out.ptr<float>(), b.pooled.ptr<float>());
  L.lin.forward(b.pooled.ptr<float>(), P + o.lin_w, P + o.lin_b, b.logits.ptr<float>(), b.ws.data(), s);
  cross_entropy_forward(b.logits.ptr<float>(), labels, b.loss.ptr<float>(), kN, kClasses, 1, Reduction::mean,
                        b.ws.data(), s);
  // The loss gradient seeded with the scale itself: everything below is scaled.
  cross_entropy_backward(b.logits.ptr<float>(), labels, scale, b.dlogits.ptr<float>(), kN, kClasses, 1,
                         Reduction::mean, s);
  L.lin.backward_weight(b.dlogits.ptr<float>(), b.pooled.ptr<float>(), G + o.lin_w, false, b.ws.data(), s);
  column_sum(b.dlogits.ptr<float>(), G + o.lin_b, kN, kClasses, b.ws.data(), s);
  L.lin.backward_input(b.dlogits.ptr<float>(), P + o.lin_w, b.dpooled.ptr<float>(), b.ws.data(), s);
  L.pool.backward(dnn, b.relu_out.ptr<float>(), b.pooled.ptr<float>(), b.dpooled.ptr<float>(), b.drelu.ptr<float>());
  activation_backward(Activation::relu, b.relu_out.ptr<float>(), b.drelu.ptr<float>(), b.dbn.ptr<float>(), kAct, s);
  L.bn.backward(dnn, b.conv_out.ptr<float>(), b.dbn.ptr<float>(), P + o.bn_w, b.mean.ptr<float>(), b.rstd.ptr<float>(),
                b.dconv.ptr<float>(), G + o.bn_w, G + o.bn_b, false, nullptr);
  L.conv.backward_filter(dnn, x, b.dconv.ptr<float>(), G + o.conv_w, false, b.ws.data());
  L.conv.backward_bias(dnn, b.dconv.ptr<float>(), G + o.conv_b, false);
}

std::string cnn_loss_scaled(Env& env) {
  CudnnHandle dnn(env.s());
  Layers L(env, dnn.get());
  const Offsets o;
  CachingDeviceAllocator alloc;
  std::vector<float> p0 = uniform(env, o.total, -0.1f, 0.1f);
  for (int64_t i = 0; i < kK; ++i) p0[o.bn_w + i] = 1.0f, p0[o.bn_b + i] = 0.0f;
  DeviceArray<float> params(env, p0), grads(env, o.total), m(env, o.total), v(env, o.total);
  const std::vector<float> x = uniform(env, kN * kC * kHw * kHw, -1, 1);
  DeviceArray<float> dx(env, x);
  DeviceArray<int64_t> labels(env, teacher_labels(env, x));
  LossScaleOptions so;
  so.init_scale = 65536.0f, so.growth_interval = 10;
  DynamicLossScaler scaler(so);
  DeviceArray<float> scale(env, std::vector<float>{scaler.scale()});
  const std::size_t ws_bytes = std::max({L.conv.workspace_bytes(), L.lin.workspace_bytes(), std::size_t{256},
                                         column_sum_workspace_bytes(kN, kClasses), cross_entropy_workspace_bytes(kN, 1)});
  constexpr int kSteps = 50, kPoisoned = 7;
  int adam_steps = 0;
  uint64_t misses_after_first = 0;
  float first = 0, last = 0, scale_before = 0, scale_after = 0;
  for (int step = 1; step <= kSteps; ++step) {
    StepBuffers b(alloc, env.s(), ws_bytes);
    scaled_gradients(env, dnn.get(), L, o, b, dx.get(), labels.get(), scale.get(), params.get(), grads.get());
    if (step == kPoisoned) {  // what an overflowing fp16 backward would leave behind
      const float nan = NAN;
      copy_to_device(grads.get() + o.lin_w + 5, &nan, 4, env.s());
    }
    clear_nonfinite_flag(b.flag.ptr<int32_t>(), env.s());
    scale_gradients(grads.get(), grads.get(), o.total, scale.get(), ScaleDirection::divide, b.flag.ptr<int32_t>(),
                    env.s());
    float l = 0;
    int32_t bad = 0;
    copy_to_host(&l, b.loss.data(), 4, env.s());
    copy_to_host(&bad, b.flag.data(), 4, env.s());
    expect(std::isfinite(l), "loss at step ", step, " is ", l);
    expect((bad != 0) == (step == kPoisoned), "non-finite flag ", bad, " at step ", step);
    if (step == kPoisoned) scale_before = scaler.scale();
    if (scaler.update(bad != 0))
      adam_update(params.get(), grads.get(), m.get(), v.get(), nullptr, o.total,
                  adam_coefficients(1e-2, 0.9, 0.999, 1e-8, 0, ++adam_steps, false, false), env.s());
    else
      scale_after = scaler.scale();
    if (step == kPoisoned - 1) p0 = params.download();
    if (step == kPoisoned) expect(params.download() == p0, "the skipped step changed the parameters");
    const float next_scale = scaler.scale();
    copy_to_device(scale.get(), &next_scale, 4, env.s());
    if (step == 1) first = l, misses_after_first = alloc.stats().misses;
    last = l;
  }
  const AllocatorStats st = alloc.stats();
  expect(st.misses == misses_after_first, "cudaMalloc after the first step: ", st.misses, " vs ", misses_after_first);
  expect(scaler.skipped_steps() == 1 && scale_after == 0.5f * scale_before, "skipped ", scaler.skipped_steps(),
         " steps, scale ", scale_before, " -> ", scale_after);
  expect(last < 0.5f * first, "loss did not fall: ", first, " -> ", last);
  char buf[200];
  std::snprintf(buf, sizeof(buf), "loss %.3f -> %.3f in %d steps (step %d skipped: NaN injected, scale %g -> %g; final "
                "scale %g); %llu cudaMalloc, all in step 1", first, last, kSteps, kPoisoned, scale_before, scale_after,
                scaler.scale(), (unsigned long long)st.misses);
  return buf;
}

}  // namespace

void add_cnn_tests(std::vector<TestCase>& out) { out.push_back({"cnn_loss_scaled", cnn_loss_scaled}); }

}  // namespace treadle::cuda::test
