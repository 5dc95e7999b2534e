// Arithmetic on values that came off the wire, in one place: sums and products that
// report overflow instead of wrapping, and the short echo of a caller's string that
// messages may quote. Pure functions; thread-safe. (The byte size of a tensor, which
// needs the dtypes, is core/validate.h TensorBytes.)
#ifndef KVARENA_BASE_CHECKED_H_
#define KVARENA_BASE_CHECKED_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace kvarena {

// a + b, or nullopt when the exact result does not fit T.
template <class T>
[[nodiscard]] std::optional<T> CheckedAdd(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a * b, or nullopt when the exact result does not fit T.
template <class T>
[[nodiscard]] std::optional<T> CheckedMul(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or T's largest value when the exact result does not fit (a need no bound meets).
template <class T>
[[nodiscard]] T SaturatingAdd(T a, T b) {
  return CheckedAdd(a, b).value_or(std::numeric_limits<T>::max());
}

// A caller-supplied string as messages quote it: 'id' when at most 48 bytes, else its
// first 48 bytes and how long it was ('abc...'... (8192 bytes)). Bytes outside printable
// ASCII are escaped.
std::string Quoted(absl::string_view s);

}  // namespace kvarena

#endif  // KVARENA_BASE_CHECKED_H_
