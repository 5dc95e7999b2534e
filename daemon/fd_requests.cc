#include "daemon/fd_requests.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "arena/fd_passing.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

v1::FdReply Error(const absl::Status& s) {
  v1::FdReply r;
  r.set_code(int(s.code()));
  r.set_message(std::string(s.message()));
  return r;
}

v1::FdReply ListRegions(const KvStore& store, const std::string& session) {
  absl::StatusOr<std::vector<RegionInfo>> regions = store.SessionRegions(session);
  if (!regions.ok()) return Error(regions.status());
  v1::FdReply reply;
  for (const RegionInfo& r : *regions) ToProto(r, reply.add_regions());
  return reply;
}

v1::FdReply ExportRegion(KvStore& store, const std::string& session,
                         const v1::FdRequest::ExportRegion& req,
                         std::vector<SharedPiece>* pieces_out) {
  size_t total = 0;
  absl::StatusOr<std::vector<SharedPiece>> page =
      store.ExportRegion(session, req.region_id(), req.after_generation(), req.first_piece(),
                         kMaxFdsPerMessage, &total);
  if (!page.ok()) return Error(page.status());
  v1::FdReply reply;
  reply.set_total_pieces(uint32_t(std::min<size_t>(total, UINT32_MAX)));
  for (const SharedPiece& p : *page) {
    v1::RegionPiece* out = reply.add_pieces();
    out->set_offset(p.offset);
    out->set_bytes(p.bytes);
    out->set_generation(p.generation);
  }
  *pieces_out = *std::move(page);
  return reply;
}

}  // namespace

const char* FdOpName(FdOp op) {
  switch (op) {
    case FdOp::kNone:
      return "none";
    case FdOp::kListRegions:
      return "list_regions";
    case FdOp::kExportRegion:
      return "export_region";
  }
  return "none";
}

v1::FdReply HandleFdRequest(KvStore& store, absl::string_view request,
                            const absl::Status& peer_access, std::vector<SharedPiece>* pieces_out,
                            FdOp* op) {
  pieces_out->clear();
  FdOp ignored;
  if (op == nullptr) op = &ignored;
  *op = FdOp::kNone;
  if (!peer_access.ok()) return Error(peer_access);
  v1::FdRequest req;
  if (request.size() > size_t(INT_MAX) ||
      !req.ParseFromArray(request.data(), int(request.size()))) {
    return Error(absl::InvalidArgumentError(absl::StrCat("fd socket: request of ", request.size(),
                                                         " bytes does not parse as FdRequest")));
  }
  switch (req.op_case()) {
    case v1::FdRequest::kListRegions:
      *op = FdOp::kListRegions;
      return ListRegions(store, req.session_id());
    case v1::FdRequest::kExportRegion:
      *op = FdOp::kExportRegion;
      return ExportRegion(store, req.session_id(), req.export_region(), pieces_out);
    case v1::FdRequest::OP_NOT_SET:
      break;
  }
  return Error(absl::InvalidArgumentError("fd socket: request names no operation"));
}

}  // namespace kvarena
