// The handle's prefix-reuse API against "inproc:": Allocate with a prompt, cached_tokens,
// set_tokens, fork, and the local path over adopted pages (its table loads with Describe).
#include <random>

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
using testing::StatusIs;

constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 16, kPage = 4;

class PrefixClientTest : public testing::InprocClientFixture<> {
 protected:
  PrefixClientTest() : InprocClientFixture(testing::InprocOptions(/*num_threads=*/0)) {}

  static CacheSpec PrefixSpec() {
    CacheSpec spec = testing::MakeSpec(kLayers, kKvHeads, kHeadDim, DType::kFloat32, kPage);
    spec.prefix_namespace = "client-test";
    return spec;
  }
  // The same K/V for the same (layer, first position, count): what two workers computing
  // one prompt write.
  static HostTensor Kv(int layer, int64_t from, int64_t n) {
    std::mt19937_64 rng(uint64_t(layer) * 1000003 + uint64_t(from) * 7919 + uint64_t(n));
    return testing::RandomTensor(rng, DType::kFloat32, kKvHeads, n, kHeadDim);
  }
};

TEST_F(PrefixClientTest, AHandleAdoptsAPrefixDeclaresTokensAndForks) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto a = client_->Allocate(PrefixSpec(), "", AllocateOptions{prompt});
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ((*a)->cached_tokens(), 0);
  for (int l = 0; l < kLayers; ++l) {
    for (int64_t from : {0, 4, 8}) {  // page by page, so b can compute its suffix the same way
      const int64_t n = from == 8 ? 2 : 4;
      HostTensor k = Kv(l, from, n), v = Kv(l + 10, from, n);
      ASSERT_THAT((*a)->append(l, k.arg(), v.arg()), IsOk());
    }
  }
  auto b = client_->Allocate(PrefixSpec(), "", AllocateOptions{prompt});
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*b)->cached_tokens(), 8);
  EXPECT_EQ((*b)->num_tokens(), 8);
  // The local path over the adopted pages: reserve, write the suffix, commit.
  ASSERT_THAT((*b)->reserve(2), IsOk());
  for (int l = 0; l < kLayers; ++l) {
    HostTensor k = Kv(l, 8, 2), v = Kv(l + 10, 8, 2);
    ASSERT_THAT((*b)->append_local(l, k.arg(), v.arg()), IsOk());
  }
  ASSERT_THAT((*b)->commit(2), IsOk());
  for (int l = 0; l < kLayers; ++l) {
    auto ka = (*a)->get_kv(l), kb = (*b)->get_kv(l);
    ASSERT_THAT(kb, IsOk());
    EXPECT_EQ(kb->k.data, ka->k.data);
    EXPECT_EQ(kb->v.data, ka->v.data);
    auto view = (*b)->key_cache(l);
    ASSERT_THAT(view, IsOk());
    EXPECT_EQ(view->page_ids.size(), 3u);
    EXPECT_EQ(view->page_ids[0], (*(*a)->key_cache(l)).page_ids[0]);  // the same page: shared
  }
  EXPECT_THAT((*a)->set_tokens(10, {11, 12}), IsOk());
  EXPECT_THAT((*a)->set_tokens(3, {99}), StatusIs(absl::StatusCode::kFailedPrecondition));
  auto f = (*a)->fork();
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ((*f)->num_tokens(), 10);
  EXPECT_EQ((*f)->cached_tokens(), 10);
  EXPECT_EQ((*(*f)->get_kv(1)).k.data, (*(*a)->get_kv(1)).k.data);
  auto popped = (*f)->popn(3);  // into a shared page: copy-on-write
  ASSERT_THAT(popped, IsOk());
  EXPECT_EQ(popped->popped, 3);
  EXPECT_EQ((*f)->cached_tokens(), 7);
  EXPECT_NE((*(*f)->key_cache(0)).page_ids[1], (*(*a)->key_cache(0)).page_ids[1]);
  auto st = client_->Stats();
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->pages.cow_copies, uint64_t(kLayers));
  EXPECT_EQ(st->pages.forks, 1u);
  for (auto* h : {&*a, &*b, &*f}) ASSERT_THAT((*h)->release(), IsOk());
  EXPECT_EQ(client_->Stats()->pages.pages_used, 0);
}

}  // namespace
}  // namespace kvarena
