// The disk tier's files (docs/tiers.md): how a chunk's file is named, written atomically
// and read back, in POSIX calls, apart from the store's index (tiers/disk_store.h).
//
//   <dir>/<first two hex digits of the key>/<32 hex digits of the key>.kvc
//   <dir>/<ab>/<32 hex digits>.kvc.tmp.<pid>.<n>     (a file being written)
//
// Pure functions over the file system; thread-safe.
#ifndef KVARENA_TIERS_CHUNK_FILES_H_
#define KVARENA_TIERS_CHUNK_FILES_H_

#include <cstdint>
#include <optional>
#include <string>

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

// Writes value to a new file at path (which must not exist), with modification time
// mtime, and fsyncs it. On an error nothing is left at path.
absl::Status WriteFileSynced(const std::string& path, absl::string_view value, absl::Time mtime);

// The whole file at path, whose modification time then becomes mtime (its recency for
// the next start). NOT_FOUND when there is none; DATA_LOSS when it is larger than
// max_bytes (no store wrote it).
absl::StatusOr<std::string> ReadFileTouching(const std::string& path, uint64_t max_bytes,
                                             absl::Time mtime);

// fsync of a directory, so the renames and unlinks in it survive a crash of the machine.
// Best effort: the store holds what it holds whether or not this reaches the disk.
void SyncDir(const std::string& dir);

}  // namespace kvarena

#endif  // KVARENA_TIERS_CHUNK_FILES_H_
