// The tier chunk's codec (core/tier_chunk.h): round trips over geometries and sliding-layer
// tails, the key, and every way a value from a disk or a network can be wrong — each a
// DATA_LOSS naming the field.
#include "core/tier_chunk.h"

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/little_endian.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_seed.h"

namespace kvarena {
namespace {

using ::kvarena::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

ChunkIdentity MakeIdentity(PageLayout layout, int num_layers, int chunk_pages, uint32_t salt) {
  ChunkIdentity id;
  id.tenant = "acme";
  id.prefix_namespace = "llama-3-8b";
  id.layout = layout;
  id.num_layers = num_layers;
  id.chunk_pages = chunk_pages;
  id.first_block = 3 * int64_t(chunk_pages);
  for (int i = 0; i < chunk_pages * layout.page_size; ++i) {
    id.tokens.push_back(int32_t(salt * 1000 + uint32_t(i)));
  }
  id.parent_hash = Hash128{0x1111 + salt, 0x2222};
  id.last_hash = PrefixPageHash(id.parent_hash, id.tokens.data(), int(id.tokens.size()));
  return id;
}

// The bytes of page `block` of `layer`: every byte names its (layer, block, offset).
std::string PageFill(const ChunkIdentity& id, int layer, int block) {
  std::string p(id.layout.PageBytes(), '\0');
  for (size_t i = 0; i < p.size(); ++i) p[i] = char(layer * 31 + block * 7 + int(i) * 13);
  return p;
}

std::string Payload(const ChunkIdentity& id, const std::vector<int32_t>& first_page) {
  std::string payload;
  for (int l = 0; l < id.num_layers; ++l) {
    for (int b = first_page[size_t(l)]; b < id.chunk_pages; ++b) payload += PageFill(id, l, b);
  }
  return payload;
}

std::string Encode(const ChunkIdentity& id, const std::vector<int32_t>& first_page) {
  return EncodeChunk(id, first_page, Payload(id, first_page));
}

// Rewrites the trailing checksum so a hand-edited value passes it.
void Reseal(std::string* v) {
  v->resize(v->size() - 8);
  PutU64(v, XXH3_64bits(v->data(), v->size()));
}

// Offset of first_page[0] in an encoded chunk of id.
size_t FirstPageOffset(const ChunkIdentity& id) {
  return 8 + 4 + 8 * 4 + 8 + 8 + 4 + id.tenant.size() + 4 + id.prefix_namespace.size() + 32 +
         4 * id.tokens.size();
}

class TierChunkTest : public ::testing::Test {
 protected:
  ChunkIdentity id_ = MakeIdentity(PageLayout{DType::kFloat16, 4, 2, 8}, 3, 2, 1);
  std::vector<int32_t> first_page_ = {0, 1, 2};  // full, a sliding tail, none
};

TEST_F(TierChunkTest, RoundTripsEveryGeometryAndFirstPageMix) {
  struct Case {
    PageLayout layout;
    int num_layers;
    int chunk_pages;
    std::vector<int32_t> first_page;
  };
  const std::vector<Case> cases = {
      {PageLayout{DType::kFloat32, 1, 1, 1}, 1, 1, {0}},
      {PageLayout{DType::kFloat16, 4, 2, 8}, 3, 2, {0, 1, 2}},
      {PageLayout{DType::kBFloat16, 16, 4, 16}, 4, 3, {0, 0, 0, 0}},
      {PageLayout{DType::kBFloat16, 16, 4, 16}, 4, 3, {3, 0, 2, 1}},
      {PageLayout{DType::kFloat32, 8, 1, 4}, 2, 5, {5, 5}},  // no layer holds a page
      {PageLayout{DType::kFloat16, 2, 3, 6}, 5, 4, {0, 4, 1, 4, 3}},
  };
  for (const Case& c : cases) {
    const ChunkIdentity id = MakeIdentity(c.layout, c.num_layers, c.chunk_pages, 7);
    SCOPED_TRACE(::testing::Message() << DTypeName(c.layout.dtype) << " page_size="
                                      << c.layout.page_size << " P=" << c.chunk_pages);
    const std::string payload = Payload(id, c.first_page);
    ASSERT_EQ(ChunkPayloadBytes(id, c.first_page), payload.size());
    const std::string v = EncodeChunk(id, c.first_page, payload);
    DecodedChunk d;
    ASSERT_TRUE(DecodeChunk(v, id, &d).ok()) << DecodeChunk(v, id, &d);
    EXPECT_EQ(d.first_page, c.first_page);
    EXPECT_EQ(d.payload, payload);
    EXPECT_GE(d.payload.data(), v.data());  // a view into the value
    EXPECT_LE(d.payload.data() + d.payload.size(), v.data() + v.size());
    for (int l = 0; l < id.num_layers; ++l) {
      for (int b = c.first_page[size_t(l)]; b < id.chunk_pages; ++b) {
        const std::string want = PageFill(id, l, b);
        EXPECT_EQ(std::memcmp(d.Page(id, l, b), want.data(), want.size()), 0)
            << "layer " << l << " block " << b;
      }
    }
  }
}

TEST_F(TierChunkTest, KeyIsXxh3OfTheDocumentedBytes) {
  std::string b = "kvarena.chunk.v3";
  PutU32(&b, uint32_t(id_.chunk_pages));
  PutU32(&b, 4);
  b += "acme";
  PutU64(&b, id_.last_hash.low);
  PutU64(&b, id_.last_hash.high);
  const XXH128_hash_t h = XXH3_128bits(b.data(), b.size());
  EXPECT_EQ(id_.key(), (Hash128{h.low64, h.high64}));
  const int32_t p = id_.chunk_pages;
  EXPECT_EQ(ChunkKeyOf("acme", p, id_.last_hash), id_.key());
  EXPECT_NE(ChunkKeyOf("other", p, id_.last_hash), id_.key());
  EXPECT_NE(ChunkKeyOf("", p, id_.last_hash), id_.key());
  EXPECT_NE(ChunkKeyOf("acme", p, id_.parent_hash), id_.key());
  EXPECT_NE(ChunkKeyOf("acme", p + 1, id_.last_hash), id_.key());
}

TEST_F(TierChunkTest, EveryIdentityFieldThatDiffersIsNamed) {
  const std::string v = Encode(id_, first_page_);
  struct Case {
    const char* field;
    std::function<void(ChunkIdentity*)> change;
    std::vector<const char*> words;  // the field and both values
  };
  const auto retoken = [](ChunkIdentity* w) {
    w->tokens.resize(size_t(w->chunk_pages) * size_t(w->layout.page_size));
  };
  const std::vector<Case> cases = {
      {"dtype", [](ChunkIdentity* w) { w->layout.dtype = DType::kBFloat16; }, {"is 2", "want 3"}},
      {"kv_format",
       [](ChunkIdentity* w) { w->layout.kv_format = KvFormat::kBFloat16; },
       {"is 2", "want 3"}},
      {"page_size",
       [&](ChunkIdentity* w) {
         w->layout.page_size = 8;
         retoken(w);
       },
       {"is 4", "want 8"}},
      {"num_kv_heads", [](ChunkIdentity* w) { w->layout.num_kv_heads = 4; }, {"is 2", "want 4"}},
      {"head_dim", [](ChunkIdentity* w) { w->layout.head_dim = 16; }, {"is 8", "want 16"}},
      {"num_layers", [](ChunkIdentity* w) { w->num_layers = 30; }, {"is 3", "want 30"}},
      {"chunk_pages",
       [&](ChunkIdentity* w) {
         w->chunk_pages = 4;
         retoken(w);
       },
       {"is 2", "want 4"}},
      {"scales_digest", [](ChunkIdentity* w) { w->scales_digest = 5; }, {"is 0", "want 5"}},
      {"first_block", [](ChunkIdentity* w) { w->first_block = 8; }, {"is 6", "want 8"}},
      {"tenant", [](ChunkIdentity* w) { w->tenant = "acme2"; }, {"'acme'", "'acme2'"}},
      {"namespace", [](ChunkIdentity* w) { w->prefix_namespace = "m"; }, {"'llama-3-8b'", "'m'"}},
      {"parent_hash",
       [](ChunkIdentity* w) { w->parent_hash.high ^= 1; },
       {"0000000000002222", "0000000000002223"}},
      {"last_hash", [](ChunkIdentity* w) { w->last_hash.low ^= 1; }, {}},
      {"token[5]", [](ChunkIdentity* w) { w->tokens[5] = -9; }, {"is 1005", "want -9"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    ChunkIdentity want = id_;
    c.change(&want);
    DecodedChunk d;
    const absl::Status s = DecodeChunk(v, want, &d);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(c.field)));
    for (const char* w : c.words) EXPECT_THAT(std::string(s.message()), HasSubstr(w));
    EXPECT_TRUE(d.first_page.empty());  // nothing handed out
  }
}

TEST_F(TierChunkTest, MagicAndVersionAreChecked) {
  DecodedChunk d;
  std::string bad_magic = Encode(id_, first_page_);
  bad_magic[7] = '2';
  Reseal(&bad_magic);
  EXPECT_THAT(
      DecodeChunk(bad_magic, id_, &d),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("magic"), HasSubstr("KVACHNK2"))));
  std::string bad_version = Encode(id_, first_page_);
  bad_version[8] = char(kChunkFormatVersion - 1);
  Reseal(&bad_version);
  EXPECT_THAT(DecodeChunk(bad_version, id_, &d),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(absl::StrCat("format version is ", kChunkFormatVersion - 1)),
                             HasSubstr(absl::StrCat("want ", kChunkFormatVersion)))));
}

