// Randomized model test: a thousand random sequences of allocate / append / attend / popn / reset /
// release over several caches with mixed windows, checked after every operation against
// a plain vector-per-layer model, with the arena's page accounting audited each time.
#include <set>

#include "core/store_fixture.h"

namespace kvarena {
namespace {

class ModelTest : public StoreTest {
 protected:
  struct ModelCache {
    std::vector<int64_t> kept_from;  // per layer: positions below were evicted
  };

  void AllocateOne() {
    std::uniform_int_distribution<int> layers(1, 3), pick(0, 3);
    const int n = layers(rng_);
    std::vector<int> windows;
    for (int l = 0; l < n; ++l) windows.push_back(std::vector<int>{0, 0, 2, 5}[size_t(pick(rng_))]);
    const DType dtype = pick(rng_) == 0 ? DType::kBFloat16 : DType::kFloat32;
    const std::string id =
        Alloc(Spec(n, 2, 8, dtype, windows, 0, std::vector<int>{1, 2, 4, 8}[size_t(pick(rng_))]));
    model_[id] = ModelCache{std::vector<int64_t>(size_t(n), 0)};
  }

  std::string AnyCache() {
    auto it = model_.begin();
    std::advance(it, std::uniform_int_distribution<size_t>(0, model_.size() - 1)(rng_));
    return it->first;
  }

  void AppendOne(const std::string& id) {
    const CacheSpec& s = specs_[id];
    const int layer = std::uniform_int_distribution<int>(0, s.num_layers - 1)(rng_);
    const int64_t start = int64_t(refs_[id][size_t(layer)].k.size());
    ASSERT_TRUE(AppendRandom(id, layer, std::uniform_int_distribution<int64_t>(1, 6)(rng_)).ok());
    if (const int w = s.layer_windows[size_t(layer)]; w > 0) {
      int64_t& kept = model_[id].kept_from[size_t(layer)];
      kept = std::max(kept, std::max<int64_t>(0, start - w + 1) / s.page_size * s.page_size);
    }
  }

  void AttendOne(const std::string& id) {
    const CacheSpec& s = specs_[id];
    const int layer = std::uniform_int_distribution<int>(0, s.num_layers - 1)(rng_);
    const int64_t len = int64_t(refs_[id][size_t(layer)].k.size());
    const int64_t kept = model_[id].kept_from[size_t(layer)];
    const int w = s.layer_windows[size_t(layer)];
    // The last query of the layer always sees retained keys only.
    if (len == 0 || (w > 0 && std::max<int64_t>(0, len - 1 - w + 1) < kept)) return;
    ExpectAttendMatches(id, layer, len - 1, 1, 4);
    ++attended_;
  }

  void PopnOne(const std::string& id) {
    const CacheSpec& s = specs_[id];
    int64_t seq = 0;
    for (const RefLayer& r : refs_[id]) seq = std::max<int64_t>(seq, int64_t(r.k.size()));
    const int64_t n = std::uniform_int_distribution<int64_t>(0, seq + 1)(rng_);
    bool refuse = n > seq;
    for (int l = 0; l < s.num_layers && !refuse; ++l) {
      const int w = s.layer_windows[size_t(l)];
      if (w > 0 && int64_t(refs_[id][size_t(l)].k.size()) > seq - n) {
        refuse = model_[id].kept_from[size_t(l)] > std::max<int64_t>(0, seq - n - w + 1);
      }
    }
    auto r = store_->Popn("", id, n);
    ASSERT_TRUE(r.ok());
    ++(refuse ? (n > seq ? refused_len_ : refused_window_) : popped_);
    ASSERT_EQ(r->popped, refuse ? 0 : n) << "n=" << n << " seq=" << seq << " " << r->refusal;
    if (refuse || n == 0) return;
    for (RefLayer& ref : refs_[id]) {
      const size_t keep = size_t(std::min<int64_t>(int64_t(ref.k.size()), seq - n));
      ref.k.resize(keep);
      ref.v.resize(keep);
    }
  }

  void ResetOne(const std::string& id) {
    ASSERT_TRUE(store_->Reset("", id, std::bernoulli_distribution(0.5)(rng_)).ok());
    for (RefLayer& r : refs_[id]) r = RefLayer{};
    for (int64_t& k : model_[id].kept_from) k = 0;
  }

