// kvarena_stress_worker: a model-worker stand-in for the stress tests. It connects to a
// kvarenad (Attach, fd socket, mapped pools), runs --threads threads of random operations
// (tests/stress/actor.h: every result checked against a float64 copy, K/V bit for bit) and
// reports what it did. Modes:
//
//   mixed    --ops operations per thread, then every cache checked; with --hold it prints
//            its caches' pages ("cache ID pool P pages ...") and "holding N caches", and
//            waits for SIGUSR1; then checks again, releases everything and reports.
//   fill     every thread appends into one pool until it has seen --exhaustions
//            RESOURCE_EXHAUSTED refusals (or --ops operations); RESOURCE_EXHAUSTED is the only
//            error allowed. Then as mixed with --hold.
//   victim   runs until killed, printing its phase: "phase attached" (connected: Attach
//            stream, fd socket, scratch mapping), "phase reserved" (a cache holding reserved
//            pages in a mapped pool), "phase running" (every thread past its first op).
//   survive  runs until the daemon goes away: every thread must then see UNAVAILABLE, its
//            handles is_valid() false and the client disconnected ("daemon gone"); it then
//            connects again (to a restarted daemon on the same address) and runs as mixed.
//
// stdout: the lines above, "report ops=N <op>=N ... errors=N <op>:<CODE>=N ... popn_refused=N"
// (survive prints "report_before_restart ..." first), "worker ok"; or "worker FAILED: why"
// and exit 1.

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "kvarena/client.h"
#include "tests/stress/actor.h"
#include "tests/support/worker_main.h"

ABSL_FLAG(std::string, address, kvarena::kDefaultAddress, "unix:PATH of the daemon");
ABSL_FLAG(uint64_t, seed, 1, "random seed (each thread derives its own)");
ABSL_FLAG(std::string, mode, "mixed", "mixed, fill, victim or survive");
ABSL_FLAG(int, threads, 8, "threads, each with its own caches");
ABSL_FLAG(int, ops, 100, "operations per thread (mixed, survive after the restart; cap for fill)");
ABSL_FLAG(int, exhaustions, 3, "fill: RESOURCE_EXHAUSTED refusals each thread waits for");
ABSL_FLAG(bool, inline_tensors, false, "send tensors inline instead of through shared slices");
ABSL_FLAG(bool, hold, false,
          "mixed: print the caches' pages and wait for SIGUSR1 before releasing");

