// libFuzzer target: the decoders on both sides of the wire. The first input byte picks a
// message type; the rest is parsed as that message (protobuf's own parser) and run
// through what decodes it: the daemon's checked request decoders (daemon/decode.h) and
// core's validation of specs and tensors (core/validate.h), and the client's conversions
// of replies (proto/wire.h), which a worker applies to whatever its daemon sends. None
// may crash, overflow or read out of bounds, whatever the bytes.
#include <cstdint>
#include <string>

#include "core/validate.h"
#include "daemon/decode.h"
#include "kvarena/v1/kvarena.pb.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

const RequestLimits kLimits{};

// A spec decoded and resolved, then every tensor of the request checked against it.
void CheckTensorsAgainst(const CacheSpec& spec, const v1::Tensor& k, const v1::Tensor& q) {
  const TensorArg kt = FromProto(k);
  (void)CheckTensor("fuzz", "k", kt, spec.dtype, spec.num_kv_heads, spec.head_dim, kLimits);
  const TensorArg qt = FromProto(q);
  std::string out(qt.bytes, '\0');
  (void)CheckQuery("fuzz", spec, qt, out.data(), out.size(), 0.0, kLimits);
  if (qt.shape.size() == 4) {
    (void)TensorBytes(qt.dtype, qt.shape[1], qt.shape[2], qt.shape[3]);
  }
}

template <typename M>
bool Parse(M* m, const uint8_t* data, size_t size) {
  return m->ParseFromArray(data, int(size));
}

void Run(uint8_t kind, const uint8_t* data, size_t size) {
  CacheSpec base;
  base.num_layers = 2;
  base.num_kv_heads = 2;
  base.head_dim = 8;
  base.dtype = DType::kFloat16;
  base.page_size = 4;
  base.layer_windows = {0, 3};
  switch (kind % 8) {
    case 0: {
      v1::AllocateRequest m;
      if (!Parse(&m, data, size)) return;
      absl::StatusOr<CacheSpec> spec = DecodeSpec(m.spec());
      if (!spec.ok()) return;
      absl::StatusOr<CacheSpec> resolved = ResolveSpec(*spec, 16, kLimits);
      if (resolved.ok()) CheckTensorsAgainst(*resolved, v1::Tensor(), v1::Tensor());
      return;
    }
    case 1: {
      v1::AppendRequest m;
      if (!Parse(&m, data, size)) return;
      (void)DecodeLayer("append", m.layer());
      (void)DecodeInt64("append", "pos", m.pos());
      CheckTensorsAgainst(base, m.k(), m.v());
      return;
    }
    case 2: {
      v1::AttendRequest m;
      if (!Parse(&m, data, size)) return;
      (void)DecodeLayer("attend", m.layer());
      (void)DecodeInt64("attend", "pos", m.pos());
      CheckTensorsAgainst(base, m.k(), m.q());
      (void)EffectiveWindow(base.layer_windows[1], m.window());
      return;
    }
    case 3: {
      v1::ReserveRequest m;
      if (!Parse(&m, data, size)) return;
      (void)DecodeItems("reserve", m.items());
      return;
    }
    case 4: {
      v1::GetKvRequest m;
      if (!Parse(&m, data, size)) return;
      (void)DecodeLayer("get_kv", m.layer());
      (void)DecodeInt64("get_kv", "from_pos", m.from_pos());
      (void)DecodeInt64("get_kv", "max_tokens", m.max_tokens());
      return;
    }
    // What a client decodes from its daemon's replies.
    case 5: {
      v1::ReserveResponse m;
      if (!Parse(&m, data, size)) return;
      for (const v1::CacheReservation& c : m.caches()) (void)FromProto(c);
      return;
    }
    case 6: {
      v1::DescribeResponse m;
      if (!Parse(&m, data, size)) return;
      (void)FromProto(m.cache());
      for (const v1::LayerPages& l : m.layers()) (void)FromProto(l);
      return;
    }
    default: {
      v1::StatsResponse m;
      if (!Parse(&m, data, size)) return;
      (void)FromProto(m);
      v1::GetKvResponse kv;
      if (Parse(&kv, data, size)) (void)TensorOutFromProto(kv.k());
      return;
    }
  }
}

}  // namespace
}  // namespace kvarena

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kvarena::Run(data[0], data + 1, size - 1);
  return 0;
}
