#include <cstring>

#include "bindings.hpp"
#include "treadle/cuda.hpp"
#include "treadle/error.hpp"

namespace treadle::py_bind {

DType dtype_from_numpy(const py::dtype& dt, const char* what) {
  if (dt.is(py::dtype::of<float>())) return DType::f32;
  if (dt.is(py::dtype::of<double>())) return DType::f64;
  if (dt.is(py::dtype::of<int64_t>())) return DType::i64;
  if (dt.is(py::dtype::of<int32_t>())) return DType::i32;
  switch (dt.kind()) {  // equivalent dtypes that are not the canonical objects (e.g. byte order)
    case 'f':
      if (dt.itemsize() == 4 && dt.byteorder() != '>') return DType::f32;
      if (dt.itemsize() == 8 && dt.byteorder() != '>') return DType::f64;
      break;
    case 'i':
      if (dt.itemsize() == 8 && dt.byteorder() != '>') return DType::i64;
      if (dt.itemsize() == 4 && dt.byteorder() != '>') return DType::i32;
      break;
  }
  throw_type_error(what, ": unsupported dtype ", std::string(py::str(dt)),
                   " (expected float32, float64, int32 or int64)");
}

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::f32: return py::dtype::of<float>();
    case DType::f64: return py::dtype::of<double>();
    case DType::i32: return py::dtype::of<int32_t>();
    case DType::i64: return py::dtype::of<int64_t>();
    default: throw_type_error("no numpy dtype for ", dtype_name(t));
  }
}

DType dtype_from_py(const py::handle& obj) {
  if (py::isinstance<py::str>(obj)) return dtype_from_name(obj.cast<std::string>());
  return dtype_from_numpy(py::dtype::from_args(py::reinterpret_borrow<py::object>(obj)), "dtype");
}

