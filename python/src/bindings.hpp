#pragma once
// Shared by the binding files: numpy <-> Tensor conversion with the checks every entry point needs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "treadle/model.hpp"
#include "treadle/tensor.hpp"

namespace py = pybind11;

namespace treadle::py_bind {

// Wraps a numpy array without copying. The array must be C-contiguous, aligned and of a supported
// dtype; otherwise TypeError/ValueError naming `what` and the problem. `writable` additionally
// rejects read-only arrays. The tensor keeps the array alive, unless `borrowed`: for tensors that
// live only during a call whose arguments hold the arrays (saves two allocations and a GIL
// round trip per array on the batch-1 paths).
Tensor tensor_from_numpy(const py::handle& obj, const char* what, bool writable = false, bool borrowed = false);
// The same, or a CUDA array (an object with __cuda_array_interface__: CuPy, torch CUDA tensors,
// Numba) as a device tensor (Tensor::wrap_device), for the entry points a model on backend "cuda"
// serves: the trainer's inputs and targets, predict's inputs and out. A build without CUDA raises
// TypeError for a CUDA array.
Tensor tensor_from_array(const py::handle& obj, const char* what, bool writable = false, bool borrowed = false);
// A numpy array that owns a copy of `t`.
py::array numpy_copy(const Tensor& t);
// A numpy array viewing `t`'s memory (kept alive by `owner`); writes go to the tensor.
py::array numpy_view(const Tensor& t, py::handle owner);
DType dtype_from_numpy(const py::dtype& dt, const char* what);
py::dtype numpy_dtype(DType t);
DType dtype_from_py(const py::handle& obj);  // "float32", np.float32, np.dtype
// {"parameters", "gradients", "optimizer_state", "activations", "total"} in bytes.
py::dict memory_dict(const MemoryReport& r);

void bind_core(py::module_& m);
void bind_math(py::module_& m);  // after bind_core (adds to its functional submodule)
void bind_nn(py::module_& m);
void bind_optim(py::module_& m);
void bind_train(py::module_& m);
void bind_loss(py::module_& m);
void bind_recurrent(py::module_& m);
void bind_executor(py::module_& m);
void bind_attention(py::module_& m);
void bind_layers(py::module_& m);
void bind_serialize(py::module_& m);
void bind_conv(py::module_& m);
void bind_dispatch(py::module_& m);
void bind_verify(py::module_& m);
void bind_replay(py::module_& m);
void bind_data_parallel(py::module_& m);  // DataParallel over an mpi4py communicator

}  // namespace treadle::py_bind