TEST_F(TierChunkTest, EveryTruncationIsDataLoss) {
  const std::string v = Encode(id_, first_page_);
  for (size_t n = 0; n < v.size(); ++n) {
    DecodedChunk d;
    EXPECT_THAT(DecodeChunk(absl::string_view(v).substr(0, n), id_, &d),
                StatusIs(absl::StatusCode::kDataLoss))
        << "length " << n << " of " << v.size();
  }
}

TEST_F(TierChunkTest, EveryFlippedBitOfASmallChunkIsDataLoss) {
  const std::string v = Encode(id_, first_page_);
  for (size_t bit = 0; bit < 8 * v.size(); ++bit) {
    std::string bad = v;
    bad[bit / 8] = char(bad[bit / 8] ^ (1 << (bit % 8)));
    DecodedChunk d;
    EXPECT_THAT(DecodeChunk(bad, id_, &d), StatusIs(absl::StatusCode::kDataLoss)) << "bit " << bit;
  }
}

TEST_F(TierChunkTest, RandomFlippedBitsOfALargeChunkAreDataLoss) {
  const ChunkIdentity id = MakeIdentity(PageLayout{DType::kFloat16, 16, 8, 64}, 4, 4, 3);
  const std::string v = Encode(id, {0, 1, 2, 4});
  std::mt19937_64 rng(::kvarena::testing::TestSeed());
  for (int i = 0; i < 2000; ++i) {
    const size_t bit = rng() % (8 * v.size());
    std::string bad = v;
    bad[bit / 8] = char(bad[bit / 8] ^ (1 << (bit % 8)));
    DecodedChunk d;
    EXPECT_THAT(DecodeChunk(bad, id, &d), StatusIs(absl::StatusCode::kDataLoss)) << "bit " << bit;
  }
}

