#include "backends/eigen/eigen_backend.hpp"

namespace treadle {
namespace {

class EigenBackend final : public Backend {
 public:
  EigenBackend() {
    register_eigen_linear(table_);
    register_eigen_elementwise(table_);
    register_eigen_shape(table_);
    register_eigen_activation(table_);
    register_eigen_softmax(table_);
    register_eigen_dropout(table_);
    register_eigen_loss(table_);
    register_eigen_recurrent(table_);
    register_eigen_attention(table_);
    register_eigen_norm(table_);
    register_eigen_embedding(table_);
    register_eigen_misc(table_);
    register_eigen_conv(table_);
    register_eigen_pool(table_);
  }
  const char* name() const override { return "eigen"; }
  KernelFn find(const Graph& g, const Node& node) const override {
    DType key = node.inputs.empty() ? g.info(node.outputs.at(0)).dtype : g.info(node.inputs[0]).dtype;
    return table_.find(node.op, key);
  }
  std::vector<OpSupport> supported_ops() const override { return table_.list(); }

 private:
  KernelTable table_;
};

}  // namespace

const Backend& eigen_backend() {
  static const EigenBackend backend;
  return backend;
}

}  // namespace treadle
