// The zero-copy data plane's side of the store: sessions with scratch regions, the
// regions a session may map, their export, and shared-slice resolution.
#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/kv_store.h"
#include "core/kv_store_impl.h"
#include "core/refusal.h"

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

absl::StatusOr<std::shared_ptr<const Region>> KvStore::Impl::CreateScratch(
    const std::string& session, const SessionTable::ScratchView& scratch) {
  if (scratch.region != nullptr) return scratch.region;
  // Warm chunks (StoreOptions::arena_warm_bytes) give way to it, as to a pool's pages.
  if (!budget.TryCharge(scratch.size) &&
      !(pools.TrimEmpty(scratch.size - std::min(scratch.size, budget.available())) &&
        budget.TryCharge(scratch.size))) {
    return RefusedError(
        Refusal::kArenaFull,
        absl::StrCat("export: the session's scratch region (scratch_bytes=", scratch.size,
                     ") does not fit the "
                     "arena: ",
                     budget.used(), " of arena_bytes=", budget.limit(),
                     " are committed; its "
                     "tensors travel inline"));
  }
  absl::StatusOr<std::unique_ptr<Region>> r =
      scratch_backend->Reserve(scratch.size, absl::StrCat("kvarena-scratch-", scratch.id));
  if (!r.ok()) {
    budget.Refund(scratch.size);
    return Annotated(r.status(), "export: scratch region: ");
  }
  std::shared_ptr<const Region> mine(*std::move(r));
  std::shared_ptr<const Region> held = sessions.SetScratch(session, mine, scratch.size);
  if (held != mine) budget.Refund(scratch.size);  // another export won, or the session went
  if (held == nullptr) return absl::FailedPreconditionError("export: the session detached");
  return held;
}

absl::StatusOr<std::vector<RegionInfo>> KvStore::SessionRegions(const std::string& session) const {
  absl::StatusOr<SessionTable::ScratchView> scratch = impl_->sessions.Scratch(session);
  if (!scratch.ok()) return Annotated(scratch.status(), "regions: ");
  std::vector<RegionInfo> out;
  if (scratch->size > 0) {  // listed before it is created: its first export creates it
    RegionInfo r;
    r.region_id = scratch->id;
    r.kind = RegionKindName(RegionKind::kHostMemfd);  // the scratch backend is always the host's
    r.size = scratch->size;
    r.scratch = true;
    out.push_back(r);
  }
  const std::optional<std::string> owner = impl_->sessions.OwnerOf(session);
  for (const PoolSet::Entry& e : impl_->pools.List()) {
    if (owner.has_value() && e.owner == *owner) out.push_back(PoolRegionInfo(*e.pool));
  }
  return out;
}

absl::StatusOr<std::vector<SharedPiece>> KvStore::ExportRegion(const std::string& session,
                                                               uint64_t region_id,
                                                               uint64_t after_generation,
                                                               size_t first, size_t max_pieces,
                                                               size_t* total) {
  absl::StatusOr<SessionTable::ScratchView> scratch = impl_->sessions.Scratch(session);
  if (!scratch.ok()) return Annotated(scratch.status(), "export: ");
  std::shared_ptr<const Region> region;
  if (region_id >= kScratchRegionBase) {
    if (scratch->size == 0 || scratch->id != region_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("export: region ", region_id, " is not this session's scratch region"));
    }
    KVARENA_ASSIGN_OR_RETURN(std::shared_ptr<const Region> r,
                             impl_->CreateScratch(session, *scratch));
    region = std::move(r);
  } else {
    const std::optional<std::string> owner = impl_->sessions.OwnerOf(session);
    // Another owner's pool is as unknown to this session as a pool that never was.
    std::shared_ptr<PagePool> pool =
        region_id == 0 || !owner.has_value() ? nullptr : impl_->pools.Find(region_id - 1, *owner);
    if (pool == nullptr) return absl::NotFoundError(absl::StrCat("export: no region ", region_id));
    // The pool may be dropped meanwhile; its region lives while we export.
    region = std::shared_ptr<const Region>(pool, &pool->region());
  }
  return region->ExportPiecesAfter(after_generation, first, max_pieces, total);
}

absl::StatusOr<ResolvedSlice> KvStore::ResolveSlice(const std::string& session, uint64_t region_id,
                                                    uint64_t offset, uint64_t length) const {
  absl::StatusOr<SessionTable::ScratchView> view = impl_->sessions.Scratch(session);
  if (!view.ok() || view->size == 0) {
    return absl::FailedPreconditionError(
        "shared slice: the call carries no attached session with a scratch region");
  }
  if (region_id != view->id) {
    return absl::PermissionDeniedError(absl::StrCat("shared slice: region_id=", region_id,
                                                    " is not this session's scratch region (",
                                                    view->id, ")"));
  }
  if (offset > view->size || length > view->size - offset) {
    return absl::InvalidArgumentError(absl::StrCat("shared slice: [", offset, ", +", length,
                                                   ") lies outside the scratch region of ",
                                                   view->size, " bytes"));
  }
  if (view->region == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared slice: region_id=", region_id,
                     " is not mapped yet (export it over the fd socket first)"));
  }
  const std::shared_ptr<const Region>& scratch = view->region;
  return ResolvedSlice{scratch, scratch->base() + offset, size_t(length)};
}

absl::StatusOr<uint8_t*> KvStore::PoolBase(uint64_t pool_id) const {
  std::shared_ptr<PagePool> pool = impl_->pools.Find(pool_id);
  if (pool == nullptr) return absl::NotFoundError(absl::StrCat("pool ", pool_id, " not found"));
  return pool->base();
}

}  // namespace kvarena
