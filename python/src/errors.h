// How the binding reports failure: every absl::Status that is not OK becomes a
// StatusError, which the module's translator raises as the kvarena.Error subclass of its
// code (kvarena/_errors.py), carrying the daemon's message and .code. Bad Python input
// found by the binding itself raises the same way (InvalidArgument, a ValueError) before
// anything is sent. A pybind11 cast error (a value of the wrong Python type) raises
// TypeError rather than pybind11's bare RuntimeError.
//
// Blocking calls go through Blocking(): the GIL is released once around the C++ call and
// the result is unwrapped after it is taken back, so no Python object is touched without
// the GIL.
#ifndef KVARENA_PYTHON_SRC_ERRORS_H_
#define KVARENA_PYTHON_SRC_ERRORS_H_

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvarena::python {

class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status) : status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return "kvarena status error"; }

 private:
  absl::Status status_;
};

inline void ThrowIfError(absl::Status s) {
  if (!s.ok()) throw StatusError(std::move(s));
}
template <typename T>
T ValueOrThrow(absl::StatusOr<T> r) {
  if (!r.ok()) throw StatusError(std::move(r).status());
  return *std::move(r);
}

// A caller-input error (kvarena.InvalidArgument), raised before anything is sent.
[[noreturn]] inline void ThrowInvalid(const std::string& message) {
  throw StatusError(absl::InvalidArgumentError(message));
}

// Runs f() (returning absl::Status or absl::StatusOr<T>) with the GIL released, then
// raises its error or returns its value (void for a Status).
template <typename F>
auto Blocking(F&& f) {
  using R = std::invoke_result_t<F>;
  if constexpr (std::is_same_v<R, absl::Status>) {
    absl::Status s;
    {
      pybind11::gil_scoped_release nogil;
      s = f();
    }
    ThrowIfError(std::move(s));
  } else {
    R r = [&] {
      pybind11::gil_scoped_release nogil;
      return f();
    }();
    return ValueOrThrow(std::move(r));
  }
}

// Registers the translator from StatusError to kvarena._errors' classes.
void RegisterErrors(pybind11::module_& m);

}  // namespace kvarena::python

#endif  // KVARENA_PYTHON_SRC_ERRORS_H_
