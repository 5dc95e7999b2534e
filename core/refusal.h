// Refusal: which bound a request met when it was refused RESOURCE_EXHAUSTED. The code that
// raises the refusal tags the status with it (RefusedError); the daemon reads the tag
// where it counts calls (RefusalOf), so operators see refusals by reason with a label set
// fixed here. Statuses that gain context on their way up keep the tag (Annotated).
//
// Thread-safety: pure functions.
#ifndef KVARENA_CORE_REFUSAL_H_
#define KVARENA_CORE_REFUSAL_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvarena {

enum class Refusal {
  kOther,                // RESOURCE_EXHAUSTED without a tag (nothing in kvarena raises one)
  kArenaFull,            // --arena_bytes: no chunk left to commit
  kDeviceMemory,         // the backend could not get memory (CUDA out of memory)
  kMaxTokens,            // CacheSpec.max_tokens
  kSessionMaxPages,      // --session_max_pages
  kMaxCaches,            // --max_caches
  kMaxCachesPerSession,  // --max_caches_per_session
  kMaxPools,             // --max_pools
  kMaxSessions,          // --max_sessions
  kMaxSessionsPerPeer,   // --max_sessions_per_peer
  kMaxMessageBytes,      // --max_message_bytes: a GetKv reply too large
  kMetadataBytes,        // --metadata_bytes: caches' tables, declared token ids
  kMaxAttachPerPeer,     // --max_attach_per_peer (the daemon's Attach streams)
  kMaxAttendWork,        // --max_attend_work: queries x keys x q heads of one Attend
  kMaxWatchers,          // the daemon's WatchEvents streams (64)
  kMaxWatchersPerPeer,   // --max_watchers_per_peer
  kWatcherBehind,        // a WatchEvents stream dropped: it fell too far behind
  kTenantMaxPages,       // a tenant's max_pages (--tenants_file)
  kTenantMaxCaches,      // a tenant's max_caches (--tenants_file)
  kMaxQueuedBytes,       // --max_queued_bytes: requests held by the daemon's pool
};
inline constexpr int kNumRefusals = static_cast<int>(Refusal::kMaxQueuedBytes) + 1;

// "arena_full", "max_tokens", ...: the metrics label.
const char* RefusalName(Refusal reason);

// RESOURCE_EXHAUSTED with `message`, tagged with `reason`.
absl::Status RefusedError(Refusal reason, absl::string_view message);

// The tag of a RESOURCE_EXHAUSTED status; kOther when it has none.
Refusal RefusalOf(const absl::Status& status);

// `status` with its message prefixed by `prefix` (e.g. "reserve: "), its code and its
// tag kept. OK stays OK.
absl::Status Annotated(const absl::Status& status, absl::string_view prefix);

}  // namespace kvarena

#endif  // KVARENA_CORE_REFUSAL_H_
