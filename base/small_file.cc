#include "base/small_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvarena {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  const auto fail = [&](int err) {
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat(path, ": cannot read: ", std::strerror(err)));
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errno);
  std::string out;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fd, buf, sizeof(buf))) > 0 && out.size() <= max_bytes) {
    out.append(buf, size_t(n));
  }
  const int err = errno;
  close(fd);
  if (n < 0) return fail(err);
  if (out.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than ", max_bytes, " bytes"));
  }
  return out;
}

}  // namespace kvarena
