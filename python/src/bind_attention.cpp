#include "bindings.hpp"
#include "treadle/nn_attention.hpp"

namespace treadle::py_bind {

void bind_attention(py::module_& m) {
  py::class_<nn::MultiheadAttention, Module, std::shared_ptr<nn::MultiheadAttention>>(m, "MultiheadAttention")
      .def(py::init([](int64_t e, int64_t h, double dropout, bool bias, bool batch_first, const py::object& dtype) {
             return std::make_shared<nn::MultiheadAttention>(e, h, dropout, bias, batch_first, dtype_from_py(dtype));
           }),
           py::arg("embed_dim"), py::arg("num_heads"), py::arg("dropout") = 0.0, py::arg("bias") = true,
           py::arg("batch_first") = false, py::arg("dtype") = "float32")
      .def("attend",
           [](nn::MultiheadAttention& mha, Value q, Value k, Value v, std::optional<Value> kpm,
              std::optional<Value> attn_mask, bool is_causal, bool need_weights) {
             nn::AttentionMasks masks{kpm ? *kpm : Value(), attn_mask ? *attn_mask : Value(), is_causal};
             auto [out, w] = mha.attend(q, k, v, masks, need_weights);
             return py::make_tuple(out, w.defined() ? py::cast(w) : py::none());
           },
           py::arg("query"), py::arg("key"), py::arg("value"), py::arg("key_padding_mask") = py::none(),
           py::arg("attn_mask") = py::none(), py::arg("is_causal") = false, py::arg("need_weights") = false);
  py::class_<nn::TransformerEncoderLayer, Module, std::shared_ptr<nn::TransformerEncoderLayer>>(
      m, "TransformerEncoderLayer")
      .def(py::init([](int64_t d, int64_t h, int64_t ff, double dropout, const std::string& act, double eps, bool bf,
                       bool nf, bool bias, const py::object& dtype) {
             return std::make_shared<nn::TransformerEncoderLayer>(d, h, ff, dropout, act, eps, bf, nf, bias,
                                                                  dtype_from_py(dtype));
           }),
           py::arg("d_model"), py::arg("nhead"), py::arg("dim_feedforward") = 2048, py::arg("dropout") = 0.1,
           py::arg("activation") = "relu", py::arg("layer_norm_eps") = 1e-5, py::arg("batch_first") = false,
           py::arg("norm_first") = false, py::arg("bias") = true, py::arg("dtype") = "float32")
      .def("encode",
           [](nn::TransformerEncoderLayer& layer, Value src, std::optional<Value> mask, std::optional<Value> kpm,
              bool is_causal) {
             return layer.encode(src, nn::AttentionMasks{kpm ? *kpm : Value(), mask ? *mask : Value(), is_causal});
           },
           py::arg("src"), py::arg("src_mask") = py::none(), py::arg("src_key_padding_mask") = py::none(),
           py::arg("is_causal") = false);
}

}  // namespace treadle::py_bind
