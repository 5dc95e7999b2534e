// RemoteTransport's calls whose answers name pages of the arena's pools, and MapPool,
// which hands those pools out as mapped here (client/remote_transport.h). A Reserve may
// have grown a pool and a Describe may name pages in memory the daemon committed since
// the last refresh, so both bring the mapped pools up to date (ZeroCopy::SyncPools)
// before they return: every page an answer names is reachable through MapPool.
#include <cstdint>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "client/region_client.h"
#include "client/remote_transport.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "proto/wire.h"

namespace kvarena::client_internal {

absl::StatusOr<CacheDescription> RemoteTransport::Describe(const std::string& cache_id) {
  ++counters().describe;
  v1::DescribeRequest req;
  req.set_cache_id(cache_id);
  v1::DescribeResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::Describe, req, &resp));
  CacheDescription d;
  d.info = FromProto(resp.cache());
  d.layers.resize(d.info.spec.num_layers);
  for (const v1::LayerPages& p : resp.layers()) {
    if (p.layer() < d.layers.size()) d.layers[p.layer()] = FromProto(p);
  }
  KVARENA_RETURN_IF_ERROR(zero_copy_->SyncPools());  // the pages named are mapped
  return d;
}

absl::StatusOr<std::vector<ReserveResult>> RemoteTransport::Reserve(
    const std::vector<CacheTokens>& items) {
  ++counters().reserve;
  v1::ReserveRequest req;
  for (const CacheTokens& item : items) ToProto(item, req.add_items());
  v1::ReserveResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::Reserve, req, &resp));
  std::vector<ReserveResult> out;
  for (const v1::CacheReservation& c : resp.caches()) out.push_back(FromProto(c));
  // The reservation may have grown a pool: map its new memory before the pages are used.
  KVARENA_RETURN_IF_ERROR(zero_copy_->SyncPools());
  return out;
}

absl::StatusOr<MappedPool> RemoteTransport::MapPool(uint64_t pool_id) {
  if (forked()) return DisconnectedStatus();  // the mappings' fd socket is the parent's
  KVARENA_ASSIGN_OR_RETURN(RegionClient::Pool p, zero_copy_->GetPool(pool_id, channel_.address()));
  return MappedPool{p.base, p.kind, p.device};
}

}  // namespace kvarena::client_internal
