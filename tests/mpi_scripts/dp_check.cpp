// The C++ DataParallel under `mpiexec -n 3`: data-parallel training on shards (one empty, root 1)
// equals one process on the whole batch; sub-communicators from MPI_Comm_split train independently;
// a setup mismatch and a failing rank raise the same ValueError on every rank; BatchNorm's running
// statistics follow BufferSync and survive a failed step unchanged. Prints one line per
// check ("ok"/"FAIL") and the error messages ("message <tag>: <text>") for tests/test_distributed.py;
// exits non-zero if a check failed.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "treadle/distributed.hpp"
#include "treadle/nn_layers.hpp"
#include "treadle/treadle.hpp"

namespace {

using namespace treadle;
constexpr int64_t kIn = 5, kOut = 3;
int g_rank = 0, g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("rank %d %s: %s\n", g_rank, ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

Trainer make_trainer(uint64_t seed, DType dtype, int64_t hidden = 8) {
  manual_seed(seed);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Linear>(kIn, hidden, true, dtype));
  net->add(std::make_shared<nn::Activation>("tanh"));
  net->add(std::make_shared<nn::Linear>(hidden, kOut, true, dtype));
  optim::AdamOptions adam;
  adam.lr = 0.05;
  return Trainer(std::make_shared<Model>(net), loss::mse(), optim::adam(adam));
}

Tensor random_tensor(int64_t rows, int64_t cols, DType dtype, uint32_t seed) {
  Tensor t({rows, cols}, dtype);
  std::mt19937 gen(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (dtype == DType::f32) t.data_as<float>()[i] = static_cast<float>(n(gen));
    else t.data_as<double>()[i] = n(gen);
  }
  return t;
}

Tensor rows(const Tensor& t, int64_t begin, int64_t end) {
  Tensor out({end - begin, t.dim(1)}, t.dtype());
  const std::size_t row = static_cast<std::size_t>(t.dim(1)) * dtype_size(t.dtype());
  if (end > begin) std::memcpy(out.data(), static_cast<const char*>(t.data()) + begin * row, (end - begin) * row);
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

double max_diff(const Tensor& a, const Tensor& b) {
  double d = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.dtype() == DType::f32 ? a.data_as<float>()[i] : a.data_as<double>()[i];
    double y = b.dtype() == DType::f32 ? b.data_as<float>()[i] : b.data_as<double>()[i];
    d = std::max(d, std::fabs(x - y));
  }
  return d;
}

void warm_up(Trainer& t, DType dtype, int rank) {  // rank-dependent history that the root's replaces
  for (int i = 0; i <= rank; ++i)
    t.step(random_tensor(4, kIn, dtype, 1000 * (rank + 1) + i), random_tensor(4, kOut, dtype, 2000 + i));
}

// Trains on `comm` with the given shard sizes and compares with one process on the whole batch.
void equivalence(MPI_Comm comm, const std::vector<int64_t>& shards, int root, DType dtype, double tol,
                 const std::string& what) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  Trainer mine = make_trainer(100 + rank, dtype), ref = make_trainer(100 + root, dtype);
  warm_up(mine, dtype, rank);
  warm_up(ref, dtype, root);
  DataParallel dp(mine, comm, root);
  int64_t total = 0, begin = 0;
  for (int64_t s : shards) total += s;
  for (int r = 0; r < rank; ++r) begin += shards[r];
  double worst_loss = 0.0;
  for (int step = 0; step < 4; ++step) {
    Tensor x = random_tensor(total, kIn, dtype, 7 + step), y = random_tensor(total, kOut, dtype, 70 + step);
    double got = dp.step(rows(x, begin, begin + shards[rank]), rows(y, begin, begin + shards[rank]));
    worst_loss = std::max(worst_loss, std::fabs(got - ref.step(x, y)));
  }
  const double d = max_diff(mine.model().flat_parameters(), ref.model().flat_parameters());
  check(d <= tol, what + ": parameters match one process on the whole batch (max diff " + num(d) + ")");
  check(worst_loss <= tol * 10, what + ": global losses match (max diff " + num(worst_loss) + ")");
  check(dp.parameter_divergence() == 0.0, what + ": replicas are bitwise identical");
}

