#include "client/region_client.h"

#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "arena/fd_passing.h"
#include "base/status_macros.h"
#include "core/refusal.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {
namespace {

// The reply to a round trip; its fds go to *fds (closed on any error).
absl::StatusOr<v1::FdReply> Decode(absl::StatusOr<Message> m, std::vector<int>* fds) {
  KVARENA_RETURN_IF_ERROR(m.status());
  v1::FdReply reply;
  if (!reply.ParseFromString(m->bytes)) {
    for (int fd : m->fds) close(fd);
    return absl::InternalError("fd socket: reply does not parse as FdReply");
  }
  if (reply.code() != 0) {
    for (int fd : m->fds) close(fd);
    return absl::Status(absl::StatusCode(reply.code()), reply.message());
  }
  *fds = std::move(m->fds);
  return reply;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RegionClient>> RegionClient::Connect(const std::string& fd_socket,
                                                                    const std::string& session_id) {
  KVARENA_ASSIGN_OR_RETURN(int sock, ConnectUnix(fd_socket));
  return std::unique_ptr<RegionClient>(new RegionClient(fd_socket, sock, session_id));
}

RegionClient::~RegionClient() {
  if (sock_ >= 0) close(sock_);
}

absl::StatusOr<Message> RegionClient::RoundTripLocked(const std::string& request) {
  absl::Status failed;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (sock_ < 0) {
      KVARENA_ASSIGN_OR_RETURN(int sock, ConnectUnix(fd_socket_));
      sock_ = sock;
    }
    failed = SendMessage(sock_, request);
    if (failed.ok()) {
      absl::StatusOr<Message> reply = RecvMessage(sock_);
      if (reply.ok()) return reply;
      failed = reply.status();
    } else {
      // A peer the daemon refuses is answered and closed as it connects, so its send may
      // fail; the refusal waits in the socket (a past deadline: read only what is there).
      absl::StatusOr<Message> refusal = RecvMessage(sock_, absl::InfinitePast());
      if (refusal.ok()) return refusal;
    }
    // Anything but a closed socket leaves the stream in an unknown state: give up on it too.
    close(sock_);
    sock_ = -1;
    if (!absl::IsUnavailable(failed)) break;
  }
  return Annotated(failed, absl::StrCat("fd socket ", fd_socket_, ": "));
}

absl::Status RegionClient::MapLocked(uint64_t region_id, const std::string& kind, uint64_t size,
                                     const std::string& ipc_handle, Mapped* out) {
  KVARENA_ASSIGN_OR_RETURN(std::unique_ptr<MappedRegion> region,
                           ImportRegion(kind, size, ipc_handle));
  Mapped m;
  m.region_id = region_id;
  m.kind = *ParseRegionKind(kind);  // ImportRegion refused any other name
  m.region = std::move(region);
  KVARENA_RETURN_IF_ERROR(FetchPiecesLocked(&m));
  *out = std::move(m);
  return absl::OkStatus();
}

absl::Status RegionClient::FetchPiecesLocked(Mapped* m) {
  // Pieces come in generation order, at most kMaxFdsPerMessage a reply: ask again after
  // the newest one received until a reply holds all that are left.
  for (;;) {
    v1::FdRequest req;
    req.set_session_id(session_id_);
    req.mutable_export_region()->set_region_id(m->region_id);
    req.mutable_export_region()->set_after_generation(m->generation);
    std::vector<int> fds;
    KVARENA_ASSIGN_OR_RETURN(v1::FdReply reply,
                             Decode(RoundTripLocked(req.SerializeAsString()), &fds));
    if (fds.size() != size_t(reply.pieces_size())) {
      for (int fd : fds) close(fd);
      return absl::InternalError(absl::StrCat("fd socket: ", reply.pieces_size(),
                                              " pieces came with ", fds.size(), " fds"));
    }
    std::vector<SharedPiece> pieces;
    uint64_t newest = m->generation;
    for (int i = 0; i < reply.pieces_size(); ++i) {
      const v1::RegionPiece& p = reply.pieces(i);
      pieces.push_back({p.offset(), p.bytes(), fds[size_t(i)], p.generation()});
      newest = std::max<uint64_t>(newest, p.generation());
    }
    KVARENA_RETURN_IF_ERROR(m->region->MapPieces(std::move(pieces)));
    const bool done = uint32_t(reply.pieces_size()) >= reply.total_pieces();
    if (done || newest == m->generation) {
      m->generation = newest;
      return absl::OkStatus();
    }
    m->generation = newest;
  }
}

absl::Status RegionClient::RefreshLocked() {
  v1::FdRequest req;
  req.set_session_id(session_id_);
  req.mutable_list_regions();
  std::vector<int> fds;
  KVARENA_ASSIGN_OR_RETURN(v1::FdReply reply,
                           Decode(RoundTripLocked(req.SerializeAsString()), &fds));
  // A pool the daemon no longer lists was destroyed with its last cache: no handle of a
  // live cache points into it, so its mapping goes (it would only pin address space).
  std::set<uint64_t> listed;
  for (const v1::RegionDescriptor& r : reply.regions()) {
    if (!r.scratch()) listed.insert(r.pool_id());
  }
  std::erase_if(pools_, [&listed](const auto& entry) { return !listed.contains(entry.first); });
  for (const v1::RegionDescriptor& r : reply.regions()) {
    const bool have = r.scratch() ? scratch_.region != nullptr || !scratch_refused_.ok()
                                  : pools_.contains(r.pool_id());
    if (have) continue;
    Mapped m;
    if (absl::Status s = MapLocked(r.region_id(), r.kind(), r.size(), r.ipc_handle(), &m);
        !s.ok()) {
      // Listed, then destroyed with its last cache (another process's) before its export:
      // nothing to map, and no reason to fail the pool the caller asked for.
      if (!r.scratch() && absl::IsNotFound(s)) continue;
      // The arena cannot cover the scratch region the daemon creates at its first export:
      // the session works without one (tensors inline), and its pools map all the same.
      if (r.scratch() && absl::IsResourceExhausted(s)) {
        scratch_refused_ = std::move(s);
        continue;
      }
      return s;
    }
    if (r.scratch()) {
      scratch_ = std::move(m);
    } else {
      pools_[r.pool_id()] = std::move(m);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionClient::Pool> RegionClient::GetPool(uint64_t pool_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pools_.contains(pool_id)) {
    KVARENA_RETURN_IF_ERROR(RefreshLocked());
  }
  auto it = pools_.find(pool_id);
  if (it == pools_.end())
    return absl::NotFoundError(absl::StrCat("pool ", pool_id, " is not shared with this session"));
  const MappedRegion& r = *it->second.region;
  return Pool{r.base(), it->second.kind, r.device()};
}

absl::Status RegionClient::SyncPools() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = pools_.begin(); it != pools_.end();) {
    // A memfd is one piece that grows with the file; cuda_ipc is mapped whole.
    if (it->second.kind != RegionKind::kCudaVmm) {
      ++it;
      continue;
    }
    absl::Status s = FetchPiecesLocked(&it->second);
    if (absl::IsNotFound(s)) {  // destroyed with its last cache (see RefreshLocked)
      it = pools_.erase(it);
      continue;
    }
    if (!s.ok()) {
      return Annotated(s, absl::StrCat("mapping the pages pool ", it->first, " gained: "));
    }
    ++it;
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionClient::Scratch> RegionClient::GetScratch() {
  std::lock_guard<std::mutex> lock(mu_);
  if (scratch_.region == nullptr && scratch_refused_.ok()) {
    KVARENA_RETURN_IF_ERROR(RefreshLocked());
  }
  KVARENA_RETURN_IF_ERROR(scratch_refused_);
  if (scratch_.region == nullptr)
    return absl::FailedPreconditionError("the daemon gave this session no scratch region");
  return Scratch{scratch_.region_id, scratch_.region->base(), scratch_.region->size()};
}

size_t RegionClient::TEST_MappedPools() {
  std::lock_guard<std::mutex> lock(mu_);
  return pools_.size();
}

}  // namespace kvarena
