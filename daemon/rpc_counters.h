// RpcCounters: how many calls of each KvCacheService method ended with each status code,
// for the metrics endpoint. Count() is one relaxed atomic add, cheap enough for Ping.
// Thread-safe.
#ifndef KVARENA_DAEMON_RPC_COUNTERS_H_
#define KVARENA_DAEMON_RPC_COUNTERS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace kvarena {

enum class Rpc {
  kAllocate, kAppend, kAttend, kPopn, kReset, kRelease, kReserve, kCommit,
  kGetKv, kDescribe, kStats, kListCaches, kAttach, kPing, kSetTokens, kFork, kWatchEvents,
};
inline constexpr int kNumRpcs = static_cast<int>(Rpc::kWatchEvents) + 1;
// Canonical codes run 0 (OK) .. 16 (UNAUTHENTICATED).
inline constexpr int kNumStatusCodes = 17;

// The method name as in the proto: "Allocate", "GetKv", ...
const char* RpcName(Rpc rpc);

class RpcCounters {
 public:
  void Count(Rpc rpc, absl::StatusCode code) {
    const int c = static_cast<int>(code);
    counts_[static_cast<int>(rpc)][c < kNumStatusCodes ? c : 2 /* UNKNOWN */].fetch_add(
        1, std::memory_order_relaxed);
  }
  uint64_t Get(Rpc rpc, absl::StatusCode code) const {
    return counts_[static_cast<int>(rpc)][static_cast<int>(code)].load(
        std::memory_order_relaxed);
  }

 private:
  std::array<std::array<std::atomic<uint64_t>, kNumStatusCodes>, kNumRpcs> counts_{};
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_RPC_COUNTERS_H_
