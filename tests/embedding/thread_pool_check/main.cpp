// treadle::executors::ThreadPool as a host uses it: training on the pool gives bitwise the serial
// result; chunks cover the range exactly once; a chunk's exception reaches the caller; a nested
// parallel_for runs inline; the pool's threads are gone after its destructor. Prints "ok: ..." lines.
#include <treadle/executors/thread_pool.hpp>
#include <treadle/treadle.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

int thread_count() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
  return n;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("FAILED: " + what);
  std::printf("ok: %s\n", what.c_str());
}

std::vector<float> train(treadle::Executor* exec) {
  using namespace treadle::nn;
  treadle::manual_seed(3);
  auto net = std::make_shared<Sequential>(std::vector<std::shared_ptr<treadle::Module>>{
      std::make_shared<Linear>(16, 128), std::make_shared<Activation>("relu"), std::make_shared<Linear>(128, 4)});
  auto model = std::make_shared<treadle::Model>(net);
  treadle::optim::AdamOptions adam;
  treadle::Trainer trainer(model, treadle::loss::mse(), treadle::optim::adam(adam), {}, exec, 0);
  std::vector<float> xb(512 * 16), yb(512 * 4);
  for (std::size_t i = 0; i < xb.size(); ++i) xb[i] = static_cast<float>((i * 7919 % 201) / 100.0 - 1.0);
  for (std::size_t i = 0; i < yb.size(); ++i) yb[i] = static_cast<float>((i * 104729 % 97) / 48.0 - 1.0);
  auto x = treadle::Tensor::wrap(xb.data(), {512, 16}, treadle::DType::f32);
  auto y = treadle::Tensor::wrap(yb.data(), {512, 4}, treadle::DType::f32);
  for (int s = 0; s < 20; ++s) trainer.step(x, y);
  const auto& flat = model->flat_parameters();
  return {flat.data_as<float>(), flat.data_as<float>() + flat.numel()};
}

void run() {
  const int before = thread_count();
  {
    treadle::executors::ThreadPool pool(3);
    check(pool.num_workers() == 3 && thread_count() == before + 2, "ThreadPool(3) starts 2 threads (the caller is the 3rd)");

    std::vector<std::atomic<int>> hits(1000);
    pool.parallel_for(1000, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    bool once = true;
    for (auto& h : hits) once = once && h.load() == 1;
    check(once, "parallel_for runs every index exactly once");

    bool caught = false;
    try {
      pool.parallel_for(9, [](int64_t b, int64_t) {
        if (b > 0) throw std::invalid_argument("chunk failed");
      });
    } catch (const std::invalid_argument& e) {
      caught = std::string(e.what()) == "chunk failed";
    }
    check(caught, "a chunk's exception is rethrown on the calling thread");

    std::atomic<int64_t> total{0};
    pool.parallel_for(4, [&](int64_t b, int64_t e) {
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) { total += (e2 - b2) * (e - b); });
    });
    check(total.load() == 40, "a nested parallel_for runs inline");

    std::vector<float> pooled = train(&pool), serial = train(nullptr);
    check(pooled.size() == serial.size() && std::memcmp(pooled.data(), serial.data(), 4 * pooled.size()) == 0,
          "training on the pool is bitwise equal to serial training (" + std::to_string(pooled.size()) + " values)");
  }
  // pthread_join returns once the kernel clears the thread's tid, which is a moment before its
  // /proc/self/task entry goes: on a loaded machine the count lags the join by a little.
  for (int i = 0; i < 200 && thread_count() != before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  check(thread_count() == before, "the destructor joins the pool's threads");
}

}  // namespace

int main() {
  try {
    run();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "thread_pool_check: %s\n", e.what());
    return 1;
  }
}
