// The disk store (tiers/disk_store.h): one file per chunk, an LRU by bytes that survives a
// reopen, atomic writes that leave nothing behind when they fail, and a directory it
// shares with nothing but the files it can name.
#include "tiers/disk_store.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_seed.h"
#include "tiers/chunk_files.h"
#include "tiers/store_test_util.h"

namespace kvarena {
namespace {

using ::kvarena::testing::IsOk;
using ::kvarena::testing::IsOkAndHolds;
using ::kvarena::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

class DiskStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    Open(300);
  }
  // A store over dir_ whose open (scan and trim) is done.
  void Open(uint64_t limit) {
    store_.reset();  // the directory's lock goes with it
    auto opened = std::make_shared<absl::Notification>();
    DiskStoreOptions options;
    options.bytes_limit = limit;
    options.on_opened = [this, opened](const DiskStoreOpenReport& r) {
      report_ = r;
      opened->Notify();
    };
    absl::StatusOr<std::unique_ptr<TierStore>> s = OpenDiskStore(dir_, std::move(options));
    ASSERT_THAT(s, IsOk());
    store_ = std::move(s).value();
    opened->WaitForNotification();
  }
  void Put(int i, size_t bytes, int version = 0) {
    std::vector<EvictedChunk> evicted;
    ASSERT_THAT(store_->Put(TestKey(i), TestValue(i, bytes, version), &evicted), IsOk());
    EXPECT_THAT(evicted, IsEmpty());  // the lowest local tier hands nothing on
  }
  absl::StatusOr<std::string> Get(int i) { return store_->Get(TestKey(i), absl::InfiniteFuture()); }
  std::string PathOf(int i) const {
    return dir_ + "/" + FanOutName(TestKey(i)) + "/" + ChunkFileName(TestKey(i));
  }
  // The keys (of 0..15) whose chunk files exist.
  std::vector<int> KeysOnDisk() const {
    std::vector<int> keys;
    for (int i = 0; i < 16; ++i) {
      if (std::filesystem::exists(PathOf(i))) keys.push_back(i);
    }
    return keys;
  }
  // Every regular file under the directory but its LOCK, relative to it.
  std::set<std::string> Files() const {
    std::set<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
      const std::string rel = std::filesystem::relative(e.path(), dir_).string();
      if (e.is_regular_file() && rel != "LOCK") files.insert(rel);
    }
    return files;
  }

  TempDir tmp_;
  const std::string dir_ = tmp_.path() + "/tiers/disk";  // made by the open, parents too
  std::unique_ptr<TierStore> store_;
  DiskStoreOpenReport report_;
};

TEST_F(DiskStoreTest, StoresEachChunkAsAFileNamedByItsKey) {
  EXPECT_EQ(store_->medium(), "disk");
  EXPECT_THAT(Get(1), StatusIs(absl::StatusCode::kNotFound));
  Put(1, 100);
  Put(2, 50);
  EXPECT_THAT(Get(1), IsOkAndHolds(TestValue(1, 100)));
  EXPECT_TRUE(store_->Contains(TestKey(2)));
  std::ifstream in(PathOf(1), std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), TestValue(1, 100));
  EXPECT_EQ(Files(),
            (std::set<std::string>{FanOutName(TestKey(1)) + "/" + ChunkFileName(TestKey(1)),
                                   FanOutName(TestKey(2)) + "/" + ChunkFileName(TestKey(2))}));
  EXPECT_EQ(ChunkFileName(TestKey(1)), TestKey(1).Hex() + ".kvc");
  const TierUsage u = store_->Usage();
  EXPECT_EQ(u.bytes_used, 150u);
  EXPECT_EQ(u.bytes_limit, 300u);
  EXPECT_EQ(u.chunks, 2);
}

TEST_F(DiskStoreTest, PutRemovesTheLeastRecentlyUsedFiles) {
  Put(1, 100);
  Put(2, 100);
  Put(3, 100);
  ASSERT_THAT(Get(1), IsOk());                // 2, 3, 1
  EXPECT_TRUE(store_->Contains(TestKey(2)));  // Contains does not refresh
  Put(4, 100);
  EXPECT_THAT(KeysOnDisk(), ElementsAre(1, 3, 4));
  Put(5, 150);  // 3, 1, 4: two must go
  EXPECT_THAT(KeysOnDisk(), ElementsAre(4, 5));
  EXPECT_EQ(store_->Usage().bytes_used, 250u);
  EXPECT_EQ(store_->Usage().chunks, 2);
}

