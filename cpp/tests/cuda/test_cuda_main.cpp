// test_cuda: checks the CUDA backend's runtime layer and kernels.
//   test_cuda           host-only checks (status messages, argument validation, size classes), then,
//                       when a device is present, every device test; otherwise "SKIP: ..." and exit 0.
//   test_cuda --bench [--json PATH]   kernel timings (device required).
//   test_cuda --only PREFIX            only the tests whose name starts with PREFIX.
// Built inside the main build, it also checks the core's plans compiled for "cuda" (core_* tests).
// Prints one PASS/FAIL line per test and a summary line; exit status 1 when anything failed.
#include <cstring>
#include <exception>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/linear_lt.hpp"
#include "backends/cuda/lt_gemm.hpp"
#include "test_cuda_common.hpp"
#include "test_cuda_cudnn.hpp"
#include "test_cuda_train.hpp"
#ifdef TREADLE_CUDA_TEST_CORE
#include "test_cuda_core.hpp"
#endif

namespace treadle::cuda::test {
namespace {

// ---- checks that need no device: the library's host side
std::string status_messages() {
  std::string m = expect_throw<RuntimeError>(
      "check_cuda", [] { TREADLE_CUDA_CHECK(cudaErrorInvalidValue); }, "cudaErrorInvalidValue: cudaErrorInvalidValue (");
  expect_throw<RuntimeError>("check_cublas", [] { TREADLE_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE); },
                             "CUBLAS_STATUS_INVALID_VALUE: CUBLAS_STATUS_INVALID_VALUE");
  expect_throw<RuntimeError>("check_cudnn", [] { TREADLE_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM); },
                             "CUDNN_STATUS_BAD_PARAM: CUDNN_STATUS_BAD_PARAM");
  expect_throw<RuntimeError>("check_cuda named", [] { check_cuda(cudaErrorMemoryAllocation, "cudaMalloc(&p, 8)"); },
                             "cudaMalloc(&p, 8): cudaErrorMemoryAllocation (out of memory)");
  check_cuda(cudaSuccess, "ok");
  check_cublas(CUBLAS_STATUS_SUCCESS, "ok");
  check_cudnn(CUDNN_STATUS_SUCCESS, "ok");
  return m;
}

std::string argument_validation() {
  expect_throw<ValueError>("activation n<0", [] { activation_forward(Activation::gelu, nullptr, nullptr, -1, nullptr); },
                           "activation_forward(gelu): negative element count -1");
  expect_throw<ValueError>("activation null", [] { activation_backward(Activation::silu, nullptr, nullptr, nullptr, 4, nullptr); },
                           "null device pointer for 4 elements");
  expect_throw<ValueError>("softmax axis 0", [] { softmax_forward(nullptr, nullptr, 2, 0, 1, nullptr); },
                           "softmax_forward: expected outer >= 0, axis >= 1, inner >= 1; got (2, 0, 1)");
  expect_throw<ValueError>("cross_entropy null", [] {
    cross_entropy_forward(nullptr, nullptr, nullptr, 3, 4, 1, Reduction::mean, nullptr, nullptr);
  }, "cross_entropy_forward: null device pointer");
  expect_throw<ValueError>("adam beta1", [] { adam_coefficients(1e-3, 1.0, 0.999, 1e-8, 0, 1, false, false); },
                           "adam: beta1 must be in [0, 1), got 1");
  expect_throw<ValueError>("adam step", [] { adam_coefficients(1e-3, 0.9, 0.999, 1e-8, 0, 0, true, false); },
                           "adamw: step must be >= 1");
  expect_throw<ValueError>("column_sum", [] { column_sum(nullptr, nullptr, -1, 3, nullptr, nullptr); },
                           "column_sum: negative shape (-1, 3)");
  expect_throw<ValueError>("linear handle", [] { LtLinear(nullptr, LinearConfig{4, 8, 2}); }, "linear: null cuBLASLt handle");
  expect_throw<ValueError>("matmul shape", [] { LtMatmul(nullptr, MatmulConfig{2, 0, 3}); },
                           "matmul: expected m, n >= 0 and k >= 1, got m 2, k 0, n 3");
  expect_throw<ValueError>("bf16 n<0", [] { round_to_bf16(nullptr, nullptr, -2, nullptr); },
                           "round_to_bf16: negative element count -2");
  expect_throw<ValueError>("copy null", [] { copy_to_device_async(nullptr, nullptr, 16, nullptr); },
                           "copy_to_device_async: null pointer for a copy of 16 bytes");
  return "host-side checks raise ValueError naming the function";
}

