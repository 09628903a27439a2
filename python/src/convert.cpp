#include <cstring>

#include "bindings.hpp"
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

Tensor tensor_from_numpy(const py::handle& obj, const char* what, bool writable, bool borrowed) {
  if (!py::isinstance<py::array>(obj))
    throw_type_error(what, ": expected a numpy array, got ", std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  auto arr = py::reinterpret_borrow<py::array>(obj);
  DType dt = dtype_from_numpy(arr.dtype(), what);
  if (!(arr.flags() & py::array::c_style)) {
    std::string shape, strides;
    for (py::ssize_t d = 0; d < arr.ndim(); ++d) {
      shape += (d ? ", " : "") + std::to_string(arr.shape(d));
      strides += (d ? ", " : "") + std::to_string(arr.strides(d));
    }
    throw_value_error(what, ": array of shape (", shape, ") with byte strides (", strides,
                      ") is not C-contiguous (pass np.ascontiguousarray(x))");
  }
  if (reinterpret_cast<std::uintptr_t>(arr.data()) % dtype_size(dt) != 0)
    throw_value_error(what, ": array data is not aligned to its element size");
  if (writable && !arr.writeable()) throw_value_error(what, ": array is read-only");
  Shape shape(arr.shape(), arr.shape() + arr.ndim());
  if (borrowed) return Tensor::wrap(const_cast<void*>(arr.data()), std::move(shape), dt);
  // The tensor keeps the array alive; releasing it needs the GIL, which may not be held then.
  auto* keep = new py::object(arr);
  std::shared_ptr<void> owner(keep, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  return Tensor::wrap(const_cast<void*>(arr.data()), std::move(shape), dt, std::move(owner));
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