TEST_F(DiskStoreTest, PutReplacesAKeysFile) {
  Put(1, 100);
  Put(2, 100);
  Put(1, 180, /*version=*/1);
  EXPECT_THAT(Get(1), IsOkAndHolds(TestValue(1, 180, 1)));
  EXPECT_EQ(store_->Usage().bytes_used, 280u);
  EXPECT_EQ(store_->Usage().chunks, 2);
  Put(3, 100);  // 2 is the oldest
  EXPECT_THAT(KeysOnDisk(), ElementsAre(1, 3));
}

TEST_F(DiskStoreTest, AValueBiggerThanTheLimitIsRefusedAndLeavesNoFile) {
  EXPECT_THAT(store_->Put(TestKey(1), std::string(301, 'x'), nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("301 bytes exceeds the limit of 300")));
  EXPECT_THAT(Files(), IsEmpty());
}

TEST_F(DiskStoreTest, EraseRemovesTheFile) {
  Put(1, 100);
  Put(2, 100);
  store_->Erase(TestKey(1));
  store_->Erase(TestKey(9));  // absent: nothing happens
  EXPECT_FALSE(store_->Contains(TestKey(1)));
  EXPECT_THAT(KeysOnDisk(), ElementsAre(2));
  EXPECT_EQ(store_->Usage().bytes_used, 100u);
}