  void ReleaseOne(const std::string& id) {
    ASSERT_TRUE(store_->Release("", id).ok());
    model_.erase(id);
    refs_.erase(id);
  }

  // Every cache matches the model; the arena's pages add up and have one owner each.
  void Audit() {
    const ArenaStats a = store_->Stats();
    ASSERT_EQ(a.pages.pages_used + a.pages.pages_free, a.pages.num_pages);
    std::map<uint64_t, std::set<int32_t>> owned;
    int64_t held = 0;
    for (const auto& [id, m] : model_) {
      auto d = store_->Describe("", id);
      ASSERT_TRUE(d.ok());
      for (size_t l = 0; l < d->layers.size(); ++l) {
        const RefLayer& ref = refs_[id][l];
        ASSERT_EQ(d->layers[l].len, int64_t(ref.k.size())) << id << " layer " << l;
        for (int32_t p : d->layers[l].page_ids) {
          ASSERT_TRUE(owned[d->info.pool_id].insert(p).second) << "page " << p << " has two owners";
        }
        held += int64_t(d->layers[l].page_ids.size());
      }
    }
    ASSERT_EQ(held, a.pages.pages_used);
    for (const PoolStats& p : a.pools) ASSERT_EQ(p.pages_used + p.pages_free, p.num_pages);
  }

  void ExpectKvMatches(const std::string& id) {
    const CacheSpec& s = specs_[id];
    for (int l = 0; l < s.num_layers; ++l) {
      auto kv = store_->GetKv("", id, l);
      ASSERT_TRUE(kv.ok());
      const RefLayer& ref = refs_[id][size_t(l)];
      const int64_t n = kv->k.shape[2];
      ASSERT_EQ(kv->first_pos + n, int64_t(ref.k.size()));
      const auto k = testing::DecodeValues(s.dtype, kv->k.data.data(), size_t(2 * n * 8));
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t t = 0; t < n; ++t)
          for (int64_t d = 0; d < 8; ++d)
            ASSERT_EQ(k[size_t((h * n + t) * 8 + d)],
                      ref.k[size_t(kv->first_pos + t)][size_t(h * 8 + d)]);
    }
  }

  std::map<std::string, ModelCache> model_;
  int popped_ = 0, refused_len_ = 0, refused_window_ = 0, attended_ = 0;
};

TEST_F(ModelTest, RandomOperationsMatchTheModel) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (int sequence = 0; sequence < 1000; ++sequence) {
    for (const auto& [id, m] : std::map<std::string, ModelCache>(model_)) ReleaseOne(id);
    for (int op = 0; op < 60; ++op) {
      const int kind = model_.empty() ? 0 : std::uniform_int_distribution<int>(0, 19)(rng_);
      if (kind == 0 && model_.size() < 4) {
        AllocateOne();
      } else if (kind <= 11) {
        AppendOne(AnyCache());
      } else if (kind <= 14) {
        AttendOne(AnyCache());
      } else if (kind <= 17) {
        PopnOne(AnyCache());
      } else if (kind == 18) {
        ResetOne(AnyCache());
      } else if (!model_.empty()) {
        ReleaseOne(AnyCache());
      }
      if (HasFatalFailure()) return;
      Audit();
      if (HasFatalFailure()) return;
    }
    for (const auto& [id, m] : model_) ExpectKvMatches(id);
    if (HasFatalFailure()) return;
  }
  for (const auto& [id, m] : std::map<std::string, ModelCache>(model_)) ReleaseOne(id);
  EXPECT_EQ(PagesUsed(), 0);
  // The sequences reached every branch of the popn rule and the attention check.
  EXPECT_GT(popped_, 100);
  EXPECT_GT(refused_len_, 10);
  EXPECT_GT(refused_window_, 10);
  EXPECT_GT(attended_, 1000);
  std::printf(
      "popn: %d popped, %d refused (n > seq_len), %d refused (window); %d attends checked\n",
      popped_, refused_len_, refused_window_, attended_);
}

}  // namespace
}  // namespace kvarena
