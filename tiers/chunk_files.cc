#include "tiers/chunk_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

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

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) close(fd_);
}

std::string DirFd::PathOf(absl::string_view name) const { return absl::StrCat(path, "/", name); }

absl::StatusOr<DirFd> OpenTierDir(const std::string& dir) {
  Fd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier: cannot open directory ", dir, ": ", std::strerror(errno)));
  }
  return DirFd{std::move(fd), dir};
}

absl::StatusOr<DirFd> OpenSubdir(const DirFd& parent, absl::string_view name, bool create) {
  const std::string entry(name);
  const std::string path = parent.PathOf(name);
  if (create) {
    if (mkdirat(parent.fd.get(), entry.c_str(), 0755) == 0) {
      SyncDir(parent);  // the new directory's entry, so its files outlive a crash
    } else if (errno != EEXIST) {
      return FileError(errno, "create directory", path);
    }
  }
  Fd fd(openat(parent.fd.get(), entry.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() >= 0) return DirFd{std::move(fd), path};
  const int err = errno;
  if (err == ENOENT) return absl::NotFoundError(absl::StrCat("disk tier: no directory ", path));
  struct stat st;
  if ((err == ELOOP || err == ENOTDIR) &&
      fstatat(parent.fd.get(), entry.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier: ", path,
                     S_ISLNK(st.st_mode) ? " is a symbolic link: not followed out of "
                                         : " is not a directory in ",
                     parent.path));
  }
  return FileError(err, "open directory", path);
}

absl::Status WriteFileSynced(const DirFd& dir, const std::string& name, absl::string_view value,
                             absl::Time mtime) {
  const int fd = openat(dir.fd.get(), name.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, "create", dir.PathOf(name));
  const auto fail = [&](absl::string_view what) {
    const absl::Status s = FileError(errno, what, dir.PathOf(name));
    CloseKeepingErrno(fd);
    unlinkat(dir.fd.get(), name.c_str(), 0);
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
    const absl::Status s = FileError(errno, "close", dir.PathOf(name));
    unlinkat(dir.fd.get(), name.c_str(), 0);
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileTouching(const DirFd& dir, const std::string& name,
                                             uint64_t max_bytes, absl::Time mtime) {
  const std::string path = dir.PathOf(name);
  // O_NONBLOCK: a FIFO planted under a chunk's name must not hang the open.
  Fd fd(openat(dir.fd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat("disk tier: no file ", path));
  }
  if (fd.get() < 0 && errno == ELOOP) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier: ", path, " is a symbolic link: not followed out of ", dir.path));
  }
  if (fd.get() < 0) return FileError(errno, "open", path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return FileError(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier: ", path, " is not a regular file (mode ", st.st_mode, ")"));
  }
  if (uint64_t(st.st_size) > max_bytes) {
    return absl::DataLossError(absl::StrCat("disk tier: ", path, " holds ", st.st_size,
                                            " bytes, more than the limit of ", max_bytes));
  }
  std::string out(size_t(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FileError(errno, "read", path);
    if (n == 0) break;  // shorter than it was a moment ago: what is there
    done += size_t(n);
  }
  out.resize(done);
  const timespec times[2] = {{0, UTIME_OMIT}, absl::ToTimespec(mtime)};
  futimens(fd.get(), times);  // recency for the next start only: a failure loses nothing now
  return out;
}

void SyncDir(const DirFd& dir) { fsync(dir.fd.get()); }

}  // namespace kvarena
