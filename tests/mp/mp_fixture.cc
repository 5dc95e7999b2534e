#include "tests/mp/mp_fixture.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvarena::testing {

bool CommandResult::exited_ok() const {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout) {
  Subprocess p;
  if (auto s = p.Start(argv); !s.ok()) return s;
  auto status = p.Wait(timeout);
  if (!status.ok()) return status.status();  // the destructor kills it
  CommandResult r;
  r.wait_status = *status;
  r.output = p.output();
  return r;
}

void MultiProcessTest::SetUp() {
  char tmpl[] = "/tmp/kvarena_mp_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  dir_ = tmpl;
  socket_path_ = dir_ + "/kvarena.sock";
}

void MultiProcessTest::TearDown() {
  observer_.reset();
  // A failed test shows what the daemon said (a crash, a sanitizer report).
  if (HasFailure() && daemon_ != nullptr)
    fprintf(stderr, "kvarenad output:\n%s\n", daemon_->output().c_str());
  if (daemon_ != nullptr && daemon_->running()) {
    // The restart test checks a clean SIGTERM exit; here a slow one only costs time.
    daemon_->Signal(SIGTERM);
    if (!daemon_->Wait(absl::Seconds(3)).ok()) {
      fprintf(stderr, "note: kvarenad still running 3s after SIGTERM; killing it\n");
      daemon_->Signal(SIGKILL);
    }
  }
  daemon_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

CacheSpec MultiProcessTest::SmallSpec() {
  CacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.dtype = DType::kFloat32;
  return spec;
}

void MultiProcessTest::StartDaemon(const std::string& session_grace, const std::string& backend) {
  StartDaemonWith({"--backend=" + backend, "--session_grace=" + session_grace});
}

void MultiProcessTest::StartDaemonWith(const std::vector<std::string>& flags) {
  observer_.reset();
  daemon_ = std::make_unique<Subprocess>();
  std::vector<std::string> argv = {
      KVARENAD_PATH,    "--listen=" + address(), "--backend=host",   "--arena_bytes=256Mi",
      "--page_size=16", "--session_grace=1s",    "--metrics_port=0", "--num_threads=1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  ASSERT_TRUE(daemon_->Start(argv).ok());
  ClientOptions options;
  options.attach = false;
  options.call_timeout = absl::Seconds(2);
  const absl::Time deadline = absl::Now() + kEventBound;
  while (absl::Now() < deadline) {
    auto c = Client::Connect(address(), options);
    if (c.ok()) {
      auto h = (*c)->Health();
      if (h.ok() && *h == ServingStatus::kServing) return;
    }
    if (!daemon_->running() || daemon_->Wait(absl::ZeroDuration()).ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  FAIL() << "kvarenad did not become SERVING at " << address() << "; output:\n"
         << daemon_->output();
}

std::unique_ptr<Subprocess> MultiProcessTest::StartProgram(const std::string& path,
                                                           const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {path, "--address=" + address()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto p = std::make_unique<Subprocess>();
  EXPECT_TRUE(p->Start(argv).ok());
  return p;
}

std::unique_ptr<Subprocess> MultiProcessTest::StartWorker(uint64_t index,
                                                          const std::vector<std::string>& flags) {
  std::vector<std::string> all = {absl::StrCat("--seed=", uint64_t{seed_} + index)};
  all.insert(all.end(), flags.begin(), flags.end());
  return StartProgram(KVARENA_WORKER_PATH, all);
}

void MultiProcessTest::ExpectExitsOk(Subprocess& p, const std::string& name,
                                     absl::Duration timeout) {
  auto status = p.Wait(timeout);
  ASSERT_TRUE(status.ok()) << name << ": " << status.status() << "\noutput:\n" << p.output();
  EXPECT_EQ(DescribeWaitStatus(*status), "exit 0") << name << " output:\n" << p.output();
}

std::shared_ptr<Client> MultiProcessTest::Observer() {
  if (observer_ == nullptr) {
    ClientOptions options;
    options.attach = false;
    options.client_name = "mp_test-observer";
    auto c = Client::Connect(address(), options);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) observer_ = *c;
  }
  return observer_;
}

int64_t MultiProcessTest::WaitForArenaPages(const std::function<bool(int64_t)>& pred,
                                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int64_t pages = -1;
  for (;;) {
    auto st = Observer()->Stats();
    if (st.ok()) {
      pages = st->pages.pages_used;
      if (pred(pages)) return pages;
    }
    if (absl::Now() > deadline) return pages;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

bool MultiProcessTest::WaitForArena(const std::function<bool(const ArenaStats&)>& done,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    auto st = Observer()->Stats();
    if (st.ok() && done(*st)) return true;
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace kvarena::testing