namespace kvarena::stress {
namespace {

// How long the worker waits for something it needs (the client noticing the daemon is gone,
// a restarted daemon) before it fails. Only a failure guard.
constexpr absl::Duration kBound = absl::Seconds(60);

void Print(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

uint64_t ThreadSeed(uint64_t seed, int thread) {
  return seed * 0x9E3779B97F4A7C15ull + uint64_t(thread) + 1;
}

absl::StatusOr<std::shared_ptr<Client>> Connect() {
  ClientOptions options;
  options.client_name = absl::StrCat("stress-", absl::GetFlag(FLAGS_seed));
  options.num_threads = 1;  // as the tests' kvarenad --num_threads
  options.inline_tensors = absl::GetFlag(FLAGS_inline_tensors);
  options.connect_timeout = absl::Seconds(2);
  return Client::Connect(absl::GetFlag(FLAGS_address), options);
}

// The first error any thread hit, kept for the report.
class FirstError {
 public:
  void Note(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = s;
  }
  absl::Status Get() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status status_;
};

std::vector<std::unique_ptr<Actor>> MakeActors(const std::shared_ptr<Client>& client, uint64_t seed,
                                               const ActorOptions& options) {
  std::vector<std::unique_ptr<Actor>> actors;
  for (int t = 0; t < absl::GetFlag(FLAGS_threads); ++t) {
    actors.push_back(std::make_unique<Actor>(client, ThreadSeed(seed, t), options));
  }
  return actors;
}

// Runs body(actor) on one thread per actor and returns the first error.
absl::Status RunThreads(std::vector<std::unique_ptr<Actor>>& actors,
                        const std::function<absl::Status(Actor&)>& body) {
  FirstError error;
  std::vector<std::thread> threads;
  for (auto& a : actors) {
    threads.emplace_back([&error, &body, actor = a.get()] { error.Note(body(*actor)); });
  }
  for (std::thread& t : threads) t.join();
  return error.Get();
}

Tally Total(const std::vector<std::unique_ptr<Actor>>& actors) {
  Tally total;
  for (const auto& a : actors) total.Add(a->tally());
  return total;
}

// Checks every cache, optionally lists their pages and waits for SIGUSR1 (checking again
// after), releases everything and prints the report.
absl::Status Finish(std::vector<std::unique_ptr<Actor>>& actors, bool hold, const char* report) {
  for (auto& a : actors) {
    if (absl::Status s = a->VerifyAll(); !s.ok()) return s;
  }
  if (hold) {
    int caches = 0;
    for (auto& a : actors) {
      KVARENA_ASSIGN_OR_RETURN(auto lines, a->PageLines());
      for (const std::string& l : lines) Print(l);
      caches += int(lines.size());
    }
    testing::WaitForSigusr1(absl::StrCat("holding ", caches, " caches"));
    for (auto& a : actors) {
      if (absl::Status s = a->VerifyAll(); !s.ok()) return s;
    }
  }
  for (auto& a : actors) {
    if (absl::Status s = a->ReleaseAll(); !s.ok()) return s;
  }
  Print(absl::StrCat(report, " ", Total(actors).ToString()));
  return absl::OkStatus();
}

absl::Status RunOps(std::vector<std::unique_ptr<Actor>>& actors, int ops) {
  return RunThreads(actors, [ops](Actor& a) {
    for (int i = 0; i < ops; ++i) {
      if (absl::Status s = a.Step(); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

absl::Status Mixed(const std::shared_ptr<Client>& client, uint64_t seed) {
  auto actors = MakeActors(client, seed, ActorOptions{});
  if (absl::Status s = RunOps(actors, absl::GetFlag(FLAGS_ops)); !s.ok()) return s;
  return Finish(actors, absl::GetFlag(FLAGS_hold), "report");
}

absl::Status Fill(const std::shared_ptr<Client>& client, uint64_t seed) {
  ActorOptions options;
  options.fill = true;
  options.arena_may_fill = true;
  options.max_len = 1 << 20;  // grow until the arena is full
  auto actors = MakeActors(client, seed, options);
  const int exhaustions = absl::GetFlag(FLAGS_exhaustions), cap = absl::GetFlag(FLAGS_ops);
  absl::Status s = RunThreads(actors, [&](Actor& a) {
    for (int i = 0; i < cap && a.tally().exhausted() < exhaustions; ++i) {
      if (absl::Status step = a.Step(); !step.ok()) return step;
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return Finish(actors, /*hold=*/true, "report");
}

[[noreturn]] void Victim(const std::shared_ptr<Client>& client, uint64_t seed) {
  Print("phase attached");
  CacheSpec spec{2, 2, 16, DType::kFloat16, 16, {}, 0, ""};
  auto reserved = client->Allocate(spec);
  absl::Status s = reserved.status();
  if (s.ok()) {
    (*reserved)->set_reserve_ahead(64);
    s = (*reserved)->reserve(1);
  }
  if (!s.ok()) {
    Print(absl::StrCat("worker FAILED: ", s.ToString()));
    std::_Exit(1);
  }
  Print("phase reserved");
  auto actors = MakeActors(client, seed, ActorOptions{});
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (auto& a : actors) {
    threads.emplace_back([&started, &actors, actor = a.get()] {
      for (bool first = true;; first = false) {
        if (absl::Status s = actor->Step(); !s.ok()) {
          Print(absl::StrCat("worker FAILED: ", s.ToString()));
          std::_Exit(1);
        }
        if (first && started.fetch_add(1) + 1 == int(actors.size())) Print("phase running");
      }
    });
  }
  for (std::thread& t : threads) t.join();  // never: the test kills this process
  std::_Exit(1);
}

// After the daemon went away: the calls fail UNAVAILABLE, and the client and every handle
// say so (within kBound: the client learns it when its Attach stream breaks).
absl::Status ExpectGone(const std::shared_ptr<Client>& client, const Actor& actor) {
  const absl::Time deadline = absl::Now() + kBound;
  auto gone = [&] {
    for (const auto& h : actor.handles()) {
      if (h->is_valid()) return false;
    }
    return !client->connected();
  };
  while (!gone() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  if (!gone()) {
    return absl::InternalError(absl::StrCat("the daemon is gone but connected() = ",
                                            client->connected(), " or a handle is still valid"));
  }
  if (absl::Status s = client->Stats().status(); s.code() != absl::StatusCode::kUnavailable) {
    return absl::InternalError(absl::StrCat("Stats after the daemon went away: ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::Status Survive(const std::shared_ptr<Client>& client, uint64_t seed) {
  auto actors = MakeActors(client, seed, ActorOptions{});
  std::atomic<int> warm{0};
  absl::Status s = RunThreads(actors, [&](Actor& a) -> absl::Status {
    for (int i = 0;; ++i) {
      absl::Status step = a.Step();
      if (step.code() == absl::StatusCode::kUnavailable) return ExpectGone(client, a);
      if (!step.ok()) return step;
      if (i == 9 && warm.fetch_add(1) + 1 == int(actors.size())) Print("phase running");
    }
  });
  if (!s.ok()) return s;
  Print(absl::StrCat("daemon gone: ", actors.size(),
                     " threads saw UNAVAILABLE, every handle invalid, the client disconnected"));
  Print(absl::StrCat("report_before_restart ", Total(actors).ToString()));
  actors.clear();

  absl::StatusOr<std::shared_ptr<Client>> fresh = Connect();
  for (const absl::Time deadline = absl::Now() + kBound; !fresh.ok() && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
    fresh = Connect();
  }
  KVARENA_RETURN_IF_ERROR(fresh.status());
  if ((*fresh)->session_id() == client->session_id()) {
    return absl::InternalError("the new daemon gave the old session id");
  }
  Print("reconnected");
  auto again = MakeActors(*fresh, seed + 1, ActorOptions{});
  if (absl::Status r = RunOps(again, absl::GetFlag(FLAGS_ops)); !r.ok()) return r;
  return Finish(again, /*hold=*/false, "report");
}

absl::Status Run() {
  KVARENA_ASSIGN_OR_RETURN(auto client, Connect());
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "mixed") return Mixed(client, seed);
  if (mode == "fill") return Fill(client, seed);
  if (mode == "victim") Victim(client, seed);
  if (mode == "survive") return Survive(client, seed);
  return absl::InvalidArgumentError(absl::StrCat("--mode=", mode, " is not a mode"));
}

}  // namespace
}  // namespace kvarena::stress

int main(int argc, char** argv) {
  return kvarena::testing::WorkerMain(argc, argv, kvarena::stress::Run);
}
