#include "daemon/rpc_metrics.h"

#include <algorithm>

namespace kvarena {

const char* RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kAllocate:
      return "Allocate";
    case Rpc::kAppend:
      return "Append";
    case Rpc::kAttend:
      return "Attend";
    case Rpc::kPopn:
      return "Popn";
    case Rpc::kReset:
      return "Reset";
    case Rpc::kRelease:
      return "Release";
    case Rpc::kReserve:
      return "Reserve";
    case Rpc::kCommit:
      return "Commit";
    case Rpc::kGetKv:
      return "GetKv";
    case Rpc::kDescribe:
      return "Describe";
    case Rpc::kStats:
      return "Stats";
    case Rpc::kListCaches:
      return "ListCaches";
    case Rpc::kAttach:
      return "Attach";
    case Rpc::kPing:
      return "Ping";
    case Rpc::kSetTokens:
      return "SetTokens";
    case Rpc::kFork:
      return "Fork";
    case Rpc::kWatchEvents:
      return "WatchEvents";
  }
  return "unknown";
}

int RpcMetrics::CodeIndex(absl::StatusCode code) {
  const int c = static_cast<int>(code);
  return c >= 0 && c < kNumStatusCodes ? c : static_cast<int>(absl::StatusCode::kUnknown);
}

void RpcMetrics::Count(Rpc rpc, const absl::Status& status) {
  const int r = static_cast<int>(rpc);
  calls_[r][CodeIndex(status.code())].fetch_add(1, std::memory_order_relaxed);
  if (absl::IsResourceExhausted(status)) {
    refusals_[r][static_cast<int>(RefusalOf(status))].fetch_add(1, std::memory_order_relaxed);
  }
}

void LatencyHistogram::Record(absl::Duration elapsed) {
  const int64_t nanos = std::max<int64_t>(0, absl::ToInt64Nanoseconds(elapsed));
  const auto bound =
      std::lower_bound(kLatencyBoundsNanos.begin(), kLatencyBoundsNanos.end(), nanos);
  buckets_[size_t(bound - kLatencyBoundsNanos.begin())].fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(nanos, std::memory_order_relaxed);
}

LatencySnapshot LatencyHistogram::Snapshot() const {
  LatencySnapshot s;
  for (size_t i = 0; i < s.buckets.size(); ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    s.count += s.buckets[i];
  }
  s.sum = absl::Nanoseconds(sum_nanos_.load(std::memory_order_relaxed));
  return s;
}

void RpcMetrics::RecordCall(Rpc rpc, const absl::Status& status, absl::Duration elapsed) {
  latency_[static_cast<int>(rpc)][CodeIndex(status.code())].Record(elapsed);
  Count(rpc, status);
}

void RpcMetrics::RecordStreamEnd(Rpc rpc, const absl::Status& status) { Count(rpc, status); }

uint64_t RpcMetrics::Calls(Rpc rpc, absl::StatusCode code) const {
  return calls_[static_cast<int>(rpc)][CodeIndex(code)].load(std::memory_order_relaxed);
}

LatencySnapshot RpcMetrics::Latency(Rpc rpc, absl::StatusCode code) const {
  return latency_[static_cast<int>(rpc)][CodeIndex(code)].Snapshot();
}

uint64_t RpcMetrics::Refusals(Rpc rpc, Refusal reason) const {
  return refusals_[static_cast<int>(rpc)][static_cast<int>(reason)].load(std::memory_order_relaxed);
}

}  // namespace kvarena
