// The measured dispatch table behind backend "auto" (treadle/dispatch.hpp).
#include "bindings.hpp"
#include "treadle/dispatch.hpp"

namespace treadle::py_bind {

void bind_dispatch(py::module_& m) {
  m.def("load_dispatch_table", &load_dispatch_table, py::arg("path"),
        "Reads and installs a dispatch table (JSON) for backend 'auto'; ValueError naming the file if it is "
        "missing or invalid.");
  m.def("clear_dispatch_table", &clear_dispatch_table,
        "Forgets the loaded table: back to $TREADLE_DISPATCH_TABLE or the shipped default.");
  m.def("set_default_dispatch_table", &set_default_dispatch_table, py::arg("path"),
        "The table used when none is loaded and $TREADLE_DISPATCH_TABLE is unset ('' = none).");
  m.def("dispatch_table_source", &dispatch_table_source, "Where the table in use comes from, or 'none'.");
  m.def(
      "dispatch_table_lookup",
      [](const std::string& op, const py::handle& dtype, int64_t size) {
        return dispatch_table_lookup(op, dtype_from_py(dtype), size);
      },
      py::arg("op"), py::arg("dtype"), py::arg("size"),
      "The backend the table in use names for op/dtype at this size ('' = no rule: priority order).");
}

}  // namespace treadle::py_bind
