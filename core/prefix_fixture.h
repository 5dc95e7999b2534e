// The prefix-reuse tests' fixture (prefix_test.cc, prefix_sharing_test.cc): a store with
// tiny caches of one namespace, and a toy "model": the K/V of position p on layer l is a
// function of the token ids [0, p] and l, so a cache that recomputes a prefix writes
// exactly the bytes another cache adopted.
#ifndef KVARENA_CORE_PREFIX_FIXTURE_H_
#define KVARENA_CORE_PREFIX_FIXTURE_H_

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/store_fixture.h"

namespace kvarena {

inline constexpr int kLayers = 2, kHeads = 2, kDim = 8, kPage = 4;

inline CacheSpec PrefixSpec(const std::string& ns, std::vector<int> windows = {}) {
  CacheSpec s = Spec(kLayers, kHeads, kDim, DType::kFloat32, std::move(windows), 0, kPage);
  s.prefix_namespace = ns;
  return s;
}

inline std::vector<int32_t> Tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(first + i * 7 % 31);
  return t;
}

class PrefixTest : public StoreTest {
 protected:
  // The toy model's K (kv = 0) or V (kv = 1) of positions [from, from + n) on layer.
  static OwnedTensor ModelKv(const std::vector<int32_t>& tokens, int layer, int kv, int64_t from,
                             int64_t n) {
    OwnedTensor t{DType::kFloat32, kHeads, n, kDim, {}, {}};
    t.bytes.resize(size_t(kHeads * n * kDim) * 4);
    t.values.resize(size_t(kHeads * n * kDim));
    for (int64_t i = 0; i < n; ++i) {
      uint64_t h = 1469598103934665603u ^ uint64_t(layer * 2 + kv);
      for (int64_t p = 0; p <= from + i; ++p)
        h = (h ^ uint32_t(tokens[size_t(p)])) * 1099511628211u;
      for (int64_t hd = 0; hd < kHeads; ++hd) {
        for (int64_t d = 0; d < kDim; ++d) {
          const uint64_t x = (h ^ uint64_t(hd * kDim + d)) * 0x9E3779B97F4A7C15u;
          const float f = float(int64_t(x >> 40) % 2001 - 1000) / 1000.0f;
          const size_t at = size_t((hd * n + i) * kDim + d);
          std::memcpy(t.bytes.data() + 4 * at, &f, 4);
          t.values[at] = f;
        }
      }
    }
    return t;
  }

  absl::StatusOr<CacheInfo> AllocPrompt(const CacheSpec& spec, const std::vector<int32_t>& prompt,
                                        const std::string& id = "") {
    AllocateOptions o;
    o.prompt_tokens = prompt;
    auto info = store_->Allocate("", spec, id, o);
    if (info.ok()) specs_[info->cache_id] = info->spec;
    return info;
  }

  // Allocates *first with prompt and computes it, then *second with the same prompt, which
  // adopts first's full pages (all but the last position's page-aligned prefix).
  void ComputeThenAdopt(const std::vector<int32_t>& prompt, std::string* first,
                        std::string* second) {
    auto a = AllocPrompt(PrefixSpec("m"), prompt);
    ASSERT_TRUE(a.ok()) << a.status();
    *first = a->cache_id;
    ASSERT_NO_FATAL_FAILURE(Compute(*first, prompt, 0));
    auto b = AllocPrompt(PrefixSpec("m"), prompt);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(b->cached_tokens, (int64_t(prompt.size()) - 1) / kPage * kPage);
    *second = b->cache_id;
  }

  // Appends the model's K/V of positions [from, tokens.size()) to every layer.
  void Compute(const std::string& id, const std::vector<int32_t>& tokens, int64_t from) {
    for (int l = 0; l < kLayers; ++l) {
      const int64_t n = int64_t(tokens.size()) - from;
      if (n <= 0) continue;
      OwnedTensor k = ModelKv(tokens, l, 0, from, n), v = ModelKv(tokens, l, 1, from, n);
      auto r = store_->Append("", id, l, from, k.Arg(), v.Arg());
      ASSERT_TRUE(r.ok()) << r.status();
    }
    ASSERT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
  }

  // The layer's K/V bytes as GetKv returns them.
  std::string Kv(const std::string& id, int layer) {
    auto r = store_->GetKv("", id, layer);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->k.data + r->v.data : "";
  }

  // The bytes the model gives for positions [from, to) (what Kv should return).
  static std::string Expected(const std::vector<int32_t>& tokens, int layer, int64_t from,
                              int64_t to) {
    OwnedTensor k = ModelKv(tokens, layer, 0, from, to - from),
                v = ModelKv(tokens, layer, 1, from, to - from);
    return std::string(k.bytes.begin(), k.bytes.end()) +
           std::string(v.bytes.begin(), v.bytes.end());
  }

  // Attention of fixed queries at positions [pos, pos + n) over what layer holds.
  std::string Attend(const std::string& id, int layer, int64_t pos, int64_t n) {
    std::mt19937 rng(1234);
    OwnedTensor q = RandomTensor(rng, DType::kFloat32, 2 * kHeads, n, kDim);
    std::string out(q.bytes.size(), '\0');
    AttendArgs a;
    a.cache_id = id;
    a.layer = layer;
    a.pos = pos;
    a.q = q.Arg();
    auto r = store_->Attend("", a, out.data(), out.size());
    EXPECT_TRUE(r.ok()) << r.status();
    return out;
  }

  void ExpectInvariants() {
    EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
  }
};

}  // namespace kvarena

#endif  // KVARENA_CORE_PREFIX_FIXTURE_H_
