// DataParallel over models on backend "cuda", for the GPU script (tools/gpu_dp_check.sh):
//   mpiexec -n 1 dp_cuda_check   transport "nccl" (one rank, one GPU) and "mpi" (MLP, BatchNorm MLP)
//   mpiexec -n 2 dp_cuda_check   transport "mpi" with two processes sharing the GPU; "auto" must
//                                choose "mpi" there and "nccl" must be refused on every rank
// Each case trains a small MLP data-parallel on "cuda" for kSteps steps (shards of uneven size) and
// compares the global loss curve and the final parameters with one process on "eigen" training on
// the concatenated batch: max |got - want| / max |want| <= 1e-5 (SGD with momentum), <= 1e-4 (Adam:
// its normalisation magnifies float32 differences in small gradients). Rank 0 prints one line per
// case, "PASS name detail" or "FAIL name message" (the worst rank's numbers), then
// "dp cuda checks (N ranks): P passed, F failed"; exit status 1 if a case failed. Without a CUDA
// device: "SKIP: no CUDA device (...)" and exit 0. `--backend eigen` runs the same harness with the
// data-parallel model on the host instead (the "mpi" cases only): a check of the harness itself that
// needs no GPU.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "treadle/distributed.hpp"
#include "treadle/nn_layers.hpp"
#include "treadle/treadle.hpp"

