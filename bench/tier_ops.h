// What a benchmark of the tiers below the arena (docs/tiers.md) does to a kvarenad: a tier's
// Stats, waiting for its writes, filling the arena so that a prefix is evicted into them,
// dropping the disk tier's files from the OS page cache, and what the tiers read (Stats and
// kvarena_tier_duration_seconds on /metrics). Header-only; thread-compatible.
#ifndef KVARENA_BENCH_TIER_OPS_H_
#define KVARENA_BENCH_TIER_OPS_H_

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/loopback.h"
#include "bench/prefix_workload.h"

namespace kvarena {

// Minor page faults process pid took so far (/proc/PID/stat, field 10: minflt, every thread
// of it, live or gone); -1 when unreadable.
inline int64_t MinorFaults(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t comm_end = stat.rfind(')');  // the command name may hold spaces
  if (comm_end == std::string::npos) return -1;
  std::istringstream fields(stat.substr(comm_end + 2));
  std::string field;
  for (int i = 3; i <= 10 && fields >> field; ++i) {  // state is field 3
    if (i == 10) return std::atoll(field.c_str());
  }
  return -1;
}

// Payload bytes of one position over every layer, K and V.
inline double PositionBytes(const Workload& w) {
  PageLayout l;
  l.dtype = w.dtype;
  l.kv_format = w.kv_format;
  l.num_kv_heads = w.kv_heads;
  l.head_dim = w.head_dim;
  return 2.0 * w.layers * double(l.TokenBytes());  // a quantized format's scales included
}

// Pages a chunk holds by default (DefaultChunkPages): the fewest whose K/V over every
// layer make at least 256 KiB.
inline int ChunkPages(const Workload& w) {
  const double page = PositionBytes(w) * w.page_size;
  return std::max(1, int((256.0 * 1024 + page - 1) / page));
}

// A chunk's value size as docs/tiers.md lays it out (namespace "bench", no tenant).
inline int64_t ChunkValueBytes(const Workload& w) {
  const int64_t positions = int64_t(ChunkPages(w)) * w.page_size;
  // magic, version, 8 x u32 (representation, geometry, P), scales_digest, first_block,
  // tenant, namespace "bench", two hashes; tokens, first_page; payload; checksum.
  return 8 + 4 + 8 * 4 + 8 + 8 + 4 + 4 + 5 + 32 + 4 * positions + 4 * w.layers +
         int64_t(PositionBytes(w)) * positions + 8;
}

// The Stats of the tier of `medium`.
inline absl::StatusOr<TierStats> Tier(Client& client, const std::string& medium) {
  KVARENA_ASSIGN_OR_RETURN(ArenaStats stats, client.Stats());
  for (const TierStats& t : stats.tiers) {
    if (t.medium == medium) return t;
  }
  return absl::NotFoundError(absl::StrCat("no tier ", medium, " in Stats"));
}

// Waits (up to 60 s) until the tier of `medium` has stored at least `chunks` chunks and its
// writes settled (stored and dropped unchanged for 200 ms): no write runs during a sample.
inline absl::Status WaitStored(Client& client, const std::string& medium, int64_t chunks) {
  uint64_t last = ~0ull;
  int stable = 0;
  TierStats t;
  for (int i = 0; i < 1200; ++i) {
    KVARENA_ASSIGN_OR_RETURN(t, Tier(client, medium));
    const uint64_t seen = t.stored_chunks + t.dropped_writes;
    stable = seen == last ? stable + 1 : 0;
    last = seen;
    if (int64_t(t.stored_chunks) >= chunks && stable >= 4) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("tier ", medium, " stored ", t.stored_chunks, " chunks in 60 s, want ", chunks,
                   " (up ", t.up, ", dropped ", t.dropped_writes, ", errors ", t.errors, ")"));
}

// Fills the arena with a namespace-less cache until it has no page left, then releases it:
// every cached page of a prefix is reclaimed (and written back to the tiers below).
inline absl::Status Pressure(Client& client, const Workload& w, const Noise& noise) {
  KVARENA_ASSIGN_OR_RETURN(auto filler, client.Allocate(WorkloadSpec(w, "")));
  // 256 tokens a step, then a page a step: an append takes all its pages or none, so a
  // few cached pages would outlive a refused 256-token step (int8 pools, whose chunks of
  // 63 pages leave other remainders than float16's 32).
  for (int64_t step : {int64_t{256}, int64_t{w.page_size}}) {
    for (bool full = false; !full;) {
      for (int l = 0; l < w.layers && !full; ++l) {
        auto r = filler->append(l, noise.Arg(w.kv_heads, step, w.head_dim),
                                noise.Arg(w.kv_heads, step, w.head_dim));
        if (absl::IsResourceExhausted(r.status()))
          full = true;
        else if (!r.ok())
          return r.status();
      }
    }
  }
  return filler->release();
}

// Sets POSIX_FADV_DONTNEED on every file under dir: the next read of it comes from the disk.
inline absl::Status DropPageCache(const std::string& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return absl::InternalError(
          absl::StrCat("open ", e.path().string(), ": ", std::strerror(errno)));
    const int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    if (rc != 0)
      return absl::InternalError(
          absl::StrCat("posix_fadvise ", e.path().string(), ": ", std::strerror(rc)));
  }
  return absl::OkStatus();
}

// What the tiers read so far: chunks found (every store) and the summed time of every store
// read (kvarena_tier_duration_seconds{op="read"}, hits and misses).
struct ReadTotals {
  uint64_t hit_chunks = 0;
  double read_s = 0;
};
inline absl::StatusOr<ReadTotals> Reads(Client& client, int metrics_port) {
  ReadTotals r;
  KVARENA_ASSIGN_OR_RETURN(ArenaStats stats, client.Stats());
  for (const TierStats& t : stats.tiers) r.hit_chunks += t.hit_chunks;
  std::istringstream lines(HttpGet(metrics_port, "/metrics"));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("kvarena_tier_duration_seconds_sum{", 0) == 0 &&
        line.find("op=\"read\"") != std::string::npos) {
      r.read_s += std::atof(line.c_str() + line.rfind(' ') + 1);
    }
  }
  return r;
}

}  // namespace kvarena

#endif  // KVARENA_BENCH_TIER_OPS_H_
