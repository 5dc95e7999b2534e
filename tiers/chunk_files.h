// The disk tier's files (docs/tiers.md): how a chunk's file is named, written atomically
// and read back, in POSIX calls, apart from the store's index (tiers/disk_store.h).
//
//   <dir>/<first two hex digits of the key>/<32 hex digits of the key>.kvc
//   <dir>/<ab>/<32 hex digits>.kvc.tmp.<pid>.<n>     (a file being written)
//
// Every file is reached through its directory's descriptor, one component at a time,
// with links never followed (DirFd). Functions over the file system; thread-safe.
#ifndef KVARENA_TIERS_CHUNK_FILES_H_
#define KVARENA_TIERS_CHUNK_FILES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/tier_store.h"

namespace kvarena {

inline constexpr absl::string_view kChunkFileSuffix = ".kvc";
inline constexpr absl::string_view kTempFileInfix = ".kvc.tmp.";

// "ab": the fan-out directory of key (its first two hex digits).
std::string FanOutName(const ChunkKey& key);
// Whether name is a fan-out directory's (two lowercase hex digits).
bool IsFanOutName(absl::string_view name);
// "<hex>.kvc".
std::string ChunkFileName(const ChunkKey& key);
// The key a chunk file's name spells; nullopt for any other name.
std::optional<ChunkKey> ParseChunkFileName(absl::string_view name);
// Whether name is a temporary file this store writes ("<hex>.kvc.tmp.<...>").
bool IsTempFileName(absl::string_view name);

// A failed call as a status naming what and where: RESOURCE_EXHAUSTED for no space
// (ENOSPC, EDQUOT, EFBIG), else INTERNAL.
absl::Status FileError(int err, absl::string_view what, absl::string_view path);

// Creates dir and its missing parents. INVALID_ARGUMENT when dir is empty or a path on
// the way is not a directory; FAILED_PRECONDITION when it cannot be made (permissions, a
// read-only file system).
absl::Status MakeDirs(const std::string& dir);

// An owned file descriptor (-1: none), closed when it goes. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// A directory held open, and its path (for messages only). Every call below names an
// entry of one: a single path component, looked up in that directory and never followed
// when it is a symbolic link, so nothing reaches outside the directory whatever is
// renamed or linked in it meanwhile.
struct DirFd {
  Fd fd;
  std::string path;

  std::string PathOf(absl::string_view name) const;
};

// The tier's own directory, opened once (a link in dir itself is the operator's choice
// and followed). FAILED_PRECONDITION when it cannot be opened as a directory.
absl::StatusOr<DirFd> OpenTierDir(const std::string& dir);

// The subdirectory `name` of parent, made (and parent fsync'd, so it outlives a crash)
// when missing and create. NOT_FOUND when missing and !create; FAILED_PRECONDITION when
// it is a symbolic link (not followed) or not a directory; INTERNAL for other errors;
// each naming the path.
absl::StatusOr<DirFd> OpenSubdir(const DirFd& parent, absl::string_view name, bool create);

// Writes value to a new file `name` in dir (which must not exist), with modification time
// mtime, and fsyncs it. On an error nothing is left under name.
absl::Status WriteFileSynced(const DirFd& dir, const std::string& name, absl::string_view value,
                             absl::Time mtime);

// The whole file `name` in dir, whose modification time then becomes mtime (its recency
// for the next start). NOT_FOUND when there is none; FAILED_PRECONDITION when it is a
// symbolic link (not followed) or not a regular file; DATA_LOSS when it is larger than
// max_bytes (no store wrote it).
absl::StatusOr<std::string> ReadFileTouching(const DirFd& dir, const std::string& name,
                                             uint64_t max_bytes, absl::Time mtime);

// fsync of a directory, so the renames and unlinks in it survive a crash of the machine.
// Best effort: the store holds what it holds whether or not this reaches the disk.
void SyncDir(const DirFd& dir);

}  // namespace kvarena

#endif  // KVARENA_TIERS_CHUNK_FILES_H_
