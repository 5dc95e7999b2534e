// Requests at the extremes of their types, each one a way the store used to be knocked
// over or made to hand out bytes: every one is refused with the specific code, changes
// nothing, and leaves the page accounting whole.
#include <cstdint>
#include <limits>

#include "core/store_fixture.h"
#include "core/validate.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using Code = absl::StatusCode;

constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();

class BoundaryTest : public StoreTest {
 protected:
  // A float32 cache of 2 layers, 2 kv heads, head_dim 8, page 4, holding 5 tokens per layer.
  void SetUp() override {
    StoreTest::SetUp();
    id_ = Alloc(Spec(2, 2, 8));
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(AppendRandom(id_, l, 5).ok());
    before_ = Snap(id_);
  }
  void ExpectUnchanged() {
    EXPECT_TRUE(Snap(id_) == before_);
    EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
  }
  template <typename T>
  void ExpectRefused(const T& result, Code code, const std::string& message) {
    EXPECT_THAT(result, StatusIs(code));
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(message));
    ExpectUnchanged();
  }
  AttendArgs Query(int64_t pos, int64_t q_heads, int64_t n) {
    q_ = RandomTensor(rng_, DType::kFloat32, q_heads, n, 8);
    out_.assign(q_.bytes.size(), 0);
    AttendArgs a;
    a.cache_id = id_;
    a.pos = pos;
    a.q = q_.Arg();
    return a;
  }
  absl::StatusOr<AttendResult> Attend(const AttendArgs& a) {
    return store_->Attend("", a, out_.data(), out_.size());
  }

  std::string id_;
  Snapshot before_;
  OwnedTensor q_;
  std::vector<uint8_t> out_;
};

// Commit of 2^63-1 tokens once made seq + tokens wrap, and the next Append at that
// position wrote through a negative block index.
TEST_F(BoundaryTest, CommitNearInt64MaxIsRefused) {
  const std::string c = Alloc(Spec(1, 2, 8));
  ASSERT_TRUE(store_->Reserve("", {{c, 4}}).ok());
  const Snapshot reserved = Snap(c);
  for (int64_t tokens : {kMax64, kMax64 - 3, int64_t{1} << 62}) {
    SCOPED_TRACE(tokens);
    auto r = store_->Commit("", {{c, tokens}});
    EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(absl::StrCat("tokens=", tokens)));
  }
  EXPECT_TRUE(Snap(c) == reserved);
  ASSERT_TRUE(AppendRandom(c, 0, 1).ok());  // still the dense position 0
}

TEST_F(BoundaryTest, ReserveOfHugeCountsIsRefusedBeforeTakingPages) {
  const std::string c = Alloc(Spec(2, 2, 8));
  for (int64_t tokens : {kMax64, int64_t{1} << 40, int64_t{1} << 21}) {
    SCOPED_TRACE(tokens);
    EXPECT_THAT(store_->Reserve("", {{id_, 1}, {c, tokens}}), StatusIs(Code::kInvalidArgument));
  }
  ExpectUnchanged();
  EXPECT_EQ(store_->CacheStats(c)->pages_used, 0);
}

// Attend over the cache at pos near 2^63 once wrapped pos + n past the length check: the
// planner divided by zero (SIGFPE with two kv heads) or read far out of the table.
TEST_F(BoundaryTest, AttendOverTheCacheAtHugePositionsIsRefused) {
  for (int64_t pos : {kMax64, kMax64 - 1, int64_t{1} << 62, int64_t{5}, int64_t{-1}}) {
    SCOPED_TRACE(pos);
    ExpectRefused(Attend(Query(pos, 2, 1)), Code::kInvalidArgument, "layer 0 holds 5 tokens");
  }
}

TEST_F(BoundaryTest, AttendWithKvAtHugePositionsIsRefused) {
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 1, 8);
  AttendArgs a = Query(kMax64, 2, 1);
  a.k = k.Arg();
  a.v = k.Arg();
  ExpectRefused(Attend(a), Code::kInvalidArgument, "pos=9223372036854775807 but layer 0 holds 5");
}

