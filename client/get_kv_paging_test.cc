// get_kv pages a layer through GetKv ranges (against "inproc:", whose store refuses a
// reply above ClientOptions::max_message_bytes as kvarenad refuses one above
// --max_message_bytes): the pages concatenate per head into exactly what was appended,
// global and sliding layers alike, and Connect rejects a limit it cannot page under.
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kv_quant.h"
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

// The spec both tests read back: 2 layers of 4 kv heads x 128, page 16, layer 1 sliding
// (a window of 700, whose kept tail starts mid-chunk).
CacheSpec PagingSpec(KvFormat format) {
  CacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = kKvHeads;
  spec.head_dim = kHeadDim;
  spec.dtype = DType::kFloat16;
  spec.kv_format = format;
  spec.page_size = 16;
  spec.layer_windows = {0, 700};
  return spec;
}

// Allocates spec and appends 3000 random tokens to each layer (6 MiB of float16 K+V a
// layer), in appends of uneven sizes; history[layer] gets what was appended.
void Fill(Client& client, const CacheSpec& spec, uint64_t seed,
          std::shared_ptr<GenericKvCacheHandle>* h, std::vector<KvHistory>* history) {
  std::mt19937_64 rng(seed);
  auto made = client.Allocate(spec);
  ASSERT_THAT(made, IsOk());
  *h = *made;
  history->assign(2, KvHistory(kKvHeads, kHeadDim));
  for (int64_t n : {1000, 1, 999, 500, 500}) {
    for (int layer = 0; layer < 2; ++layer) {
      HostTensor k = testing::RandomTensor(rng, spec.dtype, kKvHeads, n, kHeadDim);
      HostTensor v = testing::RandomTensor(rng, spec.dtype, kKvHeads, n, kHeadDim);
      ASSERT_THAT((*h)->append(layer, k.arg(), v.arg()), IsOk());
      (*history)[size_t(layer)].Append(k, v);
    }
  }
}

TEST(GetKvPagingTest, LayersAboveTheReplyLimitComeBackWhole) {
  auto client = Connect(size_t{1} << 20);  // chunks of 512 KiB of K+V: 128 fp16 tokens here
  ASSERT_NE(client, nullptr);
  const CacheSpec spec = PagingSpec(KvFormat::kUnspecified);
  std::shared_ptr<GenericKvCacheHandle> h;
  std::vector<KvHistory> history;
  ASSERT_NO_FATAL_FAILURE(Fill(*client, spec, 17, &h, &history));
  for (int layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE(layer);
    auto kv = h->get_kv(layer);
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
    auto local = h->get_kv_local(layer);  // one gather through the mapping, no paging
    ASSERT_THAT(local, IsOk());
    EXPECT_EQ(local->first_pos, kv->first_pos);
    EXPECT_EQ(local->k.data, kv->k.data);
    EXPECT_EQ(local->v.data, kv->v.data);
  }
}

// What the encoders (kernels/kv_quant.h) make of one part (K or V) of a head-major layer
// [heads][n][head_dim]: its codes, its per-token scales ([heads][n] float32, int8 only) and
// the values they read back as, in spec.dtype.
struct Encoded {
  std::string codes, scales, values;
};
Encoded Encode(const CacheSpec& spec, int layer, int kv, const std::vector<double>& x) {
  const int dim = int(spec.head_dim);
  const size_t rows = x.size() / size_t(dim), per_head = rows / spec.num_kv_heads;
  Encoded e;
  e.codes.resize(x.size());
  std::vector<float> row(static_cast<size_t>(dim)), back(static_cast<size_t>(dim));
  std::vector<double> values;
  for (size_t r = 0; r < rows; ++r) {
    for (int d = 0; d < dim; ++d) row[size_t(d)] = float(x[r * size_t(dim) + size_t(d)]);
    char* codes = e.codes.data() + r * size_t(dim);
    if (spec.kv_format == KvFormat::kInt8) {
      const float scale = Int8Scale(row.data(), dim);
      QuantizeInt8(row.data(), dim, scale, reinterpret_cast<int8_t*>(codes));
      DequantizeInt8(reinterpret_cast<int8_t*>(codes), dim, scale, back.data());
      e.scales.append(reinterpret_cast<const char*>(&scale), sizeof(scale));
    } else {
      const size_t h = size_t(layer) * spec.num_kv_heads + r / per_head;
      const float scale = (kv == 0 ? spec.k_scales : spec.v_scales)[h];
      QuantizeFp8E4M3(row.data(), dim, scale, reinterpret_cast<uint8_t*>(codes));
      DequantizeFp8E4M3(reinterpret_cast<uint8_t*>(codes), dim, scale, back.data());
    }
    values.insert(values.end(), back.begin(), back.end());
  }
  e.values = testing::EncodeValues(values, spec.dtype);
  return e;
}