std::string size_classes() {
  using A = CachingDeviceAllocator;
  expect(A::size_class(1) == 512 && A::size_class(512) == 512 && A::size_class(513) == 1024, "small classes");
  expect(A::size_class(4096) == 4096 && A::size_class(4097) == 5120, "4097 -> ", A::size_class(4097));
  for (std::size_t b = 1; b < (std::size_t{1} << 34); b = b * 3 / 2 + 1) {
    const std::size_t c = A::size_class(b);
    expect(c >= b && (b <= 4096 || c <= b + b / 4 + 1) && c % 256 == 0 && A::size_class(c) == c, "class of ", b, " is ", c);
  }
  // The bf16 operand copies sit after the product's scratch, each part 256-byte aligned.
  const StagedWorkspace w = staged_workspace(MathMode::bf16_operands, 1000, 3, 200);
  expect(w.gemm == 1000 && w.a_offset == 1024 && w.b_offset == 1280 && w.total == 1792, "staged workspace ",
         w.a_offset, " ", w.b_offset, " ", w.total);
  expect(staged_workspace(MathMode::f32, 1000, 3, 200).total == 1000, "f32 workspace");
  return "classes cover requests with <= 25% slack and are fixed points; staged workspace layout";
}

// Keeps the tests whose name starts with `prefix` (all for an empty prefix).
std::vector<TestCase> only(std::vector<TestCase> tests, const std::string& prefix) {
  std::erase_if(tests, [&](const TestCase& t) { return t.name.rfind(prefix, 0) != 0; });
  return tests;
}

int run(const std::vector<TestCase>& tests, Env* env) {
  int failed = 0;
  for (const TestCase& t : tests) {
    try {
      const std::string detail = t.fn(*env);
      std::printf("PASS %-34s %s\n", t.name.c_str(), detail.c_str());
    } catch (const std::exception& e) {
      ++failed;
      std::printf("FAIL %-34s %s\n", t.name.c_str(), e.what());
      if (env != nullptr) {  // leave no error behind for the next test (a faulted context stays faulted)
        const cudaError_t sticky = cudaStreamSynchronize(env->s());
        if (sticky != cudaSuccess) std::printf("     stream after failure: %s\n", cudaGetErrorString(sticky));
      }
    }
    std::fflush(stdout);
  }
  return failed;
}

}  // namespace
}  // namespace treadle::cuda::test

int main(int argc, char** argv) {
  using namespace treadle::cuda::test;
  bool bench = false;
  std::string json, prefix;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--bench") == 0) bench = true;
    else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) prefix = argv[++i];
  }
  std::vector<TestCase> host_tests = {{"status_messages", [](Env&) { return status_messages(); }},
                                      {"argument_validation", [](Env&) { return argument_validation(); }},
                                      {"allocator_size_classes", [](Env&) { return size_classes(); }},
                                      {"conv2d_validation", [](Env&) { return conv_validation(); }},
                                      {"pool_norm_validation", [](Env&) { return pool_norm_validation(); }},
                                      {"loss_scaler_logic", [](Env&) { return loss_scaler_logic(); }},
                                      {"rnn_validation", [](Env&) { return rnn_validation(); }},
                                      {"layer_gap_validation", [](Env&) { return layer_gap_validation(); }},
                                      {"step_kernel_validation", [](Env&) { return train_kernel_validation(); }}};
#ifdef TREADLE_CUDA_TEST_CORE
  add_core_host_tests(host_tests);
  add_core_train_host_tests(host_tests);
#endif
  host_tests = only(std::move(host_tests), prefix);
  int failed = bench ? 0 : run(host_tests, nullptr);
  int passed = bench ? 0 : static_cast<int>(host_tests.size()) - failed;

  int devices = 0;
  const cudaError_t st = cudaGetDeviceCount(&devices);
  if (st != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (cudaGetDeviceCount: %s%s%s)\n", cudaGetErrorName(st),
                st == cudaSuccess ? ", 0 devices" : ": ", st == cudaSuccess ? "" : cudaGetErrorString(st));
    if (bench) return 1;  // nothing to time
    std::printf("cuda host checks: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device 0: %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0);
  try {
    Env env;
    if (bench) return run_benchmarks(env, json);
    std::vector<TestCase> tests;
    add_runtime_tests(tests);
    add_kernel_tests(tests);
    add_linear_tests(tests);
    add_conv_tests(tests);
    add_pool_norm_tests(tests);
    add_loss_scale_tests(tests);
    add_rnn_tests(tests);
    add_cnn_tests(tests);
    add_gap_tests(tests);
    add_train_kernel_tests(tests);
#ifdef TREADLE_CUDA_TEST_CORE
    add_core_device_tests(tests);
    add_core_train_device_tests(tests);
#endif
    tests = only(std::move(tests), prefix);
    const int f = run(tests, &env);
    failed += f;
    passed += static_cast<int>(tests.size()) - f;
  } catch (const std::exception& e) {
    std::printf("FAIL setup: %s\n", e.what());
    ++failed;
  }
  std::printf("cuda tests: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
