// A backend the core does not know: a stub with one kernel (float32 relu), defined here and registered
// at run time with treadle::register_backend, without any core file naming it. Checks that it is
// listed, that a plan pinned to it runs its kernel (and falls back to the reference for the rest:
// relu's backward, tanh), that its results are the reference's, and that names are checked. Prints
// one line per check; exit 1 on failure.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/kernel.hpp"  // the Backend interface a backend implements (internal header)
#include "treadle/backend.hpp"
#include "treadle/error.hpp"
#include "treadle/testing.hpp"

namespace {

int g_failures = 0;
int g_stub_calls = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

template <typename F>
bool throws_value_error(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const treadle::ValueError& e) {
    return std::string(e.what()).find(needle) != std::string::npos;
  }
  return false;
}

void stub_relu(const treadle::KernelArgs& a) {
  ++g_stub_calls;
  const float* x = a.in[0].ptr<float>();
  float* y = a.out[0].ptr<float>();
  for (int64_t i = 0; i < a.out[0].numel; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

class StubBackend final : public treadle::Backend {
 public:
  StubBackend() { table_.add("relu", treadle::DType::f32, &stub_relu); }
  const char* name() const override { return "stub"; }
  treadle::KernelFn find(const treadle::Graph& g, const treadle::Node& node) const override {
    return table_.find(g, node);
  }
  std::vector<treadle::OpSupport> supported_ops() const override { return table_.list(); }

 private:
  treadle::KernelTable table_;
};

bool listed(const std::string& name) {
  for (const std::string& b : treadle::backend_names())
    if (b == name) return true;
  return false;
}

}  // namespace

int main() {
  using namespace treadle;
  static const StubBackend stub;  // outlives every plan that uses it
  std::vector<float> xs = {-2.0f, -0.5f, 0.0f, 0.25f, 3.0f, -1e-30f};
  const Tensor x = Tensor::wrap(xs.data(), {2, 3}, DType::f32).clone();

  check(!listed("stub"), "before registration the build's backends do not include 'stub'");
  check(throws_value_error([&] { run_op("relu", {x}, {}, {}, "stub"); }, "unknown backend 'stub'"),
        "pinning an unregistered backend is a ValueError naming it");

  register_backend(stub);
  const std::vector<std::string> names = backend_names();
  check(listed("stub") && names.back() == "eigen", "registered: listed, before the reference (eigen stays last)");

  // Forward on the stub, relu's backward on the reference (the stub has no kernel for it).
  std::vector<float> gs = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  const Tensor g = Tensor::wrap(gs.data(), {2, 3}, DType::f32).clone();
  const OpRunResult got = run_op("relu", {x}, {}, {g}, "stub");
  const OpRunResult want = run_op("relu", {x}, {}, {g}, "eigen");
  check(g_stub_calls == 1, "the stub's kernel ran once (calls: " + std::to_string(g_stub_calls) + ")");
  const bool placed =
      got.plan.find("relu [stub]") != std::string::npos && got.plan.find("relu_backward [eigen]") != std::string::npos;
  check(placed,
        "the plan names the stub for relu and the reference for its backward:\n" + got.plan);
  bool same = true;
  for (int64_t i = 0; i < x.numel(); ++i) {
    same = same && got.outputs[0].data_as<float>()[i] == want.outputs[0].data_as<float>()[i];
    same = same && got.input_grads[0].data_as<float>()[i] == want.input_grads[0].data_as<float>()[i];
  }
  check(same, "outputs and input gradient equal the reference's bitwise");

  const OpRunResult other = run_op("tanh", {x}, {}, {}, "stub");
  check(other.plan.find("tanh [eigen]") != std::string::npos && std::fabs(other.outputs[0].data_as<float>()[4] -
                                                                         std::tanh(3.0f)) < 1e-6f,
        "an op the stub does not take runs on the reference");

  check(throws_value_error([&] { register_backend(stub); }, "registered already"), "a second registration is refused");
  struct Named final : Backend {
    explicit Named(const char* n) : n_(n) {}
    const char* name() const override { return n_; }
    KernelFn find(const Graph&, const Node&) const override { return nullptr; }
    std::vector<OpSupport> supported_ops() const override { return {}; }
    const char* n_;
  };
  static const Named eigen("eigen"), empty(""), automatic("auto"), indexed("stub:1");
  check(throws_value_error([&] { register_backend(eigen); }, "is built in"), "a built-in name is refused");
  check(throws_value_error([&] { register_backend(empty); }, "not a backend name"), "an empty name is refused");
  check(throws_value_error([&] { register_backend(automatic); }, "not a backend name"), "'auto' is refused");
  // ":1" would be read as a device index ("cuda:1").
  check(throws_value_error([&] { register_backend(indexed); }, "not a backend name"), "a name with a colon is refused");

  // A registered host backend runs on the CPU and takes no device index.
  check(backend_device("stub") == Device{} && backend_device("") == Device{} && backend_device("auto") == Device{},
        "host backends, '' and 'auto' run on the CPU");
  check(throws_value_error([&] { backend_device("stub:1"); }, "takes no device index"),
        "a device index on a host backend is refused");

  std::printf("PASSED: %d failure(s)\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}
