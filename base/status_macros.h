// The status macros, so error paths stay one line (absl's and TensorFlow's macros of the
// same shape):
//   KVARENA_RETURN_IF_ERROR(expr): returns the absl::Status expr evaluates to, unless OK.
//   KVARENA_ASSIGN_OR_RETURN(lhs, expr): evaluates expr (an absl::StatusOr<T>); returns its
//     status unless OK, else moves its value into lhs (`T x`, `auto x` or an lvalue).
#ifndef KVARENA_BASE_STATUS_MACROS_H_
#define KVARENA_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"

#define KVARENA_RETURN_IF_ERROR(expr)                                     \
  do {                                                                    \
    if (::absl::Status _kvarena_status = (expr); !_kvarena_status.ok()) { \
      return _kvarena_status;                                             \
    }                                                                     \
  } while (0)

#define KVARENA_STATUS_CONCAT_INNER_(a, b) a##b
#define KVARENA_STATUS_CONCAT_(a, b) KVARENA_STATUS_CONCAT_INNER_(a, b)
#define KVARENA_ASSIGN_OR_RETURN(lhs, expr) \
  KVARENA_ASSIGN_OR_RETURN_IMPL_(KVARENA_STATUS_CONCAT_(_kvarena_statusor_, __LINE__), lhs, expr)
#define KVARENA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // KVARENA_BASE_STATUS_MACROS_H_
