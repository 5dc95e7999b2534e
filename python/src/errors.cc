#include "python/src/errors.h"

#include <string>

namespace kvarena::python {

namespace py = pybind11;

void RegisterErrors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      // kvarena/_errors.py maps the code to its class and builds the instance.
      py::object make = py::module_::import("kvarena._errors").attr("error_for");
      py::object err = make(static_cast<int>(e.status().code()), std::string(e.status().message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
    } catch (const py::cast_error& e) {
      // An argument pybind11 could not convert inside a binding: the caller's type is
      // wrong, a TypeError (pybind11 would raise a bare RuntimeError).
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const py::reference_cast_error& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
  m.def(
      "_raise_status",
      [](int code, const std::string& message) {
        throw StatusError(absl::Status(static_cast<absl::StatusCode>(code), message));
      },
      "Raises the kvarena.Error of a status code (tests of the translator).");
}

}  // namespace kvarena::python