namespace {

std::string type_name(const py::handle& obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

bool is_cuda_array(const py::handle& obj) {
  return !py::isinstance<py::array>(obj) && py::hasattr(obj, "__cuda_array_interface__");
}

// The tensor keeps the Python object alive; releasing it needs the GIL, which may not be held then.
std::shared_ptr<void> keep_alive(const py::handle& obj) {
  auto* keep = new py::object(py::reinterpret_borrow<py::object>(obj));
  return std::shared_ptr<void>(keep, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
}

DType dtype_from_typestr(const std::string& typestr, const char* what) {
  if (typestr == "<f4") return DType::f32;
  if (typestr == "<f8") return DType::f64;
  if (typestr == "<i8") return DType::i64;
  if (typestr == "<i4") return DType::i32;
  throw_type_error(what, ": unsupported CUDA array type '", typestr, "' (expected float32 '<f4', float64 '<f8', ",
                   "int32 '<i4' or int64 '<i8')");
}

// A CUDA array interface (version 3) as a device tensor: checked like a numpy array (dtype, C order,
// alignment, read-only for outputs), then its device asked from the runtime and its stream waited for.
Tensor tensor_from_cuda_array(const py::handle& obj, const char* what, bool writable, bool borrowed) {
  const py::dict cai = obj.attr("__cuda_array_interface__");
#ifndef TREADLE_WITH_CUDA
  throw_type_error(what, ": got a CUDA array (", type_name(obj), "), but this build of treadle has no CUDA support ",
                   "(build with -DTREADLE_WITH_CUDA=ON, docs/cuda.md); pass a numpy array");
#else
  const DType dt = dtype_from_typestr(cai["typestr"].cast<std::string>(), what);
  Shape shape;
  for (auto d : cai["shape"]) shape.push_back(d.cast<int64_t>());
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    const Shape strides = contiguous_strides(shape);
    std::size_t d = 0;
    for (auto st : cai["strides"]) {
      const int64_t bytes = st.cast<int64_t>();
      if (d < shape.size() && shape[d] != 1 && bytes != strides[d] * static_cast<int64_t>(dtype_size(dt)))
        throw_value_error(what, ": CUDA array of shape ", shape_str(shape), " is not C-contiguous (byte stride ", bytes,
                          " in dimension ", d, "); make it contiguous first");
      ++d;
    }
  }
  const py::tuple data = cai["data"];
  auto* ptr = reinterpret_cast<void*>(data[0].cast<std::uintptr_t>());
  if (writable && data[1].cast<bool>()) throw_value_error(what, ": CUDA array is read-only");
  if (shape_numel(shape) > 0 && reinterpret_cast<std::uintptr_t>(ptr) % dtype_size(dt) != 0)
    throw_value_error(what, ": CUDA array data is not aligned to its element size");
  const Device device = shape_numel(shape) > 0 ? cuda::device_of_pointer(ptr, what) : Device{DeviceKind::cuda, 0};
  if (cai.contains("stream") && !cai["stream"].is_none()) cuda::wait_for_stream(cai["stream"].cast<std::uintptr_t>(), what);
  return Tensor::wrap_device(ptr, std::move(shape), dt, device, borrowed ? nullptr : keep_alive(obj));
#endif
}

}  // namespace

Tensor tensor_from_array(const py::handle& obj, const char* what, bool writable, bool borrowed) {
  if (is_cuda_array(obj)) return tensor_from_cuda_array(obj, what, writable, borrowed);
  return tensor_from_numpy(obj, what, writable, borrowed);
}

Tensor tensor_from_numpy(const py::handle& obj, const char* what, bool writable, bool borrowed) {
  if (is_cuda_array(obj))
    throw_type_error(what, ": expected a numpy array, got a CUDA array (", type_name(obj), "); device arrays are ",
                     "taken by Trainer.step / compute_gradients / evaluate and Model.predict of a model on backend ",
                     "'cuda', host arrays everywhere");
  if (!py::isinstance<py::array>(obj))
    throw_type_error(what, ": expected a numpy array, got ", type_name(obj));
  auto arr = py::reinterpret_borrow<py::array>(obj);
  DType dt = dtype_from_numpy(arr.dtype(), what);
  if (!(arr.flags() & py::array::c_style)) {
    if (writable) {  // written in place: a copy would take the results
      std::string shape, strides;
      for (py::ssize_t d = 0; d < arr.ndim(); ++d) {
        shape += (d ? ", " : "") + std::to_string(arr.shape(d));
        strides += (d ? ", " : "") + std::to_string(arr.strides(d));
      }
      throw_value_error(what, ": array of shape (", shape, ") with byte strides (", strides,
                        ") is not C-contiguous; an output is written in place, so pass a C-contiguous one "
                        "(np.empty(shape, dtype))");
    }
    // An input that is a strided slice, a transpose or in Fortran order is copied once into C order
    // (np.ascontiguousarray), as torch.from_numpy(x).contiguous() would; the copy lives as long as
    // the tensor. Contiguous inputs, the hot path, are never copied.
    py::array copy = py::module_::import("numpy").attr("ascontiguousarray")(arr);
    Shape shape(copy.shape(), copy.shape() + copy.ndim());
    return Tensor::wrap(const_cast<void*>(copy.data()), std::move(shape), dt, keep_alive(copy));
  }
  if (reinterpret_cast<std::uintptr_t>(arr.data()) % dtype_size(dt) != 0)
    throw_value_error(what, ": array data is not aligned to its element size");
  if (writable && !arr.writeable()) throw_value_error(what, ": array is read-only");
  Shape shape(arr.shape(), arr.shape() + arr.ndim());
  if (borrowed) return Tensor::wrap(const_cast<void*>(arr.data()), std::move(shape), dt);
  return Tensor::wrap(const_cast<void*>(arr.data()), std::move(shape), dt, keep_alive(arr));
}

py::array numpy_copy(const Tensor& t) {
  Tensor c = t.is_contiguous() ? t : t.clone();
  py::array out(numpy_dtype(t.dtype()), std::vector<py::ssize_t>(t.shape().begin(), t.shape().end()));
  std::memcpy(out.mutable_data(), c.data(), c.nbytes());
  return out;
}

py::array numpy_view(const Tensor& t, py::handle owner) {
  std::vector<py::ssize_t> strides;
  for (int64_t s : t.strides()) strides.push_back(static_cast<py::ssize_t>(s * dtype_size(t.dtype())));
  return py::array(numpy_dtype(t.dtype()), std::vector<py::ssize_t>(t.shape().begin(), t.shape().end()), strides,
                   t.data(), owner);
}

}  // namespace treadle::py_bind