TEST_F(DiskStoreTest, ACorruptFileIsReturnedAsItIsAndEraseRemovesIt) {
  Put(1, 100);
  Put(2, 100);
  std::string bad = TestValue(1, 100).substr(0, 40);
  bad[7] ^= 0x10;
  WriteFile(PathOf(1), bad);               // truncated and a bit flipped, behind the store's back
  EXPECT_THAT(Get(1), IsOkAndHolds(bad));  // verification is the caller's
  store_->Erase(TestKey(1));
  EXPECT_THAT(KeysOnDisk(), ElementsAre(2));
  EXPECT_THAT(Get(1), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(DiskStoreTest, AFileGrownPastTheLimitIsDataLossAndNotRead) {
  Put(1, 100);
  WriteFile(PathOf(1), std::string(301, 'x'));  // no store of this limit wrote it
  EXPECT_THAT(Get(1), StatusIs(absl::StatusCode::kDataLoss,
                               AllOf(HasSubstr(PathOf(1)), HasSubstr("301 bytes"))));
  store_->Erase(TestKey(1));
  EXPECT_THAT(KeysOnDisk(), IsEmpty());
}

TEST_F(DiskStoreTest, AFileRemovedBehindTheStoreIsAMissAndLeavesTheIndex) {
  Put(1, 100);
  ASSERT_EQ(unlink(PathOf(1).c_str()), 0);
  EXPECT_THAT(Get(1), StatusIs(absl::StatusCode::kNotFound, HasSubstr(PathOf(1))));
  EXPECT_FALSE(store_->Contains(TestKey(1)));
  EXPECT_EQ(store_->Usage().bytes_used, 0u);
}

TEST_F(DiskStoreTest, ReopenFindsWhatWasStoredInItsRecencyOrder) {
  Put(1, 100);
  Put(2, 100);
  Put(3, 100);
  ASSERT_THAT(Get(1), IsOk());  // 2, 3, 1 — the order the files' times keep
  Open(300);
  EXPECT_EQ(report_.chunks, 3);
  EXPECT_EQ(report_.bytes, 300u);
  EXPECT_EQ(report_.trimmed, 0);
  EXPECT_EQ(store_->Usage().chunks, 3);
  EXPECT_THAT(Get(3), IsOkAndHolds(TestValue(3, 100)));  // 2, 1, 3
  Put(4, 100);
  EXPECT_THAT(KeysOnDisk(), ElementsAre(1, 3, 4));
  Put(5, 100);
  EXPECT_THAT(KeysOnDisk(), ElementsAre(3, 4, 5));
}

TEST_F(DiskStoreTest, ReopenTrimsToASmallerLimitOldestFirst) {
  Put(1, 100);
  Put(2, 100);
  Put(3, 100);
  ASSERT_THAT(Get(1), IsOk());  // 2, 3, 1
  Open(150);
  EXPECT_EQ(report_.trimmed, 2);
  EXPECT_EQ(report_.chunks, 1);
  EXPECT_THAT(KeysOnDisk(), ElementsAre(1));
  EXPECT_EQ(store_->Usage().bytes_used, 100u);
}

TEST_F(DiskStoreTest, OpenRemovesTemporaryFilesAndLeavesForeignFilesAlone) {
  Put(1, 100);
  store_.reset();
  const std::string fan_out = dir_ + "/" + FanOutName(TestKey(1));
  const std::string temp = fan_out + "/" + TestKey(2).Hex() + ".kvc.tmp.4242.7";  // a killed write
  WriteFile(temp, "half a chunk");
  const std::vector<std::string> foreign = {
      dir_ + "/README",                                     // not in a fan-out directory
      dir_ + "/" + ChunkFileName(TestKey(3)),               // a chunk name at the top
      fan_out + "/notes.txt",                               // not a chunk name
      fan_out + "/" + ChunkFileName(TestKey(1)).substr(1),  // too short
      fan_out + "/" + ChunkFileName(TestKey(2)) + ".bak",
  };
  for (const std::string& f : foreign) WriteFile(f, "x");
  std::string upper = TestKey(4).Hex();
  for (char& c : upper) c = char(toupper(c));
  std::filesystem::create_directories(dir_ + "/" + FanOutName(TestKey(4)));
  WriteFile(dir_ + "/" + FanOutName(TestKey(4)) + "/" + upper + ".kvc", "x");  // not lowercase
  ASSERT_TRUE(std::filesystem::create_directories(dir_ + "/zz"));              // not hex
  ASSERT_TRUE(std::filesystem::create_directories(dir_ + "/lost+found"));
  Open(300);
  EXPECT_EQ(report_.temp_files_removed, 1);
  EXPECT_EQ(report_.foreign_files, 8);
  EXPECT_EQ(report_.chunks, 1);
  EXPECT_FALSE(std::filesystem::exists(temp));
  for (const std::string& f : foreign) EXPECT_TRUE(std::filesystem::exists(f)) << f;
  EXPECT_THAT(Get(1), IsOkAndHolds(TestValue(1, 100)));
  EXPECT_EQ(store_->Usage().bytes_used, 100u);
}

TEST_F(DiskStoreTest, AChunkFileInTheWrongFanOutDirectoryIsForeign) {
  store_.reset();
  std::string other = FanOutName(TestKey(1)) == "ff" ? "00" : "ff";
  ASSERT_TRUE(std::filesystem::create_directories(dir_ + "/" + other));
  WriteFile(dir_ + "/" + other + "/" + ChunkFileName(TestKey(1)), "x");
  Open(300);
  EXPECT_EQ(report_.foreign_files, 1);
  EXPECT_EQ(report_.chunks, 0);
}

TEST_F(DiskStoreTest, ADirectoryHasOneStoreAtATime) {
  EXPECT_THAT(OpenDiskStore(dir_, 300), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                 AllOf(HasSubstr(dir_), HasSubstr("LOCK"))));
  store_.reset();
  EXPECT_THAT(OpenDiskStore(dir_, 300), IsOk());
}

TEST_F(DiskStoreTest, OpenRefusesWhatCannotBeADirectory) {
  EXPECT_THAT(OpenDiskStore(dir_ + "/x", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes_limit is 0")));
  EXPECT_THAT(OpenDiskStore("", 300), StatusIs(absl::StatusCode::kInvalidArgument));
  const std::string file = tmp_.path() + "/a-file";
  WriteFile(file, "x");
  EXPECT_THAT(OpenDiskStore(file, 300),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(file), HasSubstr("Not a directory"))));
  EXPECT_THAT(OpenDiskStore(file + "/sub", 300),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(file + "/sub"), HasSubstr("Not a directory"))));
}

TEST_F(DiskStoreTest, OpenOfADirectoryThatCannotBeMadeIsFailedPrecondition) {
  // procfs makes no directories, for root either.
  EXPECT_THAT(
      OpenDiskStore("/proc/self/kvarena-tiers", 300),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/proc/self/kvarena-tiers")));
  if (geteuid() == 0) return;  // root writes into any directory
  const std::string locked = tmp_.path() + "/locked";
  ASSERT_EQ(mkdir(locked.c_str(), 0500), 0);
  EXPECT_THAT(OpenDiskStore(locked + "/disk", 300),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(locked + "/disk"), HasSubstr("Permission denied"))));
}

