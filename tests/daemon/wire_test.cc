// proto/wire: every conversion round-trips, and decoded tensors borrow the message's bytes.
#include "proto/wire.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvarena {
namespace {

using ::testing::ElementsAre;

TEST(WireTest, DTypeRoundTrips) {
  for (DType d : {DType::kUnspecified, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    EXPECT_EQ(FromProto(ToProto(d)), d);
  }
  EXPECT_EQ(FromProto(static_cast<v1::DType>(42)), DType::kUnspecified);
}

TEST(WireTest, CacheInfoRoundTrips) {
  CacheInfo c;
  c.cache_id = "seq-1";
  c.spec = {3, 8, 128, DType::kBFloat16, 16, {0, 4096, 0}, 8192, "llama-3/tenant-7"};
  c.seq_len = 17;
  c.layer_lens = {17, 16, 17};
  c.layer_first_pos = {0, 16, 0};
  c.pool_id = 2;
  c.page_bytes = 65536;
  c.cached_tokens = 16;
  c.tokens_known = 20;
  v1::CacheInfo p;
  ToProto(c, &p);
  EXPECT_EQ(p.spec().dtype(), v1::BFLOAT16);
  const CacheInfo back = FromProto(p);
  EXPECT_EQ(back.cache_id, c.cache_id);
  EXPECT_EQ(back.spec.num_layers, 3);
  EXPECT_EQ(back.spec.num_kv_heads, 8);
  EXPECT_EQ(back.spec.head_dim, 128);
  EXPECT_EQ(back.spec.dtype, DType::kBFloat16);
  EXPECT_EQ(back.spec.page_size, 16);
  EXPECT_THAT(back.spec.layer_windows, ElementsAre(0, 4096, 0));
  EXPECT_EQ(back.spec.max_tokens, 8192);
  EXPECT_EQ(back.seq_len, 17);
  EXPECT_THAT(back.layer_lens, ElementsAre(17, 16, 17));
  EXPECT_THAT(back.layer_first_pos, ElementsAre(0, 16, 0));
  EXPECT_EQ(back.pool_id, 2u);
  EXPECT_EQ(back.page_bytes, 65536u);
  EXPECT_EQ(back.spec.prefix_namespace, "llama-3/tenant-7");
  EXPECT_EQ(back.cached_tokens, 16);
  EXPECT_EQ(back.tokens_known, 20);
}

TEST(WireTest, LocalPathMessagesRoundTrip) {
  const CacheTokens t = FromProto([] {
    v1::CacheTokens p;
    ToProto(CacheTokens{"c", 16}, &p);
    return p;
  }());
  EXPECT_EQ(t.cache_id, "c");
  EXPECT_EQ(t.tokens, 16);
  ReserveResult r;
  r.cache_id = "c";
  r.first_pos = 33;
  r.layers = {{32, 33, {7, 8}}, {16, 33, {3, 9}}};
  v1::CacheReservation p;
  ToProto(r, &p);
  const ReserveResult back = FromProto(p);
  EXPECT_EQ(back.cache_id, "c");
  EXPECT_EQ(back.first_pos, 33);
  ASSERT_EQ(back.layers.size(), 2u);
  EXPECT_EQ(back.layers[1].first_pos, 16);
  EXPECT_EQ(back.layers[1].len, 33);
  EXPECT_THAT(back.layers[1].page_ids, ElementsAre(3, 9));
}

TEST(WireTest, RegionInfoRoundTrips) {
  RegionInfo r;
  r.region_id = (uint64_t{1} << 32) + 3;
  r.kind = "host_memfd";
  r.size = 64 << 20;
  r.scratch = true;
  v1::RegionDescriptor p;
  ToProto(r, &p);
  const RegionInfo back = FromProto(p);
  EXPECT_EQ(back.region_id, r.region_id);
  EXPECT_EQ(back.kind, r.kind);
  EXPECT_EQ(back.size, r.size);
  EXPECT_TRUE(back.scratch);
}

TEST(WireTest, DecodedTensorBorrowsTheMessageBytes) {
  v1::Tensor p;
  p.add_shape(1);
  p.add_shape(2);
  p.add_shape(3);
  p.add_shape(4);
  p.set_dtype(v1::FLOAT16);
  p.set_data(std::string(48, 'x'));
  const TensorArg t = FromProto(p);
  EXPECT_EQ(t.data, p.data().data());
  EXPECT_EQ(t.bytes, 48u);
  EXPECT_EQ(t.dtype, DType::kFloat16);
  EXPECT_THAT(t.shape, ElementsAre(1, 2, 3, 4));
}

TEST(WireTest, AbsentOrSharedTensorDecodesAsAbsent) {
  const TensorArg absent = FromProto(v1::Tensor());
  EXPECT_EQ(absent.data, nullptr);
  EXPECT_EQ(absent.bytes, 0u);
  EXPECT_TRUE(absent.shape.empty());
  v1::Tensor shared;
  shared.mutable_shared()->set_region_id(3);
  EXPECT_EQ(FromProto(shared).data, nullptr);
}

TEST(WireTest, TensorsEncodeBothWays) {
  const std::string bytes(16, 'k');
  const TensorArg arg{DType::kFloat32, {1, 1, 1, 4}, bytes.data(), bytes.size()};
  v1::Tensor p;
  ToProto(arg, &p);
  EXPECT_EQ(p.data(), bytes);
  EXPECT_THAT(p.shape(), ElementsAre(1, 1, 1, 4));

  TensorOut out{DType::kFloat16, {1, 2, 1, 4}, std::string(16, 'v')};
  v1::Tensor q;
  ToProto(std::move(out), &q);
  const TensorOut back = TensorOutFromProto(q);
  EXPECT_EQ(back.dtype, DType::kFloat16);
  EXPECT_THAT(back.shape, ElementsAre(1, 2, 1, 4));
  EXPECT_EQ(back.data, std::string(16, 'v'));
}

TEST(WireTest, LayerPagesRoundTrip) {
  const LayerPages l{32, 40, {7, 9, 11}};
  v1::LayerPages p;
  ToProto(l, 5, &p);
  EXPECT_EQ(p.layer(), 5u);
  const LayerPages back = FromProto(p);
  EXPECT_EQ(back.first_pos, 32);
  EXPECT_EQ(back.len, 40);
  EXPECT_THAT(back.page_ids, ElementsAre(7, 9, 11));
}

TEST(WireTest, ArenaStatsRoundTrip) {
  ArenaStats s;
  s.pages = {100, 30, 70, 16, 480, 5, 6, 2, 30 * 4096, 9, 3};
  PoolStats pool;
  pool.pool_id = 1;
  pool.layout = {DType::kFloat16, 16, 8, 128};
  pool.page_bytes = 65536;
  pool.num_pages = 100;
  pool.pages_used = 30;
  pool.pages_free = 70;
  pool.chunks_committed = 1;
  pool.chunk_bytes = 2 << 20;
  pool.bytes_committed = 2 << 20;
  pool.num_caches = 4;
  s.pools = {pool};
  s.backend = "host";
  s.arena_bytes = 1 << 30;
  s.bytes_committed = 2 << 20;
  s.bytes_used = 30 * 65536;
  s.num_caches = 4;
  s.num_sessions = 2;
  v1::StatsResponse p;
  ToProto(s, &p);
  v1::StatsResponse again;
  ToProto(FromProto(p), &again);
  EXPECT_EQ(p.SerializeAsString(), again.SerializeAsString());
  EXPECT_EQ(p.pages().pages_evicted(), 9u);
  EXPECT_EQ(p.pools(0).dtype(), v1::FLOAT16);
  EXPECT_EQ(p.pools(0).num_kv_heads(), 8u);
  EXPECT_EQ(p.num_sessions(), 2u);
}

}  // namespace
}  // namespace kvarena
