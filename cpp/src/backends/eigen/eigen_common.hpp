#pragma once
// Shared helpers for Eigen reference kernels.
#include <Eigen/Core>
#include <cstdint>

#include "backends/kernel.hpp"

namespace treadle::eigen {

template <typename T>
using MatrixR = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using MapR = Eigen::Map<MatrixR<T>>;
template <typename T>
using ConstMapR = Eigen::Map<const MatrixR<T>>;
template <typename T>
using VecMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstVecMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// Elementwise work is split into this many elements per chunk at most; each element is computed
// by exactly one chunk, so results never depend on how the executor chunks.
constexpr int64_t kElementGrain = 1 << 14;

// Runs body(begin, end) over [0, n) in chunks of about `grain` items on the host's executor.
template <typename F>
void parallel_chunks(Executor& exec, int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  const int64_t chunks = (n + grain - 1) / grain;
  // The same fixed chunks run serially or in parallel: GEMM-based kernels round differently for
  // different block shapes, so chunk boundaries must not depend on the number of workers.
  if (chunks <= 1 || exec.num_workers() <= 1) {
    for (int64_t c = 0; c < chunks; ++c) body(c * grain, std::min(n, (c + 1) * grain));
    return;
  }
  // One captured pointer keeps the std::function inside its small buffer: no allocation per call.
  struct Job {
    F& body;
    int64_t n, grain;
  } job{body, n, grain};
  const Job* j = &job;
  exec.parallel_for(chunks, [j](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) j->body(c * j->grain, std::min(j->n, (c + 1) * j->grain));
  });
}

// Registers kernel template K<T> for float and double under `op`.
#define TREADLE_EIGEN_REGISTER_FLOATS(table, op, K) \
  do {                                              \
    (table).add(op, DType::f32, &K<float>);         \
    (table).add(op, DType::f64, &K<double>);        \
  } while (0)

}  // namespace treadle::eigen
