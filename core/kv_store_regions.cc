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

std::string KvStore::OpenSession(const std::string& client_name) {
  const uint64_t scratch_id = kScratchRegionBase + impl_->next_scratch.fetch_add(1);
  std::shared_ptr<const Region> scratch;
  if (impl_->options.scratch_bytes > 0) {
    // A session without scratch still works inline; ResolveSlice then says why.
    if (auto r = impl_->scratch_backend->Reserve(impl_->options.scratch_bytes,
                                                 absl::StrCat("kvarena-scratch-", scratch_id));
        r.ok()) {
      scratch = std::shared_ptr<const Region>(*std::move(r));
    }
  }
  return impl_->sessions.Open(client_name, std::move(scratch), scratch_id);
}

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
  for (const PagePool* p : impl_->pools_by_id) out.push_back(PoolRegionInfo(*p));
  return out;
}

absl::StatusOr<std::vector<SharedPiece>> KvStore::ExportRegion(const std::string& session,
                                                               uint64_t region_id,
                                                               uint64_t after_generation) const {
  if (session.empty() || !impl_->sessions.Contains(session)) {
    return absl::FailedPreconditionError("export: no attached session (Attach first)");
  }
  if (region_id >= kScratchRegionBase) {
    uint64_t own = 0;
    std::shared_ptr<const Region> scratch = impl_->sessions.Scratch(session, &own);
    if (!scratch || own != region_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("export: region ", region_id, " is not this session's scratch region"));
    }
    return scratch->ExportPiecesAfter(after_generation);
  }
  absl::ReaderMutexLock lock(&impl_->mu);
  if (region_id == 0 || region_id > impl_->pools_by_id.size()) {
    return absl::NotFoundError(absl::StrCat("export: no region ", region_id));
  }
  return impl_->pools_by_id[region_id - 1]->region().ExportPiecesAfter(after_generation);
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
  if (pool_id >= impl_->pools_by_id.size()) {
    return absl::NotFoundError(absl::StrCat("pool ", pool_id, " not found"));
  }
  return impl_->pools_by_id[pool_id]->base();
}

}  // namespace kvarena
