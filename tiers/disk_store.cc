#include "tiers/disk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"
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
  DiskStore(std::string dir, uint64_t bytes_limit) : dir_(std::move(dir)), limit_(bytes_limit) {}
  ~DiskStore() override {
    if (lock_fd_ >= 0) close(lock_fd_);
  }

  // Takes the directory's lock, removes temporary files, indexes the chunk files and
  // trims them to the limit.
  absl::Status Open(DiskStoreOpenReport* report) {
    *report = DiskStoreOpenReport{};
    const std::string lock_path = absl::StrCat(dir_, "/", kLockFileName);
    lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) return FileError(errno, "open", lock_path);
    if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("disk tier: ", dir_,
                                                        " is in use by another store (flock of ",
                                                        lock_path, "): ", std::strerror(errno)));
    }
    std::vector<Found> found;
    KVARENA_RETURN_IF_ERROR(Scan(&found, report));
    std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
      return std::tie(a.mtime, a.key.high, a.key.low) < std::tie(b.mtime, b.key.high, b.key.low);
    });
    absl::MutexLock lock(&mu_);
    for (const Found& f : found) {
      index_.Insert(f.key, OnDisk{++generation_}, f.bytes);
      last_stamp_ = std::max(last_stamp_, f.mtime);
    }
    while (index_.bytes() > limit_) {
      unlink(PathOf(index_.PopOldest().key).c_str());
      ++report->trimmed;
    }
    report->chunks = index_.size();
    report->bytes = index_.bytes();
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
    absl::StatusOr<std::string> value = ReadFileTouching(PathOf(key), limit_, stamp);
    if (absl::IsNotFound(value.status())) {  // removed behind the index's back
      absl::MutexLock lock(&mu_);
      const Index::Entry* e = index_.Find(key);
      if (e != nullptr && e->value.generation == generation) index_.Erase(key);
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
      stamp = NextStampLocked();
      write = ++writes_;
    }
    const std::string fan_out = absl::StrCat(dir_, "/", FanOutName(key));
    if (mkdir(fan_out.c_str(), 0755) == 0) {
      SyncDir(dir_);  // the new directory's entry, so its files outlive a crash
    } else if (errno != EEXIST) {
      return FileError(errno, "create directory", fan_out);
    }
    const std::string path = PathOf(key);
    const std::string temp =
        absl::StrCat(fan_out, "/", key.Hex(), kTempFileInfix, getpid(), ".", write);
    KVARENA_RETURN_IF_ERROR(WriteFileSynced(temp, value, stamp));
    {
      absl::MutexLock lock(&mu_);
      if (rename(temp.c_str(), path.c_str()) != 0) {
        const absl::Status s = FileError(errno, absl::StrCat("rename ", temp, " to"), path);
        unlink(temp.c_str());
        return s;
      }
      index_.Erase(key);
      std::vector<Index::Entry> dropped;
      index_.MakeRoom(value.size(), limit_, &dropped);
      for (const Index::Entry& e : dropped) unlink(PathOf(e.key).c_str());
      index_.Insert(key, OnDisk{++generation_}, value.size());
    }
    SyncDir(fan_out);
    return absl::OkStatus();
  }

  void Erase(const ChunkKey& key) override {
    absl::MutexLock lock(&mu_);
    if (index_.Erase(key)) unlink(PathOf(key).c_str());
  }

  TierUsage Usage() const override {
    absl::MutexLock lock(&mu_);
    return index_.Usage(limit_);
  }

 private:
  std::string PathOf(const ChunkKey& key) const {
    return absl::StrCat(dir_, "/", FanOutName(key), "/", ChunkFileName(key));
  }

  // The modification time the next written or read file gets: now, but always later than
  // the last one given, so the order survives in the files even within a clock tick.
  absl::Time NextStampLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_stamp_ = std::max(absl::Now(), last_stamp_ + absl::Nanoseconds(1));
    return last_stamp_;
  }

  // Lists dir_: chunk files into *found, temporary files removed, the rest counted.
  absl::Status Scan(std::vector<Found>* found, DiskStoreOpenReport* report) {
    DirPtr top(opendir(dir_.c_str()), &closedir);
    if (top == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("disk tier: cannot read directory ", dir_, ": ", std::strerror(errno)));
    }
    while (const dirent* d = readdir(top.get())) {
      const absl::string_view name = d->d_name;
      if (name == "." || name == ".." || name == kLockFileName) continue;
      const std::string sub = absl::StrCat(dir_, "/", name);
      struct stat st;
      DirPtr fan_out(nullptr, &closedir);
      if (!IsFanOutName(name) || lstat(sub.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
          (fan_out = DirPtr(opendir(sub.c_str()), &closedir)) == nullptr) {
        ++report->foreign_files;
        continue;
      }
      while (const dirent* f = readdir(fan_out.get())) {
        const absl::string_view file = f->d_name;
        if (file == "." || file == "..") continue;
        const std::string path = absl::StrCat(sub, "/", file);
        const std::optional<ChunkKey> key = ParseChunkFileName(file);
        if (IsTempFileName(file) && unlink(path.c_str()) == 0) {
          ++report->temp_files_removed;
        } else if (key && FanOutName(*key) == name && lstat(path.c_str(), &st) == 0 &&
                   S_ISREG(st.st_mode)) {
          found->push_back(Found{*key, uint64_t(st.st_size), absl::TimeFromTimespec(st.st_mtim)});
        } else {
          ++report->foreign_files;
        }
      }
    }
    return absl::OkStatus();
  }

  const std::string dir_;
  const uint64_t limit_;
  int lock_fd_ = -1;
  mutable absl::Mutex mu_;
  Index index_ ABSL_GUARDED_BY(mu_);
  absl::Time last_stamp_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TierStore>> OpenDiskStore(const std::string& dir,
                                                         uint64_t bytes_limit,
                                                         DiskStoreOpenReport* report) {
  if (bytes_limit == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk tier: bytes_limit is 0 for ", dir, ": nothing would fit"));
  }
  KVARENA_RETURN_IF_ERROR(MakeDirs(dir));
  DiskStoreOpenReport ignored;
  auto store = std::make_unique<DiskStore>(dir, bytes_limit);
  KVARENA_RETURN_IF_ERROR(store->Open(report != nullptr ? report : &ignored));
  return store;
}

}  // namespace kvarena
