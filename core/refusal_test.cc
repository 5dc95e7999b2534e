// Refusal tags: they survive the context statuses gain on the way up, and each bound that
// core/bounds_test.cc does not sweep (max_tokens on every path, the arena) tags its
// RESOURCE_EXHAUSTED with the reason the daemon's metrics count.
#include "core/refusal.h"

#include <set>
#include <string>

#include "core/store_fixture.h"

namespace kvarena {
namespace {

using Code = absl::StatusCode;

TEST(RefusalTest, TagSurvivesAnnotation) {
  const absl::Status s = RefusedError(Refusal::kMaxCaches, "allocate: 5 caches");
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "allocate: 5 caches");
  EXPECT_EQ(RefusalOf(s), Refusal::kMaxCaches);
  const absl::Status wrapped = Annotated(Annotated(s, "pool: "), "reserve: ");
  EXPECT_EQ(wrapped.code(), Code::kResourceExhausted);
  EXPECT_EQ(wrapped.message(), "reserve: pool: allocate: 5 caches");
  EXPECT_EQ(RefusalOf(wrapped), Refusal::kMaxCaches);
  EXPECT_TRUE(Annotated(absl::OkStatus(), "x: ").ok());
}

TEST(RefusalTest, UntaggedOrOtherCodesAreOther) {
  EXPECT_EQ(RefusalOf(absl::ResourceExhaustedError("from somewhere else")), Refusal::kOther);
  EXPECT_EQ(RefusalOf(absl::OkStatus()), Refusal::kOther);
  absl::Status not_exhausted = RefusedError(Refusal::kArenaFull, "x");
  not_exhausted = absl::Status(Code::kInternal, "y");
  EXPECT_EQ(RefusalOf(not_exhausted), Refusal::kOther);
  EXPECT_EQ(RefusalOf(Annotated(absl::InvalidArgumentError("bad"), "p: ")), Refusal::kOther);
}

TEST(RefusalTest, NamesAreDistinctLabelValues) {
  std::set<std::string> names;
  for (int r = 0; r < kNumRefusals; ++r) {
    const std::string name = RefusalName(static_cast<Refusal>(r));
    SCOPED_TRACE(name);
    EXPECT_FALSE(name.empty());
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_"), std::string::npos);
    names.insert(name);
  }
  EXPECT_EQ(names.size(), size_t(kNumRefusals));
}

class StoreRefusalTest : public StoreTest {
 protected:
  static void ExpectReason(const absl::Status& s, Refusal reason) {
    EXPECT_THAT(s, StatusIs(Code::kResourceExhausted));
    EXPECT_STREQ(RefusalName(RefusalOf(s)), RefusalName(reason)) << s;
  }
};

TEST_F(StoreRefusalTest, MaxTokensOnEveryPath) {
  const std::string id = Alloc(Spec(1, 2, 8, DType::kFloat32, {}, /*max_tokens=*/6));
  ExpectReason(AppendRandom(id, 0, 7).status(), Refusal::kMaxTokens);
  ExpectReason(store_->Reserve("", {{id, 7}}).status(), Refusal::kMaxTokens);
  ASSERT_TRUE(store_->Reserve("", {{id, 6}}).ok());
  ExpectReason(store_->Commit("", {{id, 7}}).status(), Refusal::kMaxTokens);
}

TEST_F(StoreRefusalTest, ArenaFullOnAppendAndReserve) {
  MakeStore(kChunkGranularity);  // 4096 pages of 512 bytes
  const std::string id = Alloc(Spec(1, 2, 8));
  ExpectReason(AppendRandom(id, 0, 4097 * 4).status(), Refusal::kArenaFull);
  ExpectReason(store_->Reserve("", {{id, 4097 * 4}}).status(), Refusal::kArenaFull);
}

TEST_F(StoreRefusalTest, APageGeometryLargerThanTheArenaIsArenaFull) {
  MakeStore(kChunkGranularity);
  // 2 x 64 tokens x 64 heads x 128 dims x 4 bytes: 4 MiB pages, above a 2 MiB arena.
  CacheSpec big = Spec(1, 64, 128, DType::kFloat32, {}, 0, /*page_size=*/64);
  ExpectReason(store_->Allocate("", big, "").status(), Refusal::kArenaFull);
}

}  // namespace
}  // namespace kvarena
