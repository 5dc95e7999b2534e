// RpcMetrics: what the KvCacheService calls came to, for the metrics endpoint — calls by
// method and status code, how long each unary handler ran (one latency histogram per
// method and code), and the RESOURCE_EXHAUSTED refusals by method and the bound they met
// (core/refusal.h). Recording is a few relaxed atomic adds, cheap enough for Ping.
//
// Unary calls are timed from the handler's start to its status: decode, the core
// operation, encode, and for a call handed to the service's pool its wait there — not
// gRPC's transport or the reply's serialization. An Attach
// stream lasts as long as its worker, so it is counted by the code it ends with and never
// timed.
//
// Thread-safety: every method may run concurrently. A reader may see a call in one
// series before another (its count before its refusal reason), never half of one
// histogram observation in Latency(): its count is the sum of the buckets it read.
#ifndef KVARENA_DAEMON_RPC_METRICS_H_
#define KVARENA_DAEMON_RPC_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/refusal.h"

namespace kvarena {

enum class Rpc {
  kAllocate,
  kAppend,
  kAttend,
  kPopn,
  kReset,
  kRelease,
  kReserve,
  kCommit,
  kGetKv,
  kDescribe,
  kStats,
  kListCaches,
  kAttach,
  kPing,
  kSetTokens,
  kFork,
  kWatchEvents,
};
inline constexpr int kNumRpcs = static_cast<int>(Rpc::kWatchEvents) + 1;
// Canonical codes run 0 (OK) .. 16 (UNAUTHENTICATED); anything else counts as UNKNOWN.
inline constexpr int kNumStatusCodes = 17;

// The method name as in the proto: "Allocate", "GetKv", ...
const char* RpcName(Rpc rpc);

// Upper bounds of the latency buckets in nanoseconds: 10 µs to 10 s, 1-2.5-5 per decade
// (a local call takes tens of µs; a prefill Append or a long GetKv, milliseconds to
// seconds). An observation falls in the first bucket whose bound it does not exceed.
inline constexpr std::array<int64_t, 19> kLatencyBoundsNanos = {
    10'000,        25'000,        50'000,         // 10 µs
    100'000,       250'000,       500'000,        // 100 µs
    1'000'000,     2'500'000,     5'000'000,      // 1 ms
    10'000'000,    25'000'000,    50'000'000,     // 10 ms
    100'000'000,   250'000'000,   500'000'000,    // 100 ms
    1'000'000'000, 2'500'000'000, 5'000'000'000,  // 1 s
    10'000'000'000};
inline constexpr int kNumLatencyBuckets = int(kLatencyBoundsNanos.size()) + 1;  // + above all

// One histogram as read: per-bucket counts (not cumulative; the last is above every
// bound), their sum, and the sum of the observations.
struct LatencySnapshot {
  std::array<uint64_t, kNumLatencyBuckets> buckets{};
  uint64_t count = 0;
  absl::Duration sum;
};

// A latency histogram over kLatencyBoundsNanos, safe for concurrent use.
class LatencyHistogram {
 public:
  void Record(absl::Duration elapsed);
  LatencySnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kNumLatencyBuckets> buckets_{};
  std::atomic<int64_t> sum_nanos_{0};
};

class RpcMetrics {
 public:
  RpcMetrics() = default;
  RpcMetrics(const RpcMetrics&) = delete;
  RpcMetrics& operator=(const RpcMetrics&) = delete;

  // A unary call ended with `status` after its handler ran for `elapsed`.
  void RecordCall(Rpc rpc, const absl::Status& status, absl::Duration elapsed);
  // A stream ended (or was refused) with `status`: counted, not timed.
  void RecordStreamEnd(Rpc rpc, const absl::Status& status);

  uint64_t Calls(Rpc rpc, absl::StatusCode code) const;
  LatencySnapshot Latency(Rpc rpc, absl::StatusCode code) const;
  uint64_t Refusals(Rpc rpc, Refusal reason) const;

 private:
  // The code's index; UNKNOWN's for codes outside the canonical range.
  static int CodeIndex(absl::StatusCode code);
  void Count(Rpc rpc, const absl::Status& status);

  std::array<std::array<std::atomic<uint64_t>, kNumStatusCodes>, kNumRpcs> calls_{};
  std::array<std::array<LatencyHistogram, kNumStatusCodes>, kNumRpcs> latency_{};
  std::array<std::array<std::atomic<uint64_t>, kNumRefusals>, kNumRpcs> refusals_{};
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_RPC_METRICS_H_
