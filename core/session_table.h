// SessionTable: the attached workers. Each session has an unguessable id, an unguessable
// resume token (a later Attach stream presenting it takes the session over, and gets the
// next token: each token resumes once), the caches it owns, its Quota, its scratch region
// (planned at open, created and charged to the arena when the session first maps it) and
// — once its Attach stream broke — the time its
// caches are to be released. Each attachment of a session has an epoch, so the end of a
// stream that was taken over does not detach the session from the stream that took it.
//
// Thread-safety: safe for concurrent use (internal mutex). It only records cache ids;
// releasing them is the store's job.
#ifndef KVARENA_CORE_SESSION_TABLE_H_
#define KVARENA_CORE_SESSION_TABLE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "arena/region.h"
#include "core/quota.h"

namespace kvarena {

// One attachment of a session to an Attach stream.
struct SessionAttachment {
  std::string session_id;
  std::string resume_token;  // 32 hex digits; a credential, like the session id
  uint64_t epoch = 0;        // 1 when opened, one more on each resume
  bool resumed = false;      // this attachment resumed an existing session
};

class SessionTable {
 public:
  // max_sessions bounds the sessions held (attached or in their grace period), and
  // max_per_peer those of them opened by one peer (NewSession::peer).
  SessionTable(int64_t max_sessions, int64_t max_per_peer)
      : max_sessions_(max_sessions), max_per_peer_(max_per_peer) {}

  struct NewSession {
    std::string client_name;
    std::string peer;   // who opened it (SessionPeer::key); "": counted against no peer
    std::string owner;  // who may resume or use it (the daemon's tenant; "" without tenants)
    int64_t owner_max_sessions = 0;  // sessions of this owner held at once; 0: no bound
    uint64_t scratch_id = 0;
    size_t scratch_size = 0;  // the scratch region's bytes once mapped; 0: it gets none
    std::shared_ptr<Quota> quota;
  };
  // Opens a session with a fresh id and resume token (each 128 bits from the system's
  // CSPRNG, as 32 hex digits), at epoch 1. RESOURCE_EXHAUSTED when max_sessions are held,
  // max_per_peer opened by session.peer, or owner_max_sessions of its owner.
  absl::StatusOr<SessionAttachment> Open(NewSession session);
  // Attaches the session resume_token names again, at the next epoch, whether it is in
  // its grace period or still attached (a stream the client gave up on the daemon may not
  // have noticed ending yet). The token rotates: the attachment carries a fresh one, and
  // resume_token resumes nothing from then on. NOT_FOUND when no session holds the token,
  // its grace ended by `now` (reaped or about to be: it is gone either way), or it belongs
  // to another owner (the same message: another owner's session does not exist for this
  // caller).
  absl::StatusOr<SessionAttachment> Resume(const std::string& resume_token, absl::Time now,
                                           const std::string& owner = "");
  // Whether id is a session held (attached or in its grace) that owner opened.
  bool OwnedBy(const std::string& id, const std::string& owner) const;
  // The owner of a live session; nullopt when unknown or detached.
  std::optional<std::string> OwnerOf(const std::string& id) const;
  // A live session's scratch region: its id and size (0 when it gets none), and the region
  // itself once created (SetScratch), else null.
  struct ScratchView {
    uint64_t id = 0;
    size_t size = 0;
    std::shared_ptr<const Region> region;
  };
  // FAILED_PRECONDITION when the session is unknown or detached.
  absl::StatusOr<ScratchView> Scratch(const std::string& id) const;
  // Gives a live session its scratch region, charged `charge` arena bytes (refunded with
  // TakeExpired). Returns the region the session holds afterwards: `region`, or the one
  // another call installed first, or null when the session is unknown or detached. The
  // charge is taken only when `region` itself is returned; otherwise the caller refunds it.
  std::shared_ptr<const Region> SetScratch(const std::string& id,
                                           std::shared_ptr<const Region> region, size_t charge);
  // The quota of a live session; null when unknown or detached.
  std::shared_ptr<Quota> QuotaOf(const std::string& id) const;
  // Starts the grace period; a no-op for an unknown id, or when epoch is not 0 and the
  // session was attached again since that epoch.
  void Detach(const std::string& id, absl::Time release_at, uint64_t epoch = 0);
  bool Contains(const std::string& id) const;
  int64_t size() const;
  // Scratch bytes charged by the sessions held, and how many regions were created.
  size_t scratch_bytes() const;
  int64_t scratch_regions() const;

  // The sessions held now (in_grace of them detached), and how many were opened,
  // detached and resumed since the table was made.
  struct Counts {
    int64_t held = 0;
    int64_t in_grace = 0;
    uint64_t opened = 0;
    uint64_t detached = 0;
    uint64_t resumed = 0;
  };
  Counts counts() const;

  // Records that cache_id belongs to session id. FAILED_PRECONDITION when the session is
  // unknown or detached (its caches are on their way out).
  absl::Status AddCache(const std::string& id, const std::string& cache_id);
  void RemoveCache(const std::string& id, const std::string& cache_id);
  // Whether session id is held and owns cache_id.
  bool OwnsCache(const std::string& id, const std::string& cache_id) const;

  // Removes every session whose grace ended by `now` and returns them.
  struct Expired {
    std::string session_id;
    std::vector<std::string> cache_ids;
    size_t scratch_charge = 0;
  };
  std::vector<Expired> TakeExpired(absl::Time now);

 private:
  struct Session {
    NewSession info;
    std::shared_ptr<const Region> scratch;  // null until first mapped
    size_t scratch_charge = 0;
    absl::flat_hash_set<std::string> caches;
    std::string resume_token;
    uint64_t epoch = 1;
    bool detached = false;
    absl::Time release_at = absl::InfiniteFuture();
  };
  const int64_t max_sessions_;
  const int64_t max_per_peer_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> by_token_ ABSL_GUARDED_BY(mu_);  // -> id
  absl::flat_hash_map<std::string, int64_t> per_peer_ ABSL_GUARDED_BY(mu_);      // held, by peer
  size_t scratch_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t scratch_regions_ ABSL_GUARDED_BY(mu_) = 0;
  Counts counts_ ABSL_GUARDED_BY(mu_);  // held is sessions_.size(), filled in by counts()
};

}  // namespace kvarena

#endif  // KVARENA_CORE_SESSION_TABLE_H_
