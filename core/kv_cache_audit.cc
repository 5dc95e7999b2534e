// KvCache's audit, for tests and the fuzzers: what it holds of pages, index nodes and the
// metadata budget checked against what it declares (TEST_Audit, which KvStore's
// TEST_CheckInvariants sums over every cache), its held pages, and DebugState (kv_cache.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/checked.h"
#include "core/kv_cache.h"
#include "core/validate.h"

namespace kvarena {

absl::Status KvCache::TEST_Audit(absl::flat_hash_map<uint64_t, int64_t>* holds, size_t* metadata) {
  absl::MutexLock lock(&mu_);
  *metadata = metadata_.budget() == nullptr ? 0 : metadata_.bytes();
  if (metadata_.bytes() != fixed_metadata_ + DeclaredBytes(int64_t(prefix_.tokens.size()))) {
    return absl::InternalError(
        absl::StrCat("cache ", Quoted(id_), " holds ", metadata_.bytes(),
                     " metadata bytes but declares ", prefix_.tokens.size(),
                     " tokens: ", fixed_metadata_ + DeclaredBytes(int64_t(prefix_.tokens.size()))));
  }
  if (prefix_.chain.root != PrefixIndex::kNoNode) ++(*holds)[prefix_.chain.root];
  for (uint64_t node : prefix_.chain.nodes) ++(*holds)[node];
  const size_t page = size_t(spec_.page_size);
  const CachePrefix& p = prefix_;
  if (p.hashes.size() != p.tokens.size() / page || p.keys.size() != p.hashes.size()) {
    return absl::InternalError(absl::StrCat("cache ", Quoted(id_), " knows ", p.tokens.size(),
                                            " tokens but hashes ", p.hashes.size(), " pages"));
  }
  if (p.chain.nodes.size() > p.keys.size() ||
      (sharing() && !p.chain.blocked && p.chain.nodes.size() != p.keys.size())) {
    return absl::InternalError(absl::StrCat("cache ", Quoted(id_), " chains ", p.chain.nodes.size(),
                                            " of ", p.keys.size(), " known pages"));
  }
  for (int l = 0; l < spec_.num_layers; ++l) {
    const LayerTable& t = layers_[size_t(l)];
    for (int64_t b = std::max(t.first_block(), t.len() / int64_t(page));
         b < t.first_block() + t.num_blocks(); ++b) {
      if (!ctx_.pool->Writable(t.block(b))) {
        return absl::InternalError(absl::StrCat("cache ", Quoted(id_), " layer ", l,
                                                " may write block ", b, " (page ", t.block(b),
                                                ") but it is shared or registered"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int32_t> KvCache::HeldPages() {
  absl::MutexLock lock(&mu_);
  std::vector<int32_t> ids;
  for (const LayerTable& t : layers_)
    ids.insert(ids.end(), t.blocks(), t.blocks() + t.num_blocks());
  return ids;
}

std::string KvCache::DebugState() {
  absl::MutexLock lock(&mu_);
  std::string out =
      absl::StrCat(Quoted(id_), released_ ? " released" : "", " held=", pages_held_,
                   " cached=", prefix_.cached_tokens, " tokens=", prefix_.tokens.size(),
                   " chain=", prefix_.chain.nodes.size(), prefix_.chain.blocked ? "!" : "");
  {
    uint64_t h = 1469598103934665603u;  // FNV-1a over the declared token ids
    for (int32_t t : prefix_.tokens) h = (h ^ uint32_t(t)) * 1099511628211u;
    absl::StrAppend(&out, " tok#", h);
  }
  std::vector<char> k, v;
  for (int l = 0; l < spec_.num_layers; ++l) {
    const LayerTable& t = layers_[size_t(l)];
    const int64_t first = t.first_pos(spec_.page_size);
    absl::StrAppend(&out, " [", first, ",", t.len(), ") pages");
    for (int64_t b = 0; b < t.num_blocks(); ++b) absl::StrAppend(&out, " ", t.blocks()[b]);
    const int64_t n = t.len() - first;
    if (n <= 0) continue;
    const size_t bytes = size_t(*TensorBytes(spec_.dtype, spec_.num_kv_heads, n, spec_.head_dim));
    k.resize(bytes);
    v.resize(bytes);
    if (!kernels().GatherKv(ViewLocked(l), first, n, k.data(), v.data()).ok()) continue;
    uint64_t h = 1469598103934665603u;  // FNV-1a over K then V
    for (const std::vector<char>* p : {&k, &v}) {
      for (char c : *p) h = (h ^ uint8_t(c)) * 1099511628211u;
    }
    absl::StrAppend(&out, " kv#", h);
  }
  return out;
}

}  // namespace kvarena