TEST_F(TierChunkTest, FirstPageOutOfRangeIsDataLoss) {
  for (uint32_t f : {3u, 0x80000000u, 0xffffffffu}) {
    std::string v = Encode(id_, first_page_);
    const size_t at = FirstPageOffset(id_) + 4;  // layer 1
    ASSERT_EQ(LoadU32(v.data() + at), 1u);
    for (int i = 0; i < 4; ++i) v[at + size_t(i)] = char(f >> (8 * i));
    Reseal(&v);
    DecodedChunk d;
    EXPECT_THAT(
        DecodeChunk(v, id_, &d),
        StatusIs(absl::StatusCode::kDataLoss,
                 AllOf(HasSubstr("first_page[1] is " + std::to_string(f)), HasSubstr("[0, 2]"))));
  }
}

TEST_F(TierChunkTest, FirstPageThatDisagreesWithThePayloadIsDataLoss) {
  std::string v = Encode(id_, first_page_);
  v[FirstPageOffset(id_) + 4] = 0;  // layer 1 claims a page the payload lacks
  Reseal(&v);
  DecodedChunk d;
  EXPECT_THAT(DecodeChunk(v, id_, &d),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
}

TEST_F(TierChunkTest, TrailingBytesAreDataLoss) {
  for (const std::string& extra : {std::string("x"), std::string(4096, '\0')}) {
    std::string v = Encode(id_, first_page_) + extra;
    Reseal(&v);
    DecodedChunk d;
    EXPECT_THAT(DecodeChunk(v, id_, &d),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("trailing bytes")));
  }
}