// A write the file system refuses (here EFBIG: a file-size limit, set in a child process
// so this one keeps none) is RESOURCE_EXHAUSTED, and leaves neither the chunk nor its
// temporary file.
TEST_F(DiskStoreTest, AFailedWriteIsResourceExhaustedAndLeavesNoFile) {
  Put(1, 100);
  store_.reset();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit = {64, 64};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(2);
    absl::Notification opened;
    DiskStoreOptions options;
    options.bytes_limit = 300;
    options.on_opened = [&opened](const DiskStoreOpenReport&) { opened.Notify(); };
    absl::StatusOr<std::unique_ptr<TierStore>> store = OpenDiskStore(dir_, std::move(options));
    if (!store.ok()) _exit(3);
    opened.WaitForNotification();  // else the Put is refused for that
    const absl::Status s = (*store)->Put(TestKey(2), TestValue(2, 200), nullptr);
    std::fprintf(stderr, "child: Put: %s\n", s.ToString().c_str());
    if (!absl::IsResourceExhausted(s)) _exit(4);
    if (s.message().find(dir_) == absl::string_view::npos) _exit(5);
    if ((*store)->Contains(TestKey(2)) || !(*store)->Contains(TestKey(1))) _exit(6);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's check that failed (see its stderr)";
  EXPECT_EQ(Files(),
            (std::set<std::string>{FanOutName(TestKey(1)) + "/" + ChunkFileName(TestKey(1))}));
  Open(300);
  EXPECT_EQ(report_.temp_files_removed, 0);
  EXPECT_EQ(report_.chunks, 1);
}

// Opening over many files with a limit far below them returns before any is removed; the
// trim runs on the store's thread, one file a step, and meanwhile Get serves what is
// indexed and Put is refused (a write the caller drops, as for a full tier).
TEST_F(DiskStoreTest, OpenReturnsAtOnceAndTrimsBehindIt) {
  constexpr int kFiles = 3000;
  constexpr size_t kBytes = 100;
  constexpr int kKeep = 20;
  store_.reset();
  for (int i = 0; i < kFiles; ++i) {  // key i is the i-th oldest
    std::filesystem::create_directories(dir_ + "/" + FanOutName(TestKey(i)));
    WriteFile(PathOf(i), TestValue(i, kBytes));
    const timeval times[2] = {{1000000 + i, 0}, {1000000 + i, 0}};
    ASSERT_EQ(utimes(PathOf(i).c_str(), times), 0);
  }
  const auto count_files = [&] { return int64_t(Files().size()); };

  absl::Notification trim_started, release, opened;
  std::atomic<bool> release_timed_out{false};
  std::atomic<int> steps{0};
  DiskStoreOpenReport report;
  DiskStoreOptions options;
  options.bytes_limit = kKeep * kBytes;
  options.TEST_before_trim_step = [&] {
    if (steps++ > 0) return;
    trim_started.Notify();
    // A guard, not a measurement: the test releases the trim at once after its checks.
    if (!release.WaitForNotificationWithTimeout(absl::Seconds(30))) release_timed_out = true;
  };
  options.on_opened = [&](const DiskStoreOpenReport& r) {
    report = r;
    opened.Notify();
  };
  absl::StatusOr<std::unique_ptr<TierStore>> s = OpenDiskStore(dir_, std::move(options));
  ASSERT_THAT(s, IsOk());
  store_ = std::move(s).value();
  trim_started.WaitForNotification();
  EXPECT_EQ(count_files(), kFiles);  // Open returned before the trim removed anything
  EXPECT_EQ(store_->Usage().chunks, kFiles);
  EXPECT_EQ(store_->Usage().bytes_used, kFiles * kBytes);
  EXPECT_THAT(Get(0), IsOkAndHolds(TestValue(0, kBytes)));  // the oldest, now the newest
  EXPECT_THAT(Get(kFiles - 1), IsOkAndHolds(TestValue(kFiles - 1, kBytes)));
  EXPECT_THAT(store_->Put(TestKey(kFiles), TestValue(kFiles, kBytes), nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr(dir_), HasSubstr(absl::StrCat(kFiles * kBytes, " bytes")),
                             HasSubstr(absl::StrCat("limit of ", kKeep * kBytes)))));
  EXPECT_FALSE(store_->Contains(TestKey(kFiles)));
  release.Notify();
  opened.WaitForNotification();
  EXPECT_FALSE(release_timed_out) << "the first trim step ran before Open returned";
  EXPECT_EQ(report.trimmed, kFiles - kKeep);
  EXPECT_EQ(steps, kFiles - kKeep);  // one file a step
  EXPECT_EQ(report.chunks, kKeep);
  EXPECT_EQ(report.bytes, kKeep * kBytes);
  EXPECT_EQ(store_->Usage().bytes_used, kKeep * kBytes);
  EXPECT_EQ(count_files(), kKeep);
  EXPECT_TRUE(store_->Contains(TestKey(0)));  // read during the trim: kept
  EXPECT_FALSE(store_->Contains(TestKey(1)));
  EXPECT_FALSE(std::filesystem::exists(PathOf(1)));
  EXPECT_TRUE(store_->Contains(TestKey(kFiles - 1)));
  Put(kFiles, kBytes);  // within the limit now: written, the oldest dropped for it
  EXPECT_EQ(store_->Usage().bytes_used, kKeep * kBytes);
  EXPECT_EQ(count_files(), kKeep);
}

