// get_kv pages a layer through GetKv ranges (against "inproc:", whose store refuses a
// reply above ClientOptions::max_message_bytes as kvarenad refuses one above
// --max_message_bytes): the pages concatenate per head into exactly what was appended,
// global and sliding layers alike, and Connect rejects a limit it cannot page under.
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "tests/support/inproc_fixture.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using testing::HostTensor;
using testing::IsOk;
using testing::KvHistory;
using testing::StatusIs;

constexpr int kKvHeads = 4, kHeadDim = 128;

std::shared_ptr<Client> Connect(size_t max_message_bytes) {
  ClientOptions options = testing::InprocOptions(/*num_threads=*/1, size_t{128} << 20);
  options.max_message_bytes = max_message_bytes;
  auto c = Client::Connect("inproc:", options);
  EXPECT_THAT(c, IsOk());
  return c.ok() ? *c : nullptr;
}

TEST(GetKvPagingTest, LayersAboveTheReplyLimitComeBackWhole) {
  std::mt19937_64 rng(17);
  auto client = Connect(size_t{1} << 20);  // chunks of 512 KiB of K+V: 128 fp16 tokens here
  ASSERT_NE(client, nullptr);
  CacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = kKvHeads;
  spec.head_dim = kHeadDim;
  spec.dtype = DType::kFloat16;
  spec.page_size = 16;
  spec.layer_windows = {0, 700};  // layer 1 keeps a tail that starts mid-chunk
  auto h = client->Allocate(spec);
  ASSERT_THAT(h, IsOk());
  std::vector<KvHistory> history(2, KvHistory(kKvHeads, kHeadDim));
  // 3000 tokens: 6 MiB of K+V per layer, in appends of uneven sizes.
  for (int64_t n : {1000, 1, 999, 500, 500}) {
    for (int layer = 0; layer < 2; ++layer) {
      HostTensor k = testing::RandomTensor(rng, spec.dtype, kKvHeads, n, kHeadDim);
      HostTensor v = testing::RandomTensor(rng, spec.dtype, kKvHeads, n, kHeadDim);
      ASSERT_THAT((*h)->append(layer, k.arg(), v.arg()), IsOk());
      history[layer].Append(k, v);
    }
  }
  for (int layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE(layer);
    auto kv = (*h)->get_kv(layer);
    ASSERT_THAT(kv, IsOk());
    if (layer == 0) {
      EXPECT_EQ(kv->first_pos, 0);
    } else {  // whole pages from the window's tail, which evicted the first ones
      EXPECT_GT(kv->first_pos, 0);
      EXPECT_EQ(kv->first_pos % 16, 0);
    }
    EXPECT_EQ(kv->layer_len, 3000);
    const int64_t n = 3000 - kv->first_pos;
    EXPECT_EQ(kv->k.shape, (std::vector<int64_t>{1, kKvHeads, n, kHeadDim}));
    for (int part = 0; part < 2; ++part) {
      EXPECT_EQ((part == 0 ? kv->k : kv->v).data,
                testing::EncodeValues(history[layer].HeadMajor(part, kv->first_pos), spec.dtype))
          << (part == 0 ? "k" : "v");
    }
    auto local = (*h)->get_kv_local(layer);  // one gather through the mapping, no paging
    ASSERT_THAT(local, IsOk());
    EXPECT_EQ(local->first_pos, kv->first_pos);
    EXPECT_EQ(local->k.data, kv->k.data);
    EXPECT_EQ(local->v.data, kv->v.data);
  }
}

TEST(GetKvPagingTest, ConnectRejectsAMessageLimitOutOfRange) {
  for (size_t bytes : {size_t{0}, size_t{1} << 10, size_t{1} << 31}) {
    ClientOptions options;
    options.max_message_bytes = bytes;
    EXPECT_THAT(Client::Connect("inproc:", options), StatusIs(absl::StatusCode::kInvalidArgument))
        << bytes;
  }
}

}  // namespace
}  // namespace kvarena
