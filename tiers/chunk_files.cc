#include "tiers/chunk_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvarena {
namespace {

constexpr size_t kHexDigits = 32;

bool IsLowerHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isdigit(c) && (c < 'a' || c > 'f')) return false;
  }
  return true;
}

// Closes fd, keeping errno as it was.
void CloseKeepingErrno(int fd) {
  const int saved = errno;
  close(fd);
  errno = saved;
}

}  // namespace

std::string FanOutName(const ChunkKey& key) { return key.Hex().substr(0, 2); }

bool IsFanOutName(absl::string_view name) { return name.size() == 2 && IsLowerHex(name); }

std::string ChunkFileName(const ChunkKey& key) { return absl::StrCat(key.Hex(), kChunkFileSuffix); }

std::optional<ChunkKey> ParseChunkFileName(absl::string_view name) {
  if (name.size() != kHexDigits + kChunkFileSuffix.size() ||
      !absl::EndsWith(name, kChunkFileSuffix) || !IsLowerHex(name.substr(0, kHexDigits))) {
    return std::nullopt;
  }
  ChunkKey key;
  if (!absl::SimpleHexAtoi(name.substr(0, 16), &key.high) ||
      !absl::SimpleHexAtoi(name.substr(16, 16), &key.low)) {
    return std::nullopt;
  }
  return key;
}

bool IsTempFileName(absl::string_view name) {
  return name.size() > kHexDigits + kTempFileInfix.size() &&
         IsLowerHex(name.substr(0, kHexDigits)) &&
         name.substr(kHexDigits, kTempFileInfix.size()) == kTempFileInfix;
}

absl::Status FileError(int err, absl::string_view what, absl::string_view path) {
  const std::string message =
      absl::StrCat("disk tier: cannot ", what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("disk tier: the directory is empty");
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string part = dir.substr(0, end);
    if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      const int err = errno;
      const std::string message = absl::StrCat("disk tier: cannot create directory ", part,
                                               " (for ", dir, "): ", std::strerror(err));
      if (err == ENOTDIR) return absl::InvalidArgumentError(message);
      return absl::FailedPreconditionError(message);
    }
    if (end == std::string::npos) break;
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier: cannot stat ", dir, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk tier: ", dir, " is not a directory: ", std::strerror(ENOTDIR)));
  }
  return absl::OkStatus();
}

absl::Status WriteFileSynced(const std::string& path, absl::string_view value, absl::Time mtime) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, "create", path);
  const auto fail = [&](absl::string_view what) {
    const absl::Status s = FileError(errno, what, path);
    CloseKeepingErrno(fd);
    unlink(path.c_str());
    return s;
  };
  for (size_t done = 0; done < value.size();) {
    const ssize_t n = write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write");
    done += size_t(n);
  }
  const timespec times[2] = {{0, UTIME_OMIT}, absl::ToTimespec(mtime)};
  if (futimens(fd, times) != 0) return fail("set the modification time of");
  if (fsync(fd) != 0) return fail("fsync");
  if (close(fd) != 0) {
    const absl::Status s = FileError(errno, "close", path);
    unlink(path.c_str());
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileTouching(const std::string& path, uint64_t max_bytes,
                                             absl::Time mtime) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT)
    return absl::NotFoundError(absl::StrCat("disk tier: no file ", path));
  if (fd < 0) return FileError(errno, "open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const absl::Status s = FileError(errno, "stat", path);
    close(fd);
    return s;
  }
  if (uint64_t(st.st_size) > max_bytes) {
    close(fd);
    return absl::DataLossError(absl::StrCat("disk tier: ", path, " holds ", st.st_size,
                                            " bytes, more than the limit of ", max_bytes));
  }
  std::string out(size_t(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const absl::Status s = FileError(errno, "read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;  // shorter than it was a moment ago: what is there
    done += size_t(n);
  }
  out.resize(done);
  const timespec times[2] = {{0, UTIME_OMIT}, absl::ToTimespec(mtime)};
  futimens(fd, times);  // recency for the next start only: a failure loses nothing now
  close(fd);
  return out;
}

void SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

}  // namespace kvarena