// Links out of the directory: a fan-out directory or a chunk file replaced by a symbolic
// link (to a directory or file outside) is never followed, by any operation.
class DiskStoreLinkTest : public DiskStoreTest {
 protected:
  void SetUp() override {
    DiskStoreTest::SetUp();
    ASSERT_TRUE(std::filesystem::create_directories(outside_));
  }
  std::string FanOutOf(int i) const { return dir_ + "/" + FanOutName(TestKey(i)); }
  std::string OutsidePathOf(int i) const { return outside_ + "/" + ChunkFileName(TestKey(i)); }
  // Moves key i's fan-out directory away and puts a link to outside_ in its place.
  void LinkFanOutOutside(int i) {
    const std::string moved = tmp_.path() + "/moved-" + FanOutName(TestKey(i));
    ASSERT_EQ(rename(FanOutOf(i).c_str(), moved.c_str()), 0);
    ASSERT_EQ(symlink(outside_.c_str(), FanOutOf(i).c_str()), 0);
  }
  // The names in outside_, with their contents.
  std::set<std::string> Outside() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(outside_)) {
      std::ifstream in(e.path(), std::ios::binary);
      out.insert(e.path().filename().string() + "=" +
                 std::string(std::istreambuf_iterator<char>(in), {}));
    }
    return out;
  }
  int64_t MtimeOf(const std::string& path) const {
    struct stat st;
    return stat(path.c_str(), &st) == 0
               ? int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec
               : -1;
  }

  const std::string outside_ = tmp_.path() + "/outside";
};

TEST_F(DiskStoreLinkTest, PutDoesNotWriteThroughALinkedFanOutDirectory) {
  ASSERT_EQ(symlink(outside_.c_str(), FanOutOf(1).c_str()), 0);
  EXPECT_THAT(store_->Put(TestKey(1), TestValue(1, 100), nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(FanOutOf(1)), HasSubstr("symbolic link"))));
  EXPECT_THAT(Outside(), IsEmpty());
  EXPECT_FALSE(store_->Contains(TestKey(1)));
  EXPECT_EQ(store_->Usage().bytes_used, 0u);
}

TEST_F(DiskStoreLinkTest, GetDoesNotReadThroughALinkedFanOutDirectory) {
  Put(1, 100);
  LinkFanOutOutside(1);
  WriteFile(OutsidePathOf(1), TestValue(1, 100, /*version=*/1));  // valid-looking
  const int64_t mtime = MtimeOf(OutsidePathOf(1));
  EXPECT_THAT(Get(1), StatusIs(absl::StatusCode::kFailedPrecondition,
                               AllOf(HasSubstr(FanOutOf(1)), HasSubstr("symbolic link"))));
  EXPECT_EQ(MtimeOf(OutsidePathOf(1)), mtime);  // not even touched
  EXPECT_FALSE(store_->Contains(TestKey(1)));   // and no longer counted
  EXPECT_EQ(store_->Usage().bytes_used, 0u);
}

