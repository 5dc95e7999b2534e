#include "tiers/disk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "tiers/chunk_files.h"
#include "tiers/lru_index.h"

namespace kvarena {
namespace {

constexpr char kLockFileName[] = "LOCK";

// The bytes are in the file; the generation tells a file's entries apart across an
// Erase and a new Put of the same key.
struct OnDisk {
  uint64_t generation = 0;
};
using Index = LruIndex<OnDisk>;

using DirPtr = std::unique_ptr<DIR, int (*)(DIR*)>;

// A chunk file found at open.
struct Found {
  ChunkKey key;
  uint64_t bytes = 0;
  absl::Time mtime;
};

class DiskStore final : public TierStore {
 public:
  DiskStore(std::string dir, DiskStoreOptions options)
      : dir_(std::move(dir)), limit_(options.bytes_limit), options_(std::move(options)) {}
  ~DiskStore() override {
    stop_.store(true);
    if (opener_.joinable()) opener_.join();
  }

  // Opens the directory, takes its lock and starts the thread that indexes the chunk
  // files and trims them to the limit (OpenInBackground): work that does not grow with
  // the files there.
  absl::Status Open() {
    KVARENA_ASSIGN_OR_RETURN(root_, OpenTierDir(dir_));
    const std::string lock_path = root_.PathOf(kLockFileName);
    lock_ =
        Fd(openat(root_.fd.get(), kLockFileName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (lock_.get() < 0 && errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(
          "disk tier: ", lock_path, " is a symbolic link: not followed out of ", dir_));
    }
    if (lock_.get() < 0) return FileError(errno, "open", lock_path);
    if (flock(lock_.get(), LOCK_EX | LOCK_NB) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("disk tier: ", dir_,
                                                        " is in use by another store (flock of ",
                                                        lock_path, "): ", std::strerror(errno)));
    }
    DirPtr top = ListDir(root_);
    if (top == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("disk tier: cannot read directory ", dir_, ": ", std::strerror(errno)));
    }
    opener_ = std::thread([this, top = std::move(top)]() mutable { OpenInBackground(top.get()); });
    return absl::OkStatus();
  }

  std::string medium() const override { return "disk"; }

  absl::StatusOr<std::string> Get(const ChunkKey& key, absl::Time /*deadline*/) override {
    absl::Time stamp;
    uint64_t generation = 0;
    {
      absl::MutexLock lock(&mu_);
      Index::Entry* e = index_.Touch(key);
      if (e == nullptr) return absl::NotFoundError(absl::StrCat("disk tier: no chunk ", key.Hex()));
      generation = e->value.generation;
      stamp = NextStampLocked();
    }
    absl::StatusOr<DirFd> fan_out = OpenSubdir(root_, FanOutName(key), /*create=*/false);
    absl::StatusOr<std::string> value =
        fan_out.ok() ? ReadFileTouching(*fan_out, ChunkFileName(key), limit_, stamp)
                     : absl::StatusOr<std::string>(fan_out.status());
    // Removed behind the index's back, or replaced by a link or something else: no
    // longer a chunk this store holds.
    if (absl::IsNotFound(value.status()) || absl::IsFailedPrecondition(value.status())) {
      absl::MutexLock lock(&mu_);
      const Index::Entry* e = index_.Find(key);
      if (e != nullptr && e->value.generation == generation) index_.Erase(key);
      PublishLocked();
    }
    return value;
  }

  bool Contains(const ChunkKey& key) override {
    absl::MutexLock lock(&mu_);
    return index_.Contains(key);
  }

