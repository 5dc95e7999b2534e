// ReadSmallFile: the whole of a file that is small by nature (a certificate, a key, a
// token), refusing one past max_bytes rather than reading it.
//
// Thread-safety: a pure function.
#ifndef KVARENA_BASE_SMALL_FILE_H_
#define KVARENA_BASE_SMALL_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace kvarena {

// The file's bytes. Errors name the path: errno's code and "PATH: cannot read: <strerror>",
// or INVALID_ARGUMENT "PATH: larger than max_bytes bytes".
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes);

}  // namespace kvarena

#endif  // KVARENA_BASE_SMALL_FILE_H_
