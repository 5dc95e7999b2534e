// HandleFdRequest: the fd socket's request logic (daemon/fd_server.h does the framing):
// parses one FdRequest, lists the session's regions or exports one page of a region's
// pieces from the store, and builds the FdReply. No I/O, so a fuzzer can drive it with
// arbitrary bytes.
//
// Thread-safety: safe to call concurrently (KvStore is).
#ifndef KVARENA_DAEMON_FD_REQUESTS_H_
#define KVARENA_DAEMON_FD_REQUESTS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "arena/region.h"
#include "core/kv_store.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {

// What a request asked for; kNone when it was refused before it was parsed, did not
// parse or named no operation.
enum class FdOp { kNone, kListRegions, kExportRegion };
inline constexpr int kNumFdOps = static_cast<int>(FdOp::kExportRegion) + 1;
// "none", "list_regions", "export_region": the metrics label.
const char* FdOpName(FdOp op);

// The reply to `request` (a serialized FdRequest). Errors travel in the reply's code and
// message: peer_access itself when it is not OK (the peer may not fetch fds: see
// CheckFdPeer; the request is not even parsed),
// INVALID_ARGUMENT for bytes that do not parse or name no operation, and the store's
// codes otherwise. ExportRegion answers one page: the pieces after after_generation in
// generation order, without the first first_piece, at most kMaxFdsPerMessage, with
// total_pieces = how many there are after after_generation in all. A session's first
// export of its scratch region creates it (RESOURCE_EXHAUSTED naming scratch_bytes and
// arena_bytes when the arena cannot cover it): only peers CheckFdPeer lets in get here.
// *pieces_out receives the page's pieces in reply.pieces() order; the caller owns their
// fds (send them with the reply, then close them). It is left empty on any error.
// *op (when given) receives what the request asked for.
v1::FdReply HandleFdRequest(KvStore& store, absl::string_view request,
                            const absl::Status& peer_access, std::vector<SharedPiece>* pieces_out,
                            FdOp* op = nullptr);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_FD_REQUESTS_H_
