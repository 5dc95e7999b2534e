// KVARENA_RETURN_IF_ERROR(expr): returns the absl::Status that expr evaluates to, unless it
// is OK, so error paths stay one line (absl's and TensorFlow's macro of the same shape).
#ifndef KVARENA_CORE_STATUS_MACROS_H_
#define KVARENA_CORE_STATUS_MACROS_H_

#include "absl/status/status.h"

#define KVARENA_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    if (::absl::Status _kvarena_status = (expr);      \
        !_kvarena_status.ok()) {                      \
      return _kvarena_status;                         \
    }                                                 \
  } while (0)

#endif  // KVARENA_CORE_STATUS_MACROS_H_
