// Conversions between the wire messages (kvarena.v1) and the core value types
// (core/types.h), one function per type and direction, shared by the daemon and the
// client so no field is mapped twice. Pure functions; thread-safe.
//
// Decoding never validates semantics (that is core's job); it only carries values.
// Tensors decoded from the wire borrow the message's bytes: the message must outlive them.
#ifndef KVARENA_PROTO_WIRE_H_
#define KVARENA_PROTO_WIRE_H_

#include "core/kv_store.h"  // RegionInfo, PrefixEvent
#include "core/types.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {

// The call metadata that carries the caller's session id (from its Attach stream).
inline constexpr char kSessionMetadataKey[] = "kvarena-session";
// Trailing metadata of an Attach stream the daemon ended for good: its value says why
// ("shutdown": kvarenad is draining, so resuming the session there is pointless).
inline constexpr char kAttachEndMetadataKey[] = "kvarena-attach-end";
inline constexpr char kAttachEndShutdown[] = "shutdown";
// Trailing metadata of a WatchEvents stream the daemon dropped because it fell behind: the
// from_seq (decimal) to watch again from without missing an event.
inline constexpr char kResumeFromSeqMetadataKey[] = "kvarena-resume-from-seq";

DType FromProto(v1::DType d);
v1::DType ToProto(DType d);
KvFormat FromProto(v1::KvFormat f);
v1::KvFormat ToProto(KvFormat f);

CacheSpec FromProto(const v1::CacheSpec& p);
void ToProto(const CacheSpec& s, v1::CacheSpec* p);

CacheInfo FromProto(const v1::CacheInfo& p);
void ToProto(const CacheInfo& c, v1::CacheInfo* p);

// Inline tensors only (payload `data`); a SharedSlice payload is resolved by the caller.
TensorArg FromProto(const v1::Tensor& p);
void ToProto(const TensorArg& t, v1::Tensor* p);  // copies t.data into p's bytes
void ToProto(TensorOut&& t, v1::Tensor* p);       // moves t.data into p's bytes
TensorOut TensorOutFromProto(const v1::Tensor& p);

LayerPages FromProto(const v1::LayerPages& p);
void ToProto(const LayerPages& l, uint32_t layer, v1::LayerPages* p);

CacheTokens FromProto(const v1::CacheTokens& p);
void ToProto(const CacheTokens& t, v1::CacheTokens* p);  // negative tokens go out as 0

// Reserve's per-cache answer; layers are numbered by their index.
ReserveResult FromProto(const v1::CacheReservation& p);
void ToProto(const ReserveResult& r, v1::CacheReservation* p);

void ToProto(const RegionInfo& r, v1::RegionDescriptor* p);
RegionInfo FromProto(const v1::RegionDescriptor& p);

PageStats FromProto(const v1::PageStats& p);
void ToProto(const PageStats& s, v1::PageStats* p);
TierStats FromProto(const v1::TierStats& p);
void ToProto(const TierStats& s, v1::TierStats* p);

PoolStats FromProto(const v1::PoolStats& p);
void ToProto(const PoolStats& s, v1::PoolStats* p);

// Prefix-index events (WatchEvents); hashes as XXH128's canonical 16 bytes.
std::string HashBytes(const Hash128& h);
void ToProto(const PrefixEvent& e, v1::KvEvent* p);

ArenaStats FromProto(const v1::StatsResponse& p);
void ToProto(const ArenaStats& s, v1::StatsResponse* p);

}  // namespace kvarena

#endif  // KVARENA_PROTO_WIRE_H_