void message(const std::string& tag, const std::string& text) {
  std::printf("rank %d message %s: %s\n", g_rank, tag.c_str(), text.c_str());
}

void mismatch_and_failure(MPI_Comm comm) {
  try {
    Trainer t = make_trainer(0, DType::f64, g_rank == 2 ? 9 : 8);
    DataParallel dp(t, comm);
    check(false, "a width mismatch must throw");
  } catch (const ValueError& e) {
    message("mismatch", e.what());
  }
  Trainer t = make_trainer(0, DType::f64);
  DataParallel dp(t, comm);
  try {
    dp.step(random_tensor(3, g_rank == 1 ? 4 : kIn, DType::f64, 1), random_tensor(3, kOut, DType::f64, 2));
    check(false, "a bad input on rank 1 must throw on every rank");
  } catch (const ValueError& e) {
    message("failure", e.what());
  }
  check(t.steps() == 0 && dp.parameter_divergence() == 0.0, "after the failed step nobody updated");
  dp.step(random_tensor(3, kIn, DType::f64, 5), random_tensor(3, kOut, DType::f64, 6));
  check(dp.parameter_divergence() == 0.0 && t.steps() == 1, "training goes on in sync after the failure");
}

// BatchNorm's running statistics: identical replicas with BufferSync::root, different with ::local;
// a failed step puts back the statistics the forward pass had already updated.
void batch_norm_buffers(MPI_Comm comm) {
  for (BufferSync mode : {BufferSync::root, BufferSync::local}) {
    manual_seed(5 + g_rank);
    auto net = std::make_shared<nn::Sequential>();
    net->add(std::make_shared<nn::Linear>(kIn, 6));
    net->add(std::make_shared<nn::BatchNorm>(1, 6));
    net->add(std::make_shared<nn::Linear>(6, kOut));
    Trainer t(std::make_shared<Model>(net), loss::mse(), optim::sgd({}));
    DataParallel dp(t, comm, 0, mode);
    const int64_t n = 3 + g_rank;
    dp.step(random_tensor(n, kIn, DType::f32, 40 + g_rank), random_tensor(n, kOut, DType::f32, 50 + g_rank));
    const double d = dp.parameter_divergence();
    if (mode == BufferSync::local) {
      check(d > 0.0, "BufferSync::local leaves each rank its own running statistics (spread " + num(d) + ")");
      continue;
    }
    check(d == 0.0, "BufferSync::root: replicas identical, running statistics included");
    Tensor before = t.model().flat_parameters().clone();
    try {
      dp.step(random_tensor(n, g_rank == 2 ? 4 : kIn, DType::f32, 60), random_tensor(n, kOut, DType::f32, 61));
    } catch (const ValueError&) {
    }
    check(max_diff(before, t.model().flat_parameters()) == 0.0,
          "a failed step leaves the running statistics as they were");
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);  // this program is the host: it owns MPI
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 3) {
    std::printf("dp_check needs 3 ranks, got %d\n", size);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  try {
    equivalence(MPI_COMM_WORLD, {5, 0, 3}, 1, DType::f64, 1e-12, "float64, shards 5/0/3, root 1");
    MPI_Comm group;
    MPI_Comm_split(MPI_COMM_WORLD, g_rank < 2 ? 0 : 1, g_rank, &group);
    if (g_rank < 2) equivalence(group, {2, 6}, 0, DType::f32, 1e-5, "sub-communicator {0, 1}, float32");
    else equivalence(group, {4}, 0, DType::f32, 1e-5, "sub-communicator {2}, float32");
    MPI_Comm_free(&group);
    mismatch_and_failure(MPI_COMM_WORLD);
    batch_norm_buffers(MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    check(false, std::string("unexpected exception: ") + e.what());
  }
  std::fflush(stdout);
  MPI_Finalize();
  return g_failures == 0 ? 0 : 1;
}
