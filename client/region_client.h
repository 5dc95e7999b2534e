// RegionClient: a worker's side of the fd socket. It asks the daemon for the session's
// regions, receives their fds and maps them (arena/ImportRegion), so pool pages and the
// scratch region are visible in this process at the same offsets as in the daemon.
// A host pool is one memfd, mapped once, that grows by itself; a CUDA VMM pool is one
// piece per allocation the daemon committed, so SyncPools fetches and maps the pieces
// committed since (by generation) whenever the daemon may have grown a pool. A pool the
// daemon destroyed (with its last cache) is unmapped when a refresh no longer lists it,
// and one destroyed between a refresh's listing and its export is skipped, not an error.
//
// The daemon closes an fd-socket connection that idles past --fd_idle_timeout; an
// exchange that finds the socket closed reconnects to the same path and is retried once.
//
// Thread-safety: safe for concurrent use (one mutex; a request/reply is one exchange).
#ifndef KVARENA_CLIENT_REGION_CLIENT_H_
#define KVARENA_CLIENT_REGION_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "arena/fd_passing.h"
#include "arena/region.h"
#include "base/status_macros.h"

namespace kvarena {

class RegionClient {
 public:
  static absl::StatusOr<std::unique_ptr<RegionClient>> Connect(const std::string& fd_socket,
                                                               const std::string& session_id);
  ~RegionClient();
  RegionClient(const RegionClient&) = delete;
  RegionClient& operator=(const RegionClient&) = delete;

  struct Pool {
    uint8_t* base = nullptr;
    RegionKind kind = RegionKind::kHostMemfd;  // Region::share_kind() in the daemon
    int device = -1;  // the CUDA device it is mapped on; -1 for host memory
  };
  // The mapped pages of pool pool_id; maps the pool on first use (asking the daemon
  // again when the pool is newer than what this client knew).
  absl::StatusOr<Pool> GetPool(uint64_t pool_id);
  absl::StatusOr<uint8_t*> PoolBase(uint64_t pool_id) {
    KVARENA_ASSIGN_OR_RETURN(Pool p, GetPool(pool_id));
    return p.base;
  }
  // Maps what the daemon committed to the mapped pools since they were last brought up
  // to date. One fd-socket exchange per mapped CUDA VMM pool; nothing for host pools.
  absl::Status SyncPools();

  struct Scratch {
    uint64_t region_id = 0;
    uint8_t* base = nullptr;
    size_t size = 0;
  };
  // The session's scratch region, mapped on first use. The daemon creates it then and may
  // refuse (RESOURCE_EXHAUSTED when the arena cannot cover it): that refusal is kept and
  // returned from then on, and maps no pool less.
  absl::StatusOr<Scratch> GetScratch();

  // How many pools are mapped here now (tests: destroyed pools are unmapped).
  size_t TEST_MappedPools();

 private:
  struct Mapped {
    uint64_t region_id = 0;
    RegionKind kind = RegionKind::kHostMemfd;
    std::unique_ptr<MappedRegion> region;
    uint64_t generation = 0;  // every piece up to this generation is mapped
  };
  RegionClient(std::string fd_socket, int sock, std::string session_id)
      : fd_socket_(std::move(fd_socket)), session_id_(std::move(session_id)), sock_(sock) {}
  // Sends one serialized request and receives its reply. On a socket the daemon closed
  // (UNAVAILABLE: send EPIPE or ECONNRESET, recv EOF) it reconnects and tries once more.
  absl::StatusOr<Message> RoundTripLocked(const std::string& request);
  absl::Status RefreshLocked();  // lists the regions, maps the ones not mapped yet
  absl::Status MapLocked(uint64_t region_id, const std::string& kind, uint64_t size,
                         const std::string& ipc_handle, Mapped* out);
  // Maps the pieces of m's region newer than m->generation.
  absl::Status FetchPiecesLocked(Mapped* m);

  const std::string fd_socket_;
  const std::string session_id_;
  std::mutex mu_;
  int sock_;                          // -1 after a failed reconnect; guarded by mu_
  std::map<uint64_t, Mapped> pools_;  // by pool id
  Mapped scratch_;
  absl::Status scratch_refused_;  // why the daemon would not export the scratch region
};

}  // namespace kvarena

#endif  // KVARENA_CLIENT_REGION_CLIENT_H_
