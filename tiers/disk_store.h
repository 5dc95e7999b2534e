// The disk tier: chunks as files in a local directory, an LRU by bytes that survives a
// restart (docs/tiers.md). Each chunk is one file, <dir>/<ab>/<key hex>.kvc
// (tiers/chunk_files.h), written to a temporary name, fsync'd and renamed into place, so
// a process killed mid-write leaves at worst a temporary file, which the next open
// removes. Every file is reached through the directory held open, one component at a
// time, and a symbolic link below it is never followed: a fan-out directory or a chunk
// file that is a link is a miss, a refused write, or foreign at open.
//
// The open returns at once; the store's own thread then indexes the chunk files it finds
// (recency from their modification times, which Put and Get set) and trims them to the
// limit, oldest first. Until that is done a Get misses what is not indexed yet and a Put
// is RESOURCE_EXHAUSTED (dropped, as for a full tier), so the limit holds throughout.
//
// Put drops least recently used files to make room (the disk is the lowest local tier:
// nothing is handed on). Get returns a file's bytes as they are: verification is the
// caller's, who Erases a bad one. A directory belongs to one store at a time: the open
// store holds an flock on <dir>/LOCK.
//
// Thread-safe. Reads and writes of file contents happen outside the index lock; the
// rename or unlink that changes which files exist happens under it, so the index and
// the directory agree. Destroying the store stops and joins its thread.
#ifndef KVARENA_TIERS_DISK_STORE_H_
#define KVARENA_TIERS_DISK_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "core/tier_store.h"

namespace kvarena {

// What the open found in the directory, and what its trim removed.
struct DiskStoreOpenReport {
  int64_t chunks = 0;              // chunk files indexed, after trimming
  uint64_t bytes = 0;              // their bytes
  int64_t temp_files_removed = 0;  // left by a write that never finished
  int64_t foreign_files = 0;       // entries that are not chunk files: left alone
  int64_t trimmed = 0;             // chunk files removed to fit bytes_limit
};

struct DiskStoreOptions {
  // Bytes of chunk files (their sizes) the store may hold; more than 0.
  uint64_t bytes_limit = 0;
  // Where the files' stamps (their modification times) come from; outlives the store.
  Clock* clock = RealClock();
  // Called once, on the store's own thread, when the open's scan and trim are done, with
  // what they found and did; not called when the store goes first.
  std::function<void(const DiskStoreOpenReport&)> on_opened;
  // Test only: called on the store's thread, without its lock, before each file the
  // open's trim removes.
  std::function<void()> TEST_before_trim_step;
};

// A disk store over dir (created, with its parents, when missing). Medium "disk".
// INVALID_ARGUMENT when bytes_limit is 0, dir is empty or not a directory;
// FAILED_PRECONDITION when dir cannot be made or read, its LOCK is a symbolic link, or
// another open store holds it; each naming the path and the reason.
absl::StatusOr<std::unique_ptr<TierStore>> OpenDiskStore(const std::string& dir,
                                                         DiskStoreOptions options);
// The same with the default options and this limit.
absl::StatusOr<std::unique_ptr<TierStore>> OpenDiskStore(const std::string& dir,
                                                         uint64_t bytes_limit);

}  // namespace kvarena

#endif  // KVARENA_TIERS_DISK_STORE_H_