// A q shape whose byte count wraps to 0 once passed the checks with empty data, after
// k and v were appended; the planner then divided by zero.
TEST_F(BoundaryTest, ShapesWhoseByteCountWrapsAreRefused) {
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 1, 8);
  struct Case {
    std::vector<int64_t> shape;
    const char* message;
  };
  const Case cases[] = {
      {{1, int64_t{1} << 48, 256, 128}, "q.shape=[1, 281474976710656, 256, 128]"},
      {{1, 2, int64_t{1} << 62, 8}, "tokens=4611686018427387904"},
      {{1, 2, kMax64, 8}, "tokens=9223372036854775807"},
      {{1, 2, -1, 8}, "tokens=-1"},
      {{1, -2, 1, 8}, "q.shape=[1, -2, 1, 8]"},
      {{1, int64_t{2} << 31, 1, 8}, "at most 64x"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    AttendArgs a;
    a.cache_id = id_;
    a.pos = 5;
    a.q = TensorArg{DType::kFloat32, c.shape, nullptr, 0};
    a.k = k.Arg();
    a.v = k.Arg();
    std::vector<uint8_t> out(16);
    auto r = store_->Attend("", a, out.data(), 0);
    EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
    ExpectUnchanged();
  }
  TensorArg wrapping_k{DType::kFloat32, {1, 2, int64_t{1} << 61, 8}, nullptr, 0};
  ExpectRefused(store_->Append("", id_, 0, 5, wrapping_k, wrapping_k), Code::kInvalidArgument,
                "tokens=2305843009213693952");
}

TEST_F(BoundaryTest, PopnOfAnyCountPastSeqLenIsARefusal) {
  for (uint64_t n : {uint64_t{6}, uint64_t{1} << 63, std::numeric_limits<uint64_t>::max()}) {
    SCOPED_TRACE(n);
    auto r = store_->Popn("", id_, n);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->popped, 0);
    EXPECT_EQ(r->refusal, absl::StrCat("popn: n=", n, " but seq_len=5"));
    ExpectUnchanged();
  }
}

TEST_F(BoundaryTest, SpecsAtTheExtremesAreRefused) {
  struct Case {
    CacheSpec spec;
    const char* message;
  };
  const Case cases[] = {
      {Spec(kMaxLayers + 1, 2, 8), "num_layers=1025 must be in [1, 1024]"},
      {Spec(2, -1, 8), "num_kv_heads=-1"},
      {Spec(2, 2, 8, DType::kFloat32, {-5, 0}), "layer_windows[0]=-5"},
      {Spec(2, 2, 8, DType::kFloat32, {}, kMax64), "max_tokens=9223372036854775807"},
      {Spec(2, 2, 8, DType::kFloat32, {}, -1), "max_tokens=-1"},
      {Spec(2, 2, 8, DType::kFloat32, {}, 0, kMaxPageSize + 1), "page_size=4097"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    auto r = store_->Allocate("", c.spec, "");
    EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
  EXPECT_EQ(store_->Stats().num_caches, 1);
  ExpectUnchanged();
}

TEST_F(BoundaryTest, CallerStringsAreEchoedOnlyAsAShortPrefix) {
  const std::string long_id(1 << 20, 'x');
  auto r = store_->Append("", long_id, 0, 0, TensorArg{}, TensorArg{});
  EXPECT_THAT(r, StatusIs(Code::kNotFound));
  EXPECT_LT(r.status().message().size(), 200u);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("(1048576 bytes)"));
  auto a = store_->Allocate("", Spec(1, 2, 8), long_id);
  EXPECT_THAT(a, StatusIs(Code::kInvalidArgument));
  EXPECT_LT(a.status().message().size(), 200u);
  ExpectUnchanged();
}

// Page ids are int32: a host arena above 8 GiB with 4-byte pages once numbered pages past
// INT32_MAX. The pool now stops at INT32_MAX pages, however large the budget.
TEST_F(BoundaryTest, TinyPagesOnAHugeArenaKeepPageIdsInInt32) {
  MakeStore(Options(size_t{16} << 30));  // reserved, never committed: MAP_NORESERVE
  CacheSpec tiny = Spec(1, 1, 1, DType::kBFloat16, {}, 0, 1);  // 4-byte pages
  const std::string c = Alloc(tiny);
  ASSERT_TRUE(AppendRandom(c, 0, 3).ok());
  const ArenaStats s = store_->Stats();
  ASSERT_EQ(s.pools.size(), 1u);
  EXPECT_LE(s.pools[0].num_pages, std::numeric_limits<int32_t>::max());
  auto d = store_->Describe("", c);
  for (int32_t id : d->layers[0].page_ids) EXPECT_GE(id, 0);
}

}  // namespace
}  // namespace kvarena
