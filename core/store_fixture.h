// A KvStore test fixture: a small host arena, tiny helpers to allocate and append random
// K/V while keeping a float64 copy of every layer, and a snapshot of everything
// observable so a test can assert that a rejected call changed nothing.
#ifndef KVARENA_CORE_STORE_FIXTURE_H_
#define KVARENA_CORE_STORE_FIXTURE_H_

#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/kv_store.h"
#include "core/test_util.h"
#include "gtest/gtest.h"
#include "tests/support/test_seed.h"

namespace kvarena {

inline CacheSpec Spec(int layers, int kv_heads, int head_dim, DType dtype = DType::kFloat32,
                      std::vector<int> windows = {}, int64_t max_tokens = 0, int page_size = 4) {
  CacheSpec s;
  s.num_layers = layers;
  s.num_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.dtype = dtype;
  s.page_size = page_size;
  s.layer_windows = std::move(windows);
  s.max_tokens = max_tokens;
  return s;
}

// Everything a client could observe about one cache and the arena.
struct Snapshot {
  ArenaStats arena;
  PageStats cache;
  CacheDescription desc;
  std::vector<std::string> kv;  // per layer: k bytes + v bytes

  bool operator==(const Snapshot& o) const {
    const PageStats& a = arena.pages;
    const PageStats& b = o.arena.pages;
    return a.pages_used == b.pages_used && a.pages_free == b.pages_free && a.seq_len == b.seq_len &&
           a.layers_materialized == b.layers_materialized && a.pages_evicted == b.pages_evicted &&
           arena.bytes_committed == o.arena.bytes_committed &&
           cache.pages_used == o.cache.pages_used && cache.seq_len == o.cache.seq_len &&
           desc.info.layer_lens == o.desc.info.layer_lens && SamePages(desc, o.desc) && kv == o.kv;
  }
  static bool SamePages(const CacheDescription& a, const CacheDescription& b) {
    if (a.layers.size() != b.layers.size()) return false;
    for (size_t i = 0; i < a.layers.size(); ++i) {
      if (a.layers[i].page_ids != b.layers[i].page_ids ||
          a.layers[i].first_pos != b.layers[i].first_pos)
        return false;
    }
    return true;
  }
};

using testing::TestSeed;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeStore(size_t{64} << 20); }

  // The fixture's options: a small host arena, page_size 4, one thread, the fake clock.
  StoreOptions Options(size_t arena_bytes) {
    StoreOptions o;
    o.arena_bytes = arena_bytes;
    o.default_page_size = 4;
    o.num_threads = 1;
    o.scratch_bytes = kChunkGranularity;  // sessions charge the arena: keep it small
    o.clock = &clock_;
    return o;
  }
  void MakeStore(size_t arena_bytes) { MakeStore(Options(arena_bytes)); }
  void MakeStore(const StoreOptions& o, std::unique_ptr<Backend> backend = NewHostBackend()) {
    refs_.clear();
    store_.reset();
    auto s = KvStore::Create(o, std::move(backend));
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }

  std::string Alloc(const CacheSpec& spec, const std::string& id = "") {
    auto info = store_->Allocate("", spec, id);
    EXPECT_TRUE(info.ok()) << info.status();
    if (!info.ok()) return "";
    specs_[info->cache_id] = info->spec;
    refs_[info->cache_id].assign(size_t(spec.num_layers), RefLayer{});
    return info->cache_id;
  }

  // Appends n random tokens at the layer's end; records them in the reference on success.
  absl::StatusOr<AppendResult> AppendRandom(const std::string& id, int layer, int64_t n) {
    const CacheSpec& s = specs_[id];
    RefLayer& ref = refs_[id][size_t(layer)];
    OwnedTensor k = RandomTensor(rng_, s.dtype, s.num_kv_heads, n, s.head_dim);
    OwnedTensor v = RandomTensor(rng_, s.dtype, s.num_kv_heads, n, s.head_dim);
    auto r = store_->Append("", id, layer, int64_t(ref.k.size()), k.Arg(), v.Arg());
    if (r.ok()) Record(ref, k, v);
    return r;
  }

  static void Record(RefLayer& ref, const OwnedTensor& k, const OwnedTensor& v) {
    for (int64_t t = 0; t < k.n; ++t) {
      std::vector<double> kt, vt;
      for (int64_t h = 0; h < k.heads; ++h) {
        for (int64_t d = 0; d < k.dim; ++d) {
          kt.push_back(k.at(h, t, d));
          vt.push_back(v.at(h, t, d));
        }
      }
      ref.k.push_back(std::move(kt));
      ref.v.push_back(std::move(vt));
    }
  }

  // Attends n random queries over what layer holds, compares with the reference.
  void ExpectAttendMatches(const std::string& id, int layer, int64_t pos, int64_t n, int q_heads,
                           uint32_t window = 0) {
    const CacheSpec& s = specs_[id];
    OwnedTensor q = RandomTensor(rng_, s.dtype, q_heads, n, s.head_dim);
    std::vector<uint8_t> out(q.bytes.size());
    AttendArgs a;
    a.cache_id = id;
    a.layer = layer;
    a.pos = pos;
    a.q = q.Arg();
    a.window = window;
    auto r = store_->Attend("", a, out.data(), out.size());
    ASSERT_TRUE(r.ok()) << r.status();
    const int lw = s.layer_windows[size_t(layer)];
    const int64_t w = lw == 0 ? window : (window == 0 ? lw : std::min<int64_t>(lw, window));
    const std::vector<double> want = ReferenceAttention(
        refs_[id][size_t(layer)], q, pos, s.num_kv_heads, 1.0 / std::sqrt(double(s.head_dim)), w);
    const std::vector<double> got = testing::DecodeValues(s.dtype, out.data(), want.size());
    const double tol = s.dtype == DType::kFloat32 ? 1e-4 : 2e-2;
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
  }

  Snapshot Snap(const std::string& id) {
    Snapshot s;
    s.arena = store_->Stats();
    if (auto c = store_->CacheStats(id); c.ok()) s.cache = *c;
    if (auto d = store_->Describe("", id); d.ok()) s.desc = *d;
    for (int l = 0; l < int(s.desc.layers.size()); ++l) {
      auto kv = store_->GetKv("", id, l);
      if (kv.ok()) s.kv.push_back(kv->k.data + kv->v.data);
    }
    return s;
  }

  int64_t PagesUsed() { return store_->Stats().pages.pages_used; }

  FakeClock clock_;                   // before store_: the store reads it until it goes
  const uint32_t seed_ = TestSeed();  // printed; $KVARENA_SEED replays it
  std::mt19937 rng_{seed_};
  std::unique_ptr<KvStore> store_;
  std::map<std::string, CacheSpec> specs_;
  std::map<std::string, std::vector<RefLayer>> refs_;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_STORE_FIXTURE_H_