namespace {

using namespace treadle;
constexpr int64_t kIn = 16, kHidden = 32, kClasses = 4;
constexpr int kSteps = 12;
int g_rank = 0, g_size = 1, g_passed = 0, g_failed = 0;
std::string g_backend = "cuda";  // of the data-parallel models (the reference is always "eigen")

// Every rank reports ok / detail; rank 0 prints one line naming the first failing rank.
void report(const std::string& name, bool ok, const std::string& detail) {
  int bad = ok ? g_size : g_rank;  // the lowest failing rank, or g_size if none
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  std::string text = detail;
  if (bad < g_size && bad != 0) {  // rank 0 prints the failing rank's detail
    int len = static_cast<int>(detail.size());
    if (g_rank == bad) MPI_Send(&len, 1, MPI_INT, 0, 7, MPI_COMM_WORLD), MPI_Send(detail.data(), len, MPI_CHAR, 0, 8, MPI_COMM_WORLD);
    if (g_rank == 0) {
      MPI_Recv(&len, 1, MPI_INT, bad, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      text.assign(static_cast<std::size_t>(len), '\0');
      MPI_Recv(text.data(), len, MPI_CHAR, bad, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
  }
  if (bad < g_size) ++g_failed;
  else ++g_passed;
  if (g_rank == 0) {
    if (bad < g_size) std::printf("FAIL %s (rank %d) %s\n", name.c_str(), bad, text.c_str());
    else std::printf("PASS %s %s\n", name.c_str(), text.c_str());
    std::fflush(stdout);
  }
}

std::shared_ptr<Model> make_model(uint64_t seed, bool batch_norm) {
  manual_seed(seed);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Linear>(kIn, kHidden));
  if (batch_norm) net->add(std::make_shared<nn::BatchNorm>(1, kHidden));
  net->add(std::make_shared<nn::Activation>("relu"));
  net->add(std::make_shared<nn::Linear>(kHidden, kHidden));
  net->add(std::make_shared<nn::Activation>("tanh"));
  net->add(std::make_shared<nn::Linear>(kHidden, kClasses));
  return std::make_shared<Model>(net);
}

std::shared_ptr<Optimizer> make_optimizer(bool adam) {
  if (adam) {
    optim::AdamOptions o;
    o.lr = 1e-2;
    return optim::adam(o);
  }
  optim::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return optim::sgd(o);
}

// The global batch of step `step`: inputs uniform in [-1, 1], labels from a fixed linear teacher.
void global_batch(int step, int64_t n, Tensor& x, Tensor& y) {
  std::mt19937 gen(1234 + step), teacher_gen(99);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> teacher(kClasses * kIn);
  for (float& w : teacher) w = u(teacher_gen);
  x = Tensor({n, kIn}, DType::f32);
  y = Tensor({n}, DType::i64);
  float* xs = x.data_as<float>();
  for (int64_t i = 0; i < n * kIn; ++i) xs[i] = u(gen);
  for (int64_t r = 0; r < n; ++r) {
    int64_t best = 0;
    float best_score = -INFINITY;
    for (int64_t c = 0; c < kClasses; ++c) {
      float s = 0;
      for (int64_t f = 0; f < kIn; ++f) s += teacher[c * kIn + f] * xs[r * kIn + f];
      if (s > best_score) best_score = s, best = c;
    }
    y.data_as<int64_t>()[r] = best;
  }
}

Tensor rows(const Tensor& t, int64_t begin, int64_t end) {
  Shape shape = t.shape();
  shape[0] = end - begin;
  Tensor out(shape, t.dtype());
  const std::size_t row = t.numel() == 0 ? 0 : t.nbytes() / static_cast<std::size_t>(t.dim(0));
  if (end > begin) std::memcpy(out.data(), static_cast<const char*>(t.data()) + begin * row, (end - begin) * row);
  return out;
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    diff = std::max(diff, std::fabs(got[i] - want[i])), scale = std::max(scale, std::fabs(want[i]));
  return scale > 0 ? diff / scale : diff;
}

std::vector<double> values(const Tensor& t) { return {t.data_as<float>(), t.data_as<float>() + t.numel()}; }

struct Case {
  std::string name, transport, expect;  // expect: the transport "auto" must resolve to, or ""
  bool adam = false, batch_norm = false;
  BufferSync buffers = BufferSync::root;
  std::vector<int64_t> shards;  // per rank
};

void run_case(const Case& c) {
  int64_t total = 0, begin = 0;
  for (int64_t s : c.shards) total += s;
  for (int r = 0; r < g_rank; ++r) begin += c.shards[r];
  const double tol = c.adam ? 1e-4 : 1e-5;
  std::string detail;
  bool ok = true;
  try {
    auto ref_model = make_model(7, c.batch_norm);
    ref_model->set_backend("eigen");
    Trainer ref(ref_model, loss::cross_entropy(), make_optimizer(c.adam));
    auto model = make_model(100 + g_rank, c.batch_norm);  // differs per rank: the root's is broadcast
    if (g_rank == 0) model = make_model(7, c.batch_norm);
    model->set_backend(g_backend);
    Trainer trainer(model, loss::cross_entropy(), make_optimizer(c.adam));
    DataParallel dp(trainer, MPI_COMM_WORLD, DataParallelOptions{0, c.buffers, c.transport});
    if (!c.expect.empty() && dp.transport() != c.expect)
      throw std::runtime_error("transport '" + c.transport + "' resolved to '" + dp.transport() + "', expected '" +
                               c.expect + "'");
    std::vector<double> got, want;
    for (int step = 0; step < kSteps; ++step) {
      Tensor x, y;
      global_batch(step, total, x, y);
      got.push_back(dp.step(rows(x, begin, begin + c.shards[g_rank]), rows(y, begin, begin + c.shards[g_rank])));
      want.push_back(ref.step(x, y));
    }
    const double loss_err = relative_error(got, want);
    const double param_err = relative_error(values(model->flat_parameters()), values(ref_model->flat_parameters()));
    const double divergence = dp.parameter_divergence();
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "transport %s: losses rel.err %.2e, parameters rel.err %.2e (tol %.0e), loss %.4f -> %.4f, "
                  "replicas differ by %.1e",
                  dp.transport().c_str(), loss_err, param_err, tol, want.front(), want.back(), divergence);
    detail = buf;
    ok = loss_err <= tol && param_err <= tol && divergence == 0.0 && want.back() < want.front();
  } catch (const std::exception& e) {
    ok = false;
    detail = std::string("exception: ") + e.what();
  }
  report(c.name, ok, detail);
}

// "nccl" with two processes on one GPU: the same ValueError on every rank, nobody hangs.
void nccl_refused_on_shared_gpu() {
  std::string detail;
  bool ok = false;
  try {
    auto model = make_model(7, false);
    model->set_backend("cuda");
    Trainer trainer(model, loss::cross_entropy(), make_optimizer(false));
    DataParallel dp(trainer, MPI_COMM_WORLD, DataParallelOptions{0, BufferSync::root, "nccl"});
    detail = "constructed with transport " + dp.transport() + " on a shared GPU";
  } catch (const ValueError& e) {
    detail = e.what();
    ok = detail.find("needs one GPU per process") != std::string::npos ||
         detail.find("not in this build") != std::string::npos;
  } catch (const std::exception& e) {
    detail = std::string("not a ValueError: ") + e.what();
  }
  report("nccl_refused_on_shared_gpu", ok, detail);
}

bool nccl_built() {
  auto model = make_model(7, false);
  Trainer trainer(model, loss::cross_entropy(), make_optimizer(false));
  try {
    DataParallel dp(trainer, MPI_COMM_WORLD, DataParallelOptions{0, BufferSync::root, "nccl"});
  } catch (const ValueError& e) {
    return std::string(e.what()).find("not in this build") == std::string::npos;
  }
  return true;
}

// Where no device answers, a prediction on "cuda" raises "... needs a CUDA device ...".
std::string device_problem() {
  try {
    auto model = make_model(7, false);
    model->set_backend("cuda");
    model->predict(Tensor({1, kIn}, DType::f32));
  } catch (const ValueError& e) {
    if (std::string(e.what()).find("needs a CUDA device") != std::string::npos) return e.what();
    throw;
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);  // this program is the host: it owns MPI
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (argc == 3 && std::string(argv[1]) == "--backend") g_backend = argv[2];
  const std::string problem = g_backend == "cuda" ? device_problem() : std::string();
  if (!problem.empty()) {
    if (g_rank == 0) std::printf("SKIP: no CUDA device (%s)\n", problem.c_str());
    MPI_Finalize();
    return 0;
  }
  const bool nccl = g_backend == "cuda" && nccl_built();
  std::vector<Case> cases;
  if (g_size == 1) {
    if (nccl) {
      cases.push_back({"nccl_sgd", "nccl", "", false, false, BufferSync::root, {24}});
      cases.push_back({"nccl_adam", "nccl", "", true, false, BufferSync::root, {24}});
      cases.push_back({"auto_is_nccl", "auto", "nccl", false, false, BufferSync::root, {24}});
      cases.push_back({"nccl_batchnorm_root", "nccl", "", false, true, BufferSync::root, {24}});
      cases.push_back({"nccl_batchnorm_average", "nccl", "", false, true, BufferSync::average, {24}});
    } else if (g_rank == 0) {
      std::printf("SKIP nccl: %s\n", g_backend == "cuda" ? "this build has no NCCL (-DTREADLE_WITH_NCCL=ON)"
                                                          : "the models are not on backend 'cuda'");
    }
    cases.push_back({"mpi_sgd", "mpi", "", false, false, BufferSync::root, {24}});
    cases.push_back({"mpi_batchnorm_root", "mpi", "", false, true, BufferSync::root, {24}});
  } else {
    std::vector<int64_t> shards;
    for (int r = 0; r < g_size; ++r) shards.push_back(20 - 8 * (r % 2));  // uneven: 20, 12, 20, ...
    cases.push_back({"mpi_sgd_shared_gpu", "mpi", "", false, false, BufferSync::root, shards});
    cases.push_back({"mpi_adam_shared_gpu", "mpi", "", true, false, BufferSync::root, shards});
    // The launcher gives every process the same cuda:0 (no per-rank CUDA_VISIBLE_DEVICES): "auto" must
    // see the shared GPU and keep to "mpi".
    cases.push_back({"auto_on_shared_gpu", "auto", "mpi", false, false, BufferSync::root, shards});
  }
  for (const Case& c : cases) run_case(c);
  if (g_size > 1 && nccl) nccl_refused_on_shared_gpu();
  if (g_rank == 0) std::printf("dp cuda checks (%d ranks): %d passed, %d failed\n", g_size, g_passed, g_failed);
  std::fflush(stdout);
  MPI_Finalize();
  return g_failed == 0 ? 0 : 1;
}
