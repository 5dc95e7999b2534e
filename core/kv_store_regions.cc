// The zero-copy data plane's side of the store: sessions with scratch regions, the
// regions a session may map, their export, and shared-slice resolution.
#include "absl/strings/str_cat.h"
#include "core/kv_store.h"
#include "core/kv_store_impl.h"

namespace kvarena {
namespace {

RegionInfo PoolRegionInfo(const PagePool& pool) {
  RegionInfo r;
  r.region_id = pool.id() + 1;
  r.kind = pool.region().share_kind();
  r.size = pool.region().size();
  r.pool_id = pool.id();
  r.ipc_handle = pool.region().ipc_handle();
  return r;
}

}  // namespace

absl::StatusOr<std::vector<RegionInfo>> KvStore::SessionRegions(const std::string& session) const {
  uint64_t scratch_id = 0;
  std::shared_ptr<const Region> scratch = impl_->sessions.Scratch(session, &scratch_id);
  if (session.empty() || !impl_->sessions.Contains(session)) {
    return absl::FailedPreconditionError("regions: no attached session (Attach first)");
  }
  std::vector<RegionInfo> out;
  if (scratch) {
    RegionInfo r;
    r.region_id = scratch_id;
    r.kind = scratch->share_kind();
    r.size = scratch->size();
    r.scratch = true;
    out.push_back(r);
  }
  absl::ReaderMutexLock lock(&impl_->mu);
  for (const auto& [id, p] : impl_->pools_by_id) out.push_back(PoolRegionInfo(*p));
  return out;
}

absl::StatusOr<std::vector<SharedPiece>> KvStore::ExportRegion(const std::string& session,
                                                               uint64_t region_id,
                                                               uint64_t after_generation,
                                                               size_t first, size_t max_pieces,
                                                               size_t* total) const {
  if (session.empty() || !impl_->sessions.Contains(session)) {
    return absl::FailedPreconditionError("export: no attached session (Attach first)");
  }
  std::shared_ptr<const Region> region;
  if (region_id >= kScratchRegionBase) {
    uint64_t own = 0;
    region = impl_->sessions.Scratch(session, &own);
    if (!region || own != region_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("export: region ", region_id, " is not this session's scratch region"));
    }
  } else {
    absl::ReaderMutexLock lock(&impl_->mu);
    auto it = region_id == 0 ? impl_->pools_by_id.end() : impl_->pools_by_id.find(region_id - 1);
    if (it == impl_->pools_by_id.end()) {
      return absl::NotFoundError(absl::StrCat("export: no region ", region_id));
    }
    // The pool may be dropped meanwhile; its region lives while we export.
    region = std::shared_ptr<const Region>(it->second, &it->second->region());
  }
  return region->ExportPiecesAfter(after_generation, first, max_pieces, total);
}

absl::StatusOr<ResolvedSlice> KvStore::ResolveSlice(const std::string& session, uint64_t region_id,
                                                    uint64_t offset, uint64_t length) const {
  uint64_t own = 0;
  std::shared_ptr<const Region> scratch = impl_->sessions.Scratch(session, &own);
  if (!scratch) {
    return absl::FailedPreconditionError(
        "shared slice: the call carries no attached session with a scratch region");
  }
  if (region_id != own) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shared slice: region_id=", region_id, " is not this session's scratch region (", own, ")"));
  }
  if (offset > scratch->size() || length > scratch->size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("shared slice: [", offset, ", +", length,
                                                   ") lies outside the scratch region of ",
                                                   scratch->size(), " bytes"));
  }
  return ResolvedSlice{scratch, scratch->base() + offset, size_t(length)};
}

absl::StatusOr<uint8_t*> KvStore::PoolBase(uint64_t pool_id) const {
  absl::ReaderMutexLock lock(&impl_->mu);
  auto it = impl_->pools_by_id.find(pool_id);
  if (it == impl_->pools_by_id.end()) {
    return absl::NotFoundError(absl::StrCat("pool ", pool_id, " not found"));
  }
  return it->second->base();
}

}  // namespace kvarena
