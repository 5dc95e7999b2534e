// Allocate, Append, Attend and shared slices at the extremes of their types, against a
// real kvarenad: uint32/uint64 max, 2^31, 2^63, shapes whose byte count wraps, empty /
// short / long data, slices whose offset + length overflows or that name another
// session's region, empty and 1 MiB cache ids. Several of these once killed the daemon
// (SIGFPE, SIGSEGV) or handed out another session's bytes.
#include "tests/daemon/extremes_fixture.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

TEST_F(ExtremesTest, AllocateAppendAttendAndSlicesAtTheirExtremesGetTheirCodeAndChangeNothing) {
  const std::string mib_id(1 << 20, 'x');
  RunCases({
      // Allocate: integers past their ranges, named as sent.
      {"num_layers=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_num_layers(kU32Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.num_layers=4294967295 must be in [1, 1024]"},
      {"num_layers=2^31",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_num_layers(1u << 31); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.num_layers=2147483648"},
      {"num_kv_heads=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_num_kv_heads(kU32Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.num_kv_heads=4294967295"},
      {"head_dim=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_head_dim(kU32Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.head_dim=4294967295"},
      {"page_size=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_page_size(kU32Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.page_size=4294967295"},
      {"window=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) {
           s->add_layer_windows(kU32Max);
           s->add_layer_windows(0);
         });
       },
       StatusCode::INVALID_ARGUMENT, "spec.layer_windows[0]=4294967295"},
      {"window=2^31",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) {
           s->add_layer_windows(0);
           s->add_layer_windows(1u << 31);
         });
       },
       StatusCode::INVALID_ARGUMENT, "spec.layer_windows[1]=2147483648"},
      {"max_tokens=u64max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_max_tokens(kU64Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.max_tokens=18446744073709551615"},
      {"max_tokens=2^63",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_max_tokens(k2To63); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.max_tokens=9223372036854775808"},
      {"cache_id of 1 MiB",
       [&mib_id](ExtremesTest* t) {
         v1::AllocateRequest req;
         *req.mutable_spec() = Spec(2, 2, 8);
         req.set_cache_id(mib_id);
         v1::AllocateResponse resp;
         return t->stub()->Allocate(Ctx().get(), req, &resp);
       },
       StatusCode::INVALID_ARGUMENT, "cache_id has 1048576 bytes; at most 256"},
      // Append.
      {"append layer=u32max",
       [](ExtremesTest* t) { return t->AppendF32("c", kU32Max, 5, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "append: layer=4294967295"},
      {"append layer=2^31",
       [](ExtremesTest* t) { return t->AppendF32("c", 1u << 31, 5, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "append: layer=2147483648"},
      {"append pos=u64max",
       [](ExtremesTest* t) { return t->AppendF32("c", 0, kU64Max, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "append: pos=18446744073709551615"},
      {"append pos=2^63", [](ExtremesTest* t) { return t->AppendF32("c", 0, k2To63, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "append: pos=9223372036854775808"},
      {"append pos=2^63-1",
       [](ExtremesTest* t) { return t->AppendF32("c", 0, kI64Max, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "pos=9223372036854775807 but layer 0 holds 5 tokens"},
      {"append tokens=2^62, empty data",
       [](ExtremesTest* t) {
         v1::Tensor k = F32Tensor(2, 1, 8, 1);
         k.set_shape(2, int64_t{1} << 62);
         k.clear_data();
         return t->Append("c", 0, 5, k, k);
       },
       StatusCode::INVALID_ARGUMENT, "tokens=4611686018427387904"},
      {"append tokens=int64max",
       [](ExtremesTest* t) {
         v1::Tensor k = F32Tensor(2, 1, 8, 1);
         k.set_shape(2, kI64Max);
         return t->Append("c", 0, 5, k, k);
       },
       StatusCode::INVALID_ARGUMENT, "tokens=9223372036854775807"},
      {"append short data",
       [](ExtremesTest* t) {
         v1::Tensor k = F32Tensor(2, 1, 8, 1);
         k.mutable_data()->resize(1);
         return t->Append("c", 0, 5, k, k);
       },
       StatusCode::INVALID_ARGUMENT, "k has 1 bytes"},
      {"append long data",
       [](ExtremesTest* t) {
         v1::Tensor k = F32Tensor(2, 1, 8, 1);
         k.mutable_data()->resize(1 << 20);
         return t->Append("c", 0, 5, k, k);
       },
       StatusCode::INVALID_ARGUMENT, "k has 1048576 bytes"},
      {"append to an empty id", [](ExtremesTest* t) { return t->AppendF32("", 0, 0, 1, 2, 8, 1); },
       StatusCode::NOT_FOUND, "cache '' not found"},
      {"append to a 1 MiB id",
       [&mib_id](ExtremesTest* t) { return t->AppendF32(mib_id, 0, 0, 1, 2, 8, 1); },
       StatusCode::NOT_FOUND, "(1048576 bytes) not found"},
      // Attend.
      {"attend over the cache at pos=2^63-1 (was SIGFPE)",
       [](ExtremesTest* t) { return t->Attend(t->Query(kI64Max)); }, StatusCode::INVALID_ARGUMENT,
       "pos=9223372036854775807 with 1 queries"},
      {"attend over the cache at pos=u64max",
       [](ExtremesTest* t) { return t->Attend(t->Query(kU64Max)); }, StatusCode::INVALID_ARGUMENT,
       "attend: pos=18446744073709551615"},
      {"attend layer=u32max",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.set_layer(kU32Max);
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "attend: layer=4294967295"},
      {"attend q [1, 2^48, 256, 128] empty, with k/v",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(5);
         req.mutable_q()->clear_shape();
         for (int64_t d : {int64_t{1}, int64_t{1} << 48, int64_t{256}, int64_t{128}})
           req.mutable_q()->add_shape(d);
         req.mutable_q()->clear_data();
         *req.mutable_k() = F32Tensor(2, 1, 8, 1);
         *req.mutable_v() = F32Tensor(2, 1, 8, 2);
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "q.shape=[1, 281474976710656, 256, 128]"},
      {"attend q heads 2^31",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.mutable_q()->set_shape(1, int64_t{1} << 31);
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "at most 64x"},
      {"attend scale=NaN",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.set_scale(std::nan(""));
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "scale=nan"},
      {"attend scale=-inf",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.set_scale(-INFINITY);
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "must be finite"},
      {"attend window=u32max reads, changes nothing",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.set_window(kU32Max);
         return t->Attend(req);
       },
       StatusCode::OK, ""},
      // Shared slices.
      {"slice offset=u64max",
       [](ExtremesTest* t) {
         return t->Append("c", 0, 5, t->Shared(t->ScratchOf(t->session_), kU64Max, 64),
                          t->Shared(t->ScratchOf(t->session_), 0, 64), t->session_);
       },
       StatusCode::INVALID_ARGUMENT, "lies outside the scratch region"},
      {"slice offset + length overflows",
       [](ExtremesTest* t) {
         return t->Append("c", 0, 5, t->Shared(t->ScratchOf(t->session_), k2To63, k2To63),
                          t->Shared(t->ScratchOf(t->session_), 0, 64), t->session_);
       },
       StatusCode::INVALID_ARGUMENT, "lies outside the scratch region"},
      {"slice of another session's region",
       [](ExtremesTest* t) {
         return t->Append("c", 0, 5, t->Shared(t->ScratchOf(t->other_), 0, 64),
                          t->Shared(t->ScratchOf(t->other_), 64, 64), t->session_);
       },
       StatusCode::PERMISSION_DENIED, "is not this session's scratch region"},
      {"slice of region 0 (a pool's id space)",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.mutable_out()->set_region_id(0);
         req.mutable_out()->set_length(64);
         return t->Attend(req, t->session_);
       },
       StatusCode::PERMISSION_DENIED, "attend: out: shared slice"},
  });
}

// A refusal once echoed an 8 KiB cache id whole: the trailer passed the client's metadata
// limit and tore down the connection, and with it the session's Attach stream.
TEST_F(ExtremesTest, ALongIdDoesNotTearDownTheCallersConnection) {
  const std::string id(8 << 10, 'z');
  EXPECT_THAT(AppendF32(id, 0, 0, 1, 2, 8, 1, session_), StatusIs(StatusCode::NOT_FOUND));
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(1, 2, 8);
  v1::AllocateResponse resp;
  EXPECT_TRUE(stub_->Allocate(Ctx(session_).get(), req, &resp).ok()) << "the session is gone";
}

}  // namespace
}  // namespace kvarena