TEST_F(DiskStoreLinkTest, EraseAndEvictionDoNotUnlinkThroughALinkedFanOutDirectory) {
  Put(1, 100);
  Put(2, 100);
  Put(3, 100);
  LinkFanOutOutside(1);
  LinkFanOutOutside(2);
  WriteFile(OutsidePathOf(1), "outside one");
  WriteFile(OutsidePathOf(2), "outside two");
  store_->Erase(TestKey(1));
  const ChunkKey elsewhere{0xffull << 56, 7};  // in another fan-out directory
  for (int i : {1, 2, 3}) ASSERT_NE(FanOutName(elsewhere), FanOutName(TestKey(i)));
  EXPECT_THAT(store_->Put(elsewhere, TestValue(4, 150), nullptr), IsOk());  // evicts 2
  EXPECT_FALSE(store_->Contains(TestKey(2)));
  EXPECT_TRUE(store_->Contains(elsewhere));
  EXPECT_THAT(Outside(), (std::set<std::string>{ChunkFileName(TestKey(1)) + "=outside one",
                                                ChunkFileName(TestKey(2)) + "=outside two"}));
}

TEST_F(DiskStoreLinkTest, OpenDoesNotScanTrimOrCleanThroughALinkedFanOutDirectory) {
  Put(1, 100);
  store_.reset();
  LinkFanOutOutside(1);
  WriteFile(OutsidePathOf(1), TestValue(1, 100));
  const std::string temp = outside_ + "/" + TestKey(2).Hex() + ".kvc.tmp.4242.7";
  WriteFile(temp, "half a chunk");
  Open(50);  // anything it indexed would have to go
  EXPECT_EQ(report_.chunks, 0);
  EXPECT_EQ(report_.temp_files_removed, 0);
  EXPECT_EQ(report_.foreign_files, 1);
  EXPECT_EQ(Outside(), (std::set<std::string>{ChunkFileName(TestKey(1)) + "=" + TestValue(1, 100),
                                              TestKey(2).Hex() + ".kvc.tmp.4242.7=half a chunk"}));
}

TEST_F(DiskStoreLinkTest, ALinkedLockFileIsRefused) {
  store_.reset();
  ASSERT_EQ(unlink((dir_ + "/LOCK").c_str()), 0);  // the old store's LOCK was a file
  ASSERT_EQ(symlink((outside_ + "/LOCK").c_str(), (dir_ + "/LOCK").c_str()), 0);
  EXPECT_THAT(OpenDiskStore(dir_, 300),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(dir_ + "/LOCK"), HasSubstr("symbolic link"))));
  EXPECT_THAT(Outside(), IsEmpty());
}

TEST_F(DiskStoreLinkTest, ALinkedChunkFileIsNotReadNorFollowedOnDelete) {
  Put(1, 100);
  Put(2, 100);
  for (int i : {1, 2}) {
    WriteFile(OutsidePathOf(i), TestValue(i, 100, /*version=*/1));
    ASSERT_EQ(unlink(PathOf(i).c_str()), 0);
    ASSERT_EQ(symlink(OutsidePathOf(i).c_str(), PathOf(i).c_str()), 0);
  }
  const int64_t mtime = MtimeOf(OutsidePathOf(1));
  EXPECT_THAT(Get(1), StatusIs(absl::StatusCode::kFailedPrecondition,
                               AllOf(HasSubstr(PathOf(1)), HasSubstr("symbolic link"))));
  EXPECT_EQ(MtimeOf(OutsidePathOf(1)), mtime);
  EXPECT_FALSE(store_->Contains(TestKey(1)));
  store_->Erase(TestKey(2));  // the link goes, not what it names
  EXPECT_FALSE(std::filesystem::is_symlink(PathOf(2)));
  EXPECT_EQ(Outside(),
            (std::set<std::string>{ChunkFileName(TestKey(1)) + "=" + TestValue(1, 100, 1),
                                   ChunkFileName(TestKey(2)) + "=" + TestValue(2, 100, 1)}));
  Open(300);  // a link under a chunk's name is foreign
  EXPECT_EQ(report_.chunks, 0);
  EXPECT_EQ(report_.foreign_files, 1);
}

TEST_F(DiskStoreTest, ConcurrentGetsAndPutsSeeOnlyWholeFiles) {
  Open(4000);  // about a third of the 64 stress values
  const uint32_t seed = ::kvarena::testing::TestSeed();
  RunConcurrentStress(store_.get(), seed, 4, 64, 500);
  EXPECT_EQ(int64_t(Files().size()), store_->Usage().chunks);
  Open(4000);  // and the files are what the index said
  EXPECT_EQ(report_.chunks, int64_t(Files().size()));
  EXPECT_EQ(report_.temp_files_removed, 0);
  RunConcurrentStress(store_.get(), seed + 1000, 2, 64, 100);
}

}  // namespace
}  // namespace kvarena