TEST_F(TierChunkTest, AChunkOfAnotherPrefixIsRefused) {
  // A store that hands back another prefix's chunk under this key (a swapped file, a
  // colliding key): other tokens, or the same tokens under another parent.
  ChunkIdentity other_tokens = MakeIdentity(id_.layout, id_.num_layers, id_.chunk_pages, 2);
  other_tokens.parent_hash = id_.parent_hash;
  other_tokens.last_hash = id_.last_hash;
  ChunkIdentity other_parent = id_;
  other_parent.parent_hash = Hash128{0x9999, 0x2222};
  const ChunkIdentity other_prefix = MakeIdentity(id_.layout, id_.num_layers, id_.chunk_pages, 5);
  DecodedChunk d;
  EXPECT_THAT(DecodeChunk(Encode(other_tokens, first_page_), id_, &d),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("token[0] is 2000, want 1000")));
  EXPECT_THAT(DecodeChunk(Encode(other_parent, first_page_), id_, &d),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("parent_hash")));
  EXPECT_THAT(DecodeChunk(Encode(other_prefix, first_page_), id_, &d),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("parent_hash")));
  ChunkIdentity other_tenant = id_;
  other_tenant.tenant = "evil";
  EXPECT_THAT(DecodeChunk(Encode(other_tenant, first_page_), id_, &d),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tenant is 'evil'")));
}

TEST_F(TierChunkTest, AMalformedIdentityToVerifyAgainstIsInvalidArgument) {
  const std::string v = Encode(id_, first_page_);
  ChunkIdentity want = id_;
  want.tokens.pop_back();
  DecodedChunk d;
  EXPECT_THAT(DecodeChunk(v, want, &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens=7")));
  want = id_;
  want.chunk_pages = 0;
  EXPECT_THAT(DecodeChunk(v, want, &d), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DefaultChunkPagesTest, FewestPagesThatReachMinBytes) {
  // Llama-3-8B, float16: 2 * 16 * 8 * 128 * 2 = 64 KiB a page, 32 layers: 2 MiB a block.
  EXPECT_EQ(DefaultChunkPages(64 << 10, 32), 1);
  EXPECT_EQ(DefaultChunkPages(4096, 2), 32);       // 8 KiB a block: exactly 256 KiB
  EXPECT_EQ(DefaultChunkPages(4096, 2, 8193), 2);  // one byte more takes another page
  EXPECT_EQ(DefaultChunkPages(3000, 1), 88);       // ceil(262144 / 3000)
  EXPECT_EQ(DefaultChunkPages(1024, 4, 1 << 20), 256);
  EXPECT_EQ(DefaultChunkPages(1024, 4, 0), 1);  // at least one page
  EXPECT_EQ(DefaultChunkPages(0, 4), 1);
  EXPECT_EQ(DefaultChunkPages(1024, 0), 1);
  EXPECT_EQ(DefaultChunkPages(SIZE_MAX / 2, 4), 1);  // the product would overflow
  EXPECT_EQ(DefaultChunkPages(1, 1, SIZE_MAX), std::numeric_limits<int32_t>::max());
}

}  // namespace
}  // namespace kvarena