  absl::Status Put(const ChunkKey& key, absl::string_view value,
                   std::vector<EvictedChunk>* /*evicted: the lowest local tier*/) override {
    if (value.size() > limit_) {
      return absl::ResourceExhaustedError(absl::StrCat("disk tier: chunk ", key.Hex(), " of ",
                                                       value.size(), " bytes exceeds the limit of ",
                                                       limit_, " bytes"));
    }
    absl::Time stamp;
    uint64_t write = 0;
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kReady) return NotReadyLocked(key, value.size());
      stamp = NextStampLocked();
      write = ++writes_;
    }
    KVARENA_ASSIGN_OR_RETURN(const DirFd fan_out,
                             OpenSubdir(root_, FanOutName(key), /*create=*/true));
    const std::string name = ChunkFileName(key);
    const std::string temp = absl::StrCat(key.Hex(), kTempFileInfix, getpid(), ".", write);
    KVARENA_RETURN_IF_ERROR(WriteFileSynced(fan_out, temp, value, stamp));
    {
      absl::MutexLock lock(&mu_);
      if (renameat(fan_out.fd.get(), temp.c_str(), fan_out.fd.get(), name.c_str()) != 0) {
        const absl::Status s = FileError(
            errno, absl::StrCat("rename ", fan_out.PathOf(temp), " to"), fan_out.PathOf(name));
        unlinkat(fan_out.fd.get(), temp.c_str(), 0);
        return s;
      }
      index_.Erase(key);
      std::vector<Index::Entry> dropped;
      index_.MakeRoom(value.size(), limit_, &dropped);
      for (const Index::Entry& e : dropped) RemoveFileLocked(e.key);
      index_.Insert(key, OnDisk{++generation_}, value.size());
      PublishLocked();
    }
    SyncDir(fan_out);
    return absl::OkStatus();
  }

  void Erase(const ChunkKey& key) override {
    absl::MutexLock lock(&mu_);
    if (index_.Erase(key)) RemoveFileLocked(key);
    PublishLocked();
  }

  // Without mu_: Stats never waits behind a file-system call made under it (an unlink or
  // a rename on a hung mount).
  TierUsage Usage() const override {
    TierUsage u;
    u.bytes_used = used_bytes_.load(std::memory_order_relaxed);
    u.bytes_limit = limit_;
    u.chunks = used_chunks_.load(std::memory_order_relaxed);
    return u;
  }

 private:
  // Unlinks key's file, reached through its fan-out directory without following a link
  // (a fan-out directory that is not one any more holds nothing of this store's).
  // REQUIRES: mu_ held, so that the index and the directory agree.
  void RemoveFileLocked(const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::StatusOr<DirFd> fan_out = OpenSubdir(root_, FanOutName(key), /*create=*/false);
    if (fan_out.ok()) unlinkat(fan_out->fd.get(), ChunkFileName(key).c_str(), 0);
  }

  // Publishes the index's totals for Usage. REQUIRES: mu_ held, after each change.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    used_bytes_.store(index_.bytes(), std::memory_order_relaxed);
    used_chunks_.store(index_.size(), std::memory_order_relaxed);
  }

  // The modification time the next written or read file gets: now, but always later than
  // the last one given, so the order survives in the files even within a clock tick.
  absl::Time NextStampLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_stamp_ = std::max(options_.clock->Now(), last_stamp_ + absl::Nanoseconds(1));
    return last_stamp_;
  }

  // On the store's thread: indexes the chunk files (Scan) oldest first, then removes the
  // oldest until they fit the limit, one file a step under the lock, so that lookups go
  // on between steps and see an index that agrees with the directory. Put is refused
  // until then (NotReadyLocked). Stops early when the store goes.
  void OpenInBackground(DIR* top) {
    DiskStoreOpenReport report;
    std::vector<Found> found;
    Scan(top, &found, &report);
    std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
      return std::tie(a.mtime, a.key.high, a.key.low) < std::tie(b.mtime, b.key.high, b.key.low);
    });
    {
      absl::MutexLock lock(&mu_);
      for (const Found& f : found) {  // nothing else is indexed yet: Put waits for kReady
        index_.Insert(f.key, OnDisk{++generation_}, f.bytes);
        last_stamp_ = std::max(last_stamp_, f.mtime);
      }
      PublishLocked();
      phase_ = Phase::kTrimming;
    }
    found = {};
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (index_.bytes() <= limit_) break;
      }
      if (stop_.load()) return;
      if (options_.TEST_before_trim_step) options_.TEST_before_trim_step();
      absl::MutexLock lock(&mu_);
      if (index_.bytes() > limit_) {  // Gets may have dropped files meanwhile
        RemoveFileLocked(index_.PopOldest().key);
        PublishLocked();
        ++report.trimmed;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      phase_ = Phase::kReady;
      report.chunks = index_.size();
      report.bytes = index_.bytes();
    }
    if (options_.on_opened) options_.on_opened(report);
  }

  // Why a Put before the open's work is done is refused (the tier's bytes are not known
  // to fit the limit yet): RESOURCE_EXHAUSTED, a write the caller drops, as for a full tier.
  absl::Status NotReadyLocked(const ChunkKey& key, size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string why =
        phase_ == Phase::kScanning
            ? "is still being indexed"
            : absl::StrCat("holds ", index_.bytes(), " bytes, over its limit of ", limit_,
                           ", until the trim at open is done");
    return absl::ResourceExhaustedError(absl::StrCat(
        "disk tier: ", dir_, " ", why, ": chunk ", key.Hex(), " of ", bytes, " bytes not written"));
  }

  // Lists top (dir_): chunk files into *found, temporary files removed, the rest counted.
  // Each entry is looked up in its directory's descriptor, never followed as a link.
  void Scan(DIR* top, std::vector<Found>* found, DiskStoreOpenReport* report) {
    while (const dirent* d = readdir(top)) {
      if (stop_.load()) return;
      const absl::string_view name = d->d_name;
      if (name == "." || name == ".." || name == kLockFileName) continue;
      absl::StatusOr<DirFd> fan_out(absl::UnknownError(""));
      DirPtr files(nullptr, &closedir);
      if (!IsFanOutName(name) || !(fan_out = OpenSubdir(root_, name, /*create=*/false)).ok() ||
          (files = ListDir(*fan_out)) == nullptr) {
        ++report->foreign_files;
        continue;
      }
      while (const dirent* f = readdir(files.get())) {
        const std::string file = f->d_name;
        if (file == "." || file == "..") continue;
        const std::optional<ChunkKey> key = ParseChunkFileName(file);
        struct stat st;
        if (IsTempFileName(file) && unlinkat(fan_out->fd.get(), file.c_str(), 0) == 0) {
          ++report->temp_files_removed;
        } else if (key && FanOutName(*key) == name &&
                   fstatat(fan_out->fd.get(), file.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                   S_ISREG(st.st_mode)) {
          found->push_back(Found{*key, uint64_t(st.st_size), absl::TimeFromTimespec(st.st_mtim)});
        } else {
          ++report->foreign_files;
        }
      }
    }
  }

  // A listing of dir (through a descriptor of its own, so dir's is left as it is); null
  // with errno set on an error.
  static DirPtr ListDir(const DirFd& dir) {
    const int fd = openat(dir.fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return DirPtr(nullptr, &closedir);
    DIR* listing = fdopendir(fd);
    if (listing == nullptr) close(fd);
    return DirPtr(listing, &closedir);
  }

  const std::string dir_;
  const uint64_t limit_;
  const DiskStoreOptions options_;
  DirFd root_;  // dir_, held open: every file is reached through it
  Fd lock_;     // root_'s LOCK, flocked
  mutable absl::Mutex mu_;
  // Scanning: the open's thread lists the files, the index is empty. Trimming: indexed,
  // perhaps over the limit. Ready: within it, Put accepted.
  enum class Phase { kScanning, kTrimming, kReady };
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kScanning;
  Index index_ ABSL_GUARDED_BY(mu_);
  absl::Time last_stamp_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  // The index's bytes and chunks as of its last change (PublishLocked).
  std::atomic<uint64_t> used_bytes_{0};
  std::atomic<int64_t> used_chunks_{0};
  std::atomic<bool> stop_{false};  // the store is going: the open's thread returns
  std::thread opener_;             // OpenInBackground; last, so it starts after the rest
};

}  // namespace

absl::StatusOr<std::unique_ptr<TierStore>> OpenDiskStore(const std::string& dir,
                                                         DiskStoreOptions options) {
  if (options.bytes_limit == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk tier: bytes_limit is 0 for ", dir, ": nothing would fit"));
  }
  KVARENA_RETURN_IF_ERROR(MakeDirs(dir));
  auto store = std::make_unique<DiskStore>(dir, std::move(options));
  KVARENA_RETURN_IF_ERROR(store->Open());
  return store;
}

absl::StatusOr<std::unique_ptr<TierStore>> OpenDiskStore(const std::string& dir,
                                                         uint64_t bytes_limit) {
  DiskStoreOptions options;
  options.bytes_limit = bytes_limit;
  return OpenDiskStore(dir, std::move(options));
}

}  // namespace kvarena
