#include "core/refusal.h"

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"

namespace kvarena {
namespace {

constexpr absl::string_view kTypeUrl = "type.kvarena.dev/kvarena.Refusal";

}  // namespace

const char* RefusalName(Refusal reason) {
  switch (reason) {
    case Refusal::kOther:
      return "other";
    case Refusal::kArenaFull:
      return "arena_full";
    case Refusal::kDeviceMemory:
      return "device_memory";
    case Refusal::kMaxTokens:
      return "max_tokens";
    case Refusal::kSessionMaxPages:
      return "session_max_pages";
    case Refusal::kMaxCaches:
      return "max_caches";
    case Refusal::kMaxCachesPerSession:
      return "max_caches_per_session";
    case Refusal::kMaxPools:
      return "max_pools";
    case Refusal::kMaxSessions:
      return "max_sessions";
    case Refusal::kMaxSessionsPerPeer:
      return "max_sessions_per_peer";
    case Refusal::kMaxMessageBytes:
      return "max_message_bytes";
    case Refusal::kMetadataBytes:
      return "metadata_bytes";
    case Refusal::kMaxAttachPerPeer:
      return "max_attach_per_peer";
    case Refusal::kMaxAttendWork:
      return "max_attend_work";
    case Refusal::kMaxWatchers:
      return "max_watchers";
    case Refusal::kMaxWatchersPerPeer:
      return "max_watchers_per_peer";
    case Refusal::kWatcherBehind:
      return "watcher_behind";
    case Refusal::kTenantMaxPages:
      return "tenant_max_pages";
    case Refusal::kTenantMaxCaches:
      return "tenant_max_caches";
    case Refusal::kMaxQueuedBytes:
      return "max_queued_bytes";
  }
  return "other";
}

absl::Status RefusedError(Refusal reason, absl::string_view message) {
  absl::Status s = absl::ResourceExhaustedError(message);
  s.SetPayload(kTypeUrl, absl::Cord(absl::StrCat(static_cast<int>(reason))));
  return s;
}

Refusal RefusalOf(const absl::Status& status) {
  if (!absl::IsResourceExhausted(status)) return Refusal::kOther;
  const absl::optional<absl::Cord> tag = status.GetPayload(kTypeUrl);
  if (!tag.has_value()) return Refusal::kOther;
  int n = -1;
  if (!absl::SimpleAtoi(std::string(*tag), &n) || n < 0 || n >= kNumRefusals)
    return Refusal::kOther;
  return static_cast<Refusal>(n);
}

absl::Status Annotated(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace kvarena
