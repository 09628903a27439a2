// DataParallel's transport option under `mpiexec -n 2`, in any build with MPI: which transport
// "auto" and "mpi" give a host model, the same ValueError on every rank for an unknown name, for
// "nccl" where it cannot run (a build without NCCL, a host model) and for ranks asking for different
// transports; and, in CUDA builds on a machine without a GPU, a model on backend "cuda" failing
// cleanly on every rank instead of hanging ("mpi"/"auto": at the first step; "nccl": at
// construction). Prints "rank R ok: ..." / "rank R FAIL: ..." per check and "rank R message <tag>:
// <text>" per error for tests/test_distributed_cuda.py; exits non-zero if a check failed.
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "treadle/distributed.hpp"
#include "treadle/nn_layers.hpp"
#include "treadle/treadle.hpp"

namespace {

using namespace treadle;
constexpr int64_t kIn = 6, kOut = 3;
int g_rank = 0, g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("rank %d %s: %s\n", g_rank, ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

void message(const std::string& tag, const std::string& text) {
  std::printf("rank %d message %s: %s\n", g_rank, tag.c_str(), text.c_str());
}

Trainer make_trainer(const std::string& backend) {
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Linear>(kIn, 8));
  net->add(std::make_shared<nn::Activation>("relu"));
  net->add(std::make_shared<nn::Linear>(8, kOut));
  auto model = std::make_shared<Model>(net);
  if (!backend.empty()) model->set_backend(backend);
  optim::AdamOptions adam;
  adam.lr = 0.01;
  return Trainer(model, loss::cross_entropy(), optim::adam(adam));  // a loss with a CUDA kernel
}

Tensor random_tensor(int64_t rows, int64_t cols, uint32_t seed) {
  Tensor t({rows, cols}, DType::f32);
  std::mt19937 gen(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < rows * cols; ++i) t.data_as<float>()[i] = n(gen);
  return t;
}

Tensor labels(int64_t rows, uint32_t seed) {
  Tensor t({rows}, DType::i64);
  std::mt19937 gen(seed);
  for (int64_t i = 0; i < rows; ++i) t.data_as<int64_t>()[i] = static_cast<int64_t>(gen() % kOut);
  return t;
}

// Constructing with `options` must throw ValueError on this rank: the message goes out as `tag`.
void expect_construction_error(const std::string& tag, const std::string& backend, const DataParallelOptions& options) {
  Trainer t = make_trainer(backend);
  try {
    DataParallel dp(t, MPI_COMM_WORLD, options);
    check(false, tag + ": construction must throw (transport " + dp.transport() + ")");
  } catch (const ValueError& e) {
    message(tag, e.what());
  }
}

void host_model() {
  Trainer t = make_trainer("");
  DataParallel legacy(t, MPI_COMM_WORLD, 0, BufferSync::root);
  check(legacy.transport() == "mpi", "the (root, buffers) constructor gives a host model transport 'mpi'");
  DataParallel automatic(t, MPI_COMM_WORLD, DataParallelOptions{});
  check(automatic.transport() == "mpi", "transport 'auto' of a host model is 'mpi'");
  DataParallel mpi(t, MPI_COMM_WORLD, DataParallelOptions{0, BufferSync::root, "mpi"});
  const double loss = mpi.step(random_tensor(4, kIn, 10 + g_rank), labels(4, 20 + g_rank));
  check(mpi.transport() == "mpi" && loss > 0 && mpi.parameter_divergence() == 0.0,
        "transport 'mpi' steps and keeps the replicas equal");
  expect_construction_error("unknown", "", DataParallelOptions{0, BufferSync::root, "gloo"});
  expect_construction_error("nccl_host", "", DataParallelOptions{0, BufferSync::root, "nccl"});
  // Rank 1 alone asks for nccl: its refusal reaches rank 0 too.
  expect_construction_error("nccl_one_rank", "", DataParallelOptions{0, BufferSync::root, g_rank == 1 ? "nccl" : "mpi"});
  expect_construction_error("mixed", "", DataParallelOptions{0, BufferSync::root, g_rank == 1 ? "auto" : "mpi"});
}

#ifdef TREADLE_WITH_CUDA
// Without a GPU (skipped where the first step runs): every rank raises the model's "needs a CUDA device" error; nobody waits forever.
void cuda_model_without_device() {
  for (const char* transport : {"mpi", "auto"}) {
    Trainer t = make_trainer("cuda");
    DataParallel dp(t, MPI_COMM_WORLD, DataParallelOptions{0, BufferSync::root, transport});
    check(dp.transport() == "mpi", std::string("transport '") + transport + "' of a cuda model without a GPU is 'mpi'");
    try {
      dp.step(random_tensor(4, kIn, 1), labels(4, 2));
      std::printf("rank %d skip: a CUDA device is present (dp_cuda_check tests that case)\n", g_rank);
      return;
    } catch (const ValueError& e) {
      message(std::string("cuda_step_") + transport, e.what());
    }
    check(t.steps() == 0, "the failed step updated nothing");
  }
  expect_construction_error("cuda_nccl", "cuda", DataParallelOptions{0, BufferSync::root, "nccl"});
}
#endif

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);  // this program is the host: it owns MPI
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    std::printf("dp_transport_check needs 2 ranks, got %d\n", size);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  try {
    host_model();
#ifdef TREADLE_WITH_CUDA
    cuda_model_without_device();
#endif
  } catch (const std::exception& e) {
    check(false, std::string("unexpected exception: ") + e.what());
  }
  std::fflush(stdout);
  MPI_Finalize();
  return g_failures == 0 ? 0 : 1;
}
