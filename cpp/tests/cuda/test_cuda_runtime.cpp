// Device tests of the runtime layer: streams, copies, the caching allocator's reuse and limits, and
// the status paths of real failing calls into the CUDA runtime, cuBLASLt and cuDNN.
#include <cudnn.h>

#include <numeric>

#include "backends/cuda/cuda_status.hpp"
#include "test_cuda_common.hpp"

namespace treadle::cuda::test {
namespace {

std::string copies_round_trip(Env& env) {
  std::vector<float> host(1 << 20);
  std::iota(host.begin(), host.end(), 0.0f);
  DeviceArray<float> a(env, host), b(env, host.size());
  copy_device_to_device_async(b.get(), a.get(), host.size() * sizeof(float), env.s());
  PinnedHostBuffer pinned(host.size() * sizeof(float));
  copy_to_host_async(pinned.data(), b.get(), pinned.bytes(), env.s());
  env.stream.synchronize();
  expect(std::equal(host.begin(), host.end(), pinned.ptr<float>()), "pinned round trip differs");
  expect(b.download() == host, "pageable round trip differs");
  return "host -> device -> device -> pinned/pageable host, 4 MiB, exact";
}

std::string stream_wrappers(Env& env) {
  expect(env.stream.owned() && env.stream.get() != nullptr, "owned stream is the default stream");
  unsigned flags = 0;
  TREADLE_CUDA_CHECK(cudaStreamGetFlags(env.s(), &flags));
  expect(flags == cudaStreamNonBlocking, "stream flags ", flags, ", expected non-blocking");
  CudaStream moved = CudaStream(env.stream.device());
  cudaStream_t raw = moved.get();
  CudaStream borrowed = CudaStream::borrow(raw);
  expect(!borrowed.owned() && borrowed.get() == raw, "borrow");
  CudaEvent start, stop;
  start.record(raw);
  stop.record(raw);
  stop.synchronize();
  expect(CudaEvent::elapsed_ms(start, stop) >= 0.0f, "event timing");
  { CudaStream gone = CudaStream::borrow(raw); }  // destroying a borrowed wrapper leaves the stream alone
  borrowed.synchronize();
  return "non-blocking owned stream, borrow, move, events";
}

// A step-like pattern: the same sizes every iteration. After the first iteration no cudaMalloc.
std::string allocator_reuse(Env& env) {
  CachingDeviceAllocator alloc;
  const std::size_t sizes[] = {1, 300, 4096, 5000, 1 << 20, 3 << 20, 123457};
  AllocatorStats warm{};
  for (int step = 0; step < 10; ++step) {
    std::vector<DeviceBuffer> live;
    for (std::size_t s : sizes) live.push_back(alloc.buffer(s, env.s()));
    for (std::size_t s : sizes) live.push_back(alloc.buffer(s, env.s()));  // same classes twice at once
    for (const DeviceBuffer& b : live) expect(reinterpret_cast<uintptr_t>(b.data()) % 256 == 0, "alignment");
    if (step == 0) warm = alloc.stats();
    live.clear();
    expect(alloc.stats().in_use_bytes == 0, "in use after freeing everything: ", alloc.stats().in_use_bytes);
  }
  const AllocatorStats st = alloc.stats();
  expect(st.misses == warm.misses, "cudaMalloc after warm-up: ", st.misses, " misses vs ", warm.misses);
  expect(st.hits == 9 * 14, "hits ", st.hits, ", expected ", 9 * 14);
  expect(st.reserved_bytes == warm.reserved_bytes && st.cached_blocks == 14, "reserved changed");
  // Another stream does not take blocks freed on this one.
  CudaStream other;
  { DeviceBuffer b = alloc.buffer(1 << 20, other.get()); }
  expect(alloc.stats().misses == warm.misses + 1, "cross-stream reuse");
  alloc.release_cached();
  expect(alloc.stats().reserved_bytes == 0 && alloc.stats().device_frees == 15, "release_cached");
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%llu misses then %llu hits, peak %zu bytes", (unsigned long long)warm.misses,
                (unsigned long long)st.hits, st.peak_reserved_bytes);
  return buf;
}

std::string allocator_errors(Env& env) {
  CachingDeviceAllocator alloc;
  int x = 0;
  expect_throw<ValueError>("foreign", [&] { alloc.deallocate(&x); }, "is not a block in use from this allocator");
  void* p = alloc.allocate(1000, env.s());
  alloc.deallocate(p);
  expect_throw<ValueError>("double free", [&] { alloc.deallocate(p); }, "(already freed)");
  expect(alloc.allocate(0, env.s()) == nullptr, "zero bytes");
  const std::string oom = expect_throw<RuntimeError>(
      "out of memory", [&] { alloc.allocate(std::size_t{1} << 52, env.s()); }, "cudaErrorMemoryAllocation");
  expect(oom.find("CachingDeviceAllocator::allocate: cudaMalloc of") == 0, "message: ", oom);
  expect(cudaGetLastError() == cudaSuccess, "error left behind after OOM");
  DeviceBuffer after = alloc.buffer(4096, env.s());  // still usable
  expect(after.data() != nullptr, "allocation after OOM");
  return oom.substr(0, 100);
}

std::string device_status_paths(Env& env) {
  int n = 0;
  TREADLE_CUDA_CHECK(cudaGetDeviceCount(&n));
  expect_throw<RuntimeError>("cudaSetDevice", [&] { TREADLE_CUDA_CHECK(cudaSetDevice(n + 7)); },
                             "cudaSetDevice(n + 7): cudaErrorInvalidDevice");
  expect_throw<RuntimeError>("stream on a missing device", [&] { CudaStream s(n + 3); }, "cudaErrorInvalidDevice");
  expect(current_device() == env.stream.device(), "device selection changed by a failed call");
  // cuBLASLt: an attribute of the wrong size.
  cublasLtMatmulDesc_t desc = nullptr;
  TREADLE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int8_t tiny = 0;
  const std::string lt = expect_throw<RuntimeError>("cublasLt", [&] {
    TREADLE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tiny, sizeof(tiny)));
  }, "CUBLAS_STATUS_INVALID_VALUE");
  cublasLtMatmulDescDestroy(desc);
  // cuDNN: a handle on our stream, then a tensor descriptor with a negative dimension.
  CudnnHandle handle(env.s());
  cudaStream_t bound = nullptr;
  TREADLE_CUDNN_CHECK(cudnnGetStream(handle.get(), &bound));
  expect(bound == env.s(), "cudnn stream");
  expect(cudnnGetVersion() / 10000 == 9, "cuDNN version ", cudnnGetVersion());
  cudnnTensorDescriptor_t td = nullptr;
  TREADLE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&td));
  const std::string dnn = expect_throw<RuntimeError>("cudnn", [&] {
    TREADLE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(td, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, -1, 3, 4, 4));
  }, "CUDNN_STATUS_BAD_PARAM");
  cudnnDestroyTensorDescriptor(td);
  return detail::concat("cuDNN ", cudnnGetVersion(), "; e.g. ", dnn.substr(0, 80));
}

}  // namespace

void add_runtime_tests(std::vector<TestCase>& out) {
  out.push_back({"copies_round_trip", copies_round_trip});
  out.push_back({"stream_wrappers", stream_wrappers});
  out.push_back({"allocator_reuse", allocator_reuse});
  out.push_back({"allocator_errors", allocator_errors});
  out.push_back({"device_status_paths", device_status_paths});
}

}  // namespace treadle::cuda::test