// Raw reads of quantized layers page the same way: codes and per-token scales concatenate
// per head into exactly what the encoders make of what was appended, equal get_kv_local's
// one read, and read back (code x scale) as get_kv's values bit for bit.
TEST(GetKvPagingTest, RawQuantizedLayersComeBackWholeAsEncoded) {
  for (KvFormat format : {KvFormat::kInt8, KvFormat::kFp8E4M3}) {
    SCOPED_TRACE(KvFormatName(format));
    // A layer's raw bytes (int8: 3000 x 2 x 528) are above the store's 1 MiB reply limit,
    // so reads that succeed paged (int8: chunks of 496 tokens).
    auto client = Connect(size_t{1} << 20);
    ASSERT_NE(client, nullptr);
    CacheSpec spec = PagingSpec(format);
    if (format == KvFormat::kFp8E4M3) {  // [layer][head]; 2^-3 saturates some values
      spec.k_scales = {0.5f, 1, 2, 0.125f, 1, 1, 0.25f, 4};
      spec.v_scales = {1, 0.5f, 3, 1, 2, 1, 1, 0.75f};
    }
    std::shared_ptr<GenericKvCacheHandle> h;
    std::vector<KvHistory> history;
    ASSERT_NO_FATAL_FAILURE(Fill(*client, spec, 23, &h, &history));
    for (int layer = 0; layer < 2; ++layer) {
      SCOPED_TRACE(layer);
      auto raw = h->get_kv(layer, /*raw=*/true);
      auto values = h->get_kv(layer);
      auto local = h->get_kv_local(layer, /*raw=*/true);
      ASSERT_THAT(raw, IsOk());
      ASSERT_THAT(values, IsOk());
      ASSERT_THAT(local, IsOk());
      EXPECT_EQ(raw->kv_format, format);
      EXPECT_EQ(values->kv_format, KvFormat::kFloat16);
      EXPECT_EQ(raw->first_pos, values->first_pos);
      const int64_t n = 3000 - raw->first_pos;
      EXPECT_EQ(raw->k.dtype, DType::kUnspecified);
      EXPECT_EQ(raw->k.shape, (std::vector<int64_t>{1, kKvHeads, n, kHeadDim}));
      const TensorOut* parts[2][3] = {{&raw->k, &raw->k_scales, &values->k},
                                      {&raw->v, &raw->v_scales, &values->v}};
      for (int kv = 0; kv < 2; ++kv) {
        SCOPED_TRACE(kv == 0 ? "k" : "v");
        const Encoded want = Encode(spec, layer, kv, history[layer].HeadMajor(kv, raw->first_pos));
        EXPECT_TRUE(parts[kv][0]->data == want.codes);
        EXPECT_TRUE(parts[kv][2]->data == want.values);
        if (format == KvFormat::kInt8) {
          EXPECT_EQ(parts[kv][1]->shape, (std::vector<int64_t>{1, kKvHeads, n}));
          EXPECT_TRUE(parts[kv][1]->data == want.scales);
        } else {  // the layer's static scales
          const std::vector<float>& s = kv == 0 ? spec.k_scales : spec.v_scales;
          EXPECT_EQ(parts[kv][1]->shape, (std::vector<int64_t>{kKvHeads}));
          EXPECT_EQ(parts[kv][1]->data,
                    std::string(reinterpret_cast<const char*>(s.data() + layer * kKvHeads),
                                kKvHeads * sizeof(float)));
        }
      }
      for (auto [a, b] : {std::pair{&raw->k, &local->k},
                          {&raw->v, &local->v},
                          {&raw->k_scales, &local->k_scales},
                          {&raw->v_scales, &local->v_scales}}) {
        EXPECT_TRUE(a->data == b->data && a->shape == b->shape);
      }
    }
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
