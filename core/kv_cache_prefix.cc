// KvCache's prefix reuse: declared token ids and their chained page hashes, registering
// full pages in the pool's PrefixIndex, adopting a cached prefix at the start, SetTokens,
// Fork, and popn's copy-on-write (kv_cache.h).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/checked.h"
#include "base/status_macros.h"
#include "core/kv_cache.h"
#include "core/refusal.h"
#include "core/validate.h"

namespace kvarena {

PrefixQuery KvCache::QueryLocked() const {
  PrefixQuery q;
  q.root_key = prefix_.root_key;
  q.prefix_namespace = spec_.prefix_namespace;
  q.root_hash = prefix_.root_hash;
  q.scales_digest = StaticScalesDigest(spec_);
  q.num_layers = spec_.num_layers;
  q.page_size = spec_.page_size;
  q.layer_windows = spec_.layer_windows;
  q.hashes = prefix_.keys.data();
  q.tokens = prefix_.tokens.data();
  q.num_blocks = int64_t(prefix_.keys.size());
  return q;
}

size_t KvCache::DeclaredIdBytes(const CacheSpec& spec, int64_t n) {
  const size_t blocks = size_t(n) / size_t(spec.page_size);
  const bool sharing = !spec.prefix_namespace.empty();
  return size_t(n) * sizeof(int32_t) +
         blocks * (2 * sizeof(Hash128) + (sharing ? sizeof(uint64_t) : 0));
}

size_t KvCache::DeclaredMetadataBytes(const CacheSpec& spec, int64_t n) {
  const size_t nodes = spec.prefix_namespace.empty() ? 0 : size_t(n) / size_t(spec.page_size);
  return DeclaredIdBytes(spec, n) + nodes * PrefixIndex::NodeBytes(spec.num_layers, spec.page_size);
}

size_t KvCache::ForkMetadataBytes() const {
  absl::MutexLock lock(&mu_);
  return DeclaredBytes(int64_t(prefix_.tokens.size())) + size_t(pages_held_) * sizeof(int32_t);
}

size_t KvCache::DeclaredBytes(int64_t n) const { return DeclaredIdBytes(spec_, n); }

absl::Status KvCache::ChargeDeclaredLocked(absl::string_view op, int64_t n, bool new_nodes) {
  const size_t want = fixed_metadata_ + DeclaredBytes(n);
  ByteBudget* budget = metadata_.budget();
  if (want <= metadata_.bytes() || (budget == nullptr && metadata_.Resize(want)))
    return absl::OkStatus();
  const int64_t new_blocks = n / spec_.page_size - int64_t(prefix_.chain.nodes.size());
  const size_t nodes =
      new_nodes && sharing() && new_blocks > 0
          ? size_t(new_blocks) * PrefixIndex::NodeBytes(spec_.num_layers, spec_.page_size)
          : 0;
  const size_t more = want - metadata_.bytes();
  auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return more + nodes <= budget->available() && metadata_.Resize(want);
  };
  if (fits()) return absl::OkStatus();
  // Cached prefixes give metadata back before anything is refused.
  if (ctx_.reclaim_metadata && ctx_.reclaim_metadata(budget, SaturatingAdd(more, nodes)) &&
      fits()) {
    return absl::OkStatus();
  }
  CountRefusal();
  return RefusedError(
      Refusal::kMetadataBytes,
      absl::StrCat(op, ": ", n, " token ids (page_size=", spec_.page_size, ", ", spec_.num_layers,
                   " layers) and the cache's tables take ", more, " more bytes of metadata",
                   nodes > 0 ? absl::StrCat(" and up to ", nodes, " for prefix-index nodes") : "",
                   " but ", budget->Describe(), "; declare fewer"));
}

void KvCache::DeclareLocked(std::vector<int32_t> tokens, int64_t changed_from) {
  prefix_.tokens = std::move(tokens);
  const int64_t page = spec_.page_size;
  const size_t kept = std::min(prefix_.hashes.size(), size_t(changed_from / page));
  prefix_.hashes.resize(kept);
  prefix_.keys.resize(kept);
  prefix_.hashes.reserve(prefix_.tokens.size() / size_t(page));
  prefix_.keys.reserve(prefix_.tokens.size() / size_t(page));
  // Covered by ChargeDeclaredLocked when growing; a shrink gives bytes back.
  (void)metadata_.Resize(
      std::min(metadata_.bytes(), fixed_metadata_ + DeclaredBytes(int64_t(prefix_.tokens.size()))));
  for (size_t b = kept; (b + 1) * size_t(page) <= prefix_.tokens.size(); ++b) {
    const Hash128 parent = b == 0 ? prefix_.root_hash : prefix_.hashes[b - 1];
    prefix_.hashes.push_back(
        PrefixPageHash(parent, prefix_.tokens.data() + b * size_t(page), int(page)));
    prefix_.keys.push_back(KeepHashBits(prefix_.hashes.back(), ctx_.prefix_hash_bits));
  }
  if (!sharing()) return;
  for (int64_t& next : prefix_.reg_next) next = std::min<int64_t>(next, int64_t(kept));
  if (kept < prefix_.chain.nodes.size() ||
      (prefix_.chain.blocked && kept == prefix_.chain.nodes.size())) {
    ctx_.pool->TruncateChain(&prefix_.chain, kept);
    // The nodes it let go of may now be a cached prefix's: keep those within their share.
    if (ctx_.trim_cached_metadata) ctx_.trim_cached_metadata();
  }
  if (prefix_.keys.size() > prefix_.chain.nodes.size() && !prefix_.chain.blocked) {
    ctx_.pool->ExtendChain(QueryLocked(), &prefix_.chain);
  }
}

void KvCache::ForgetTokensLocked(int64_t pos) {
  if (int64_t(prefix_.tokens.size()) <= pos) return;
  DeclareLocked(std::vector<int32_t>(prefix_.tokens.begin(), prefix_.tokens.begin() + pos), pos);
}

void KvCache::RegisterLocked(int layer) {
  if (!sharing() || prefix_.chain.nodes.empty()) return;
  std::vector<PageToRegister> pages;
  auto collect = [&](int l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const LayerTable& t = layers_[size_t(l)];
    const int64_t full =
        std::min<int64_t>(t.len() / spec_.page_size, int64_t(prefix_.chain.nodes.size()));
    int64_t& next = prefix_.reg_next[size_t(l)];
    for (int64_t b = std::max(next, t.first_block()); b < full; ++b) {
      pages.push_back(PageToRegister{prefix_.chain.nodes[size_t(b)], l, t.block(b)});
    }
    next = std::max(next, full);
  };
  if (layer >= 0) {
    collect(layer);
  } else {
    for (int l = 0; l < spec_.num_layers; ++l) collect(l);
  }
  if (!pages.empty()) ctx_.pool->Register(pages);
}

absl::Status KvCache::StartWithPrompt(const std::vector<int32_t>& prompt) {
  PrefixHit hit;
  int64_t max_adopt = 0;
  std::vector<ChunkIdentity> wanted;
  {
    absl::MutexLock lock(&mu_);
    if (prompt.empty()) return absl::OkStatus();
    KVARENA_RETURN_IF_ERROR(ChargeDeclaredLocked("allocate", int64_t(prompt.size())));
    DeclareLocked(prompt, 0);
    if (!sharing()) return absl::OkStatus();
    prefix_.requested = prompt.size();
    ctx_.counters->prefix_lookups += 1;
    ctx_.counters->prefix_requested_tokens += prompt.size();
    const int64_t page = spec_.page_size;
    PrefixQuery q = QueryLocked();
    // Leave the last prompt position to compute: its output is what the worker samples from.
    q.max_adopt = (int64_t(prompt.size()) - 1) / page;
    if (spec_.max_tokens > 0) q.max_adopt = std::min(q.max_adopt, spec_.max_tokens / page);
    max_adopt = q.max_adopt;
    Quota* quota = ctx_.quota.get();
    q.charge = [quota](int64_t n) { return quota->TryChargePages(n); };
    ctx_.pool->AdoptPrefix(q, &prefix_.chain, &hit);
    wanted = TierChunksLocked(hit.blocks, max_adopt);
    if (wanted.empty()) {
      AdoptHitLocked(hit, max_adopt, {}, {});
      return absl::OkStatus();
    }
  }
  // The tiers are read with no lock held (the cache is not visible to anyone yet).
  std::vector<std::shared_ptr<const LoadedChunk>> loaded =
      ctx_.tiers->Lookup(wanted, absl::Now() + ctx_.tiers->options().timeout);
  absl::MutexLock lock(&mu_);
  AdoptHitLocked(hit, max_adopt, wanted, loaded);
  return absl::OkStatus();
}

absl::StatusOr<CacheInfo> KvCache::SetTokens(int64_t first_pos, const std::vector<int32_t>& ids) {
  absl::MutexLock lock(&mu_);
  KVARENA_RETURN_IF_ERROR(CheckLiveLocked());
  KVARENA_RETURN_IF_ERROR(CheckTokenIds("set_tokens", "token_ids", ids, limits()));
  const int64_t known = int64_t(prefix_.tokens.size());
  if (first_pos < 0 || first_pos > known) {
    return absl::InvalidArgumentError(absl::StrCat(
        "set_tokens: first_pos=", first_pos, " but cache ", Quoted(id_),
        " knows the token ids of positions [0, ", known, ") only; declare them in order"));
  }
  const int64_t n = int64_t(ids.size());
  KVARENA_RETURN_IF_ERROR(CheckGrowth("set_tokens", "first_pos", first_pos, n, limits()));
  const int64_t seq = SeqLenLocked();
  for (int64_t p = first_pos; p < std::min({first_pos + n, known, seq}); ++p) {
    if (ids[size_t(p - first_pos)] != prefix_.tokens[size_t(p)]) {
      return absl::FailedPreconditionError(
          absl::StrCat("set_tokens: token_ids[", p - first_pos, "]=", ids[size_t(p - first_pos)],
                       " but position ", p, " holds token ", prefix_.tokens[size_t(p)],
                       "; the ids of written positions (below seq_len=", seq, ") cannot change"));
    }
  }
  // Declared ids of written positions stay; those of unwritten ones past the call go.
  const int64_t keep = std::min(known, seq);
  KVARENA_RETURN_IF_ERROR(ChargeDeclaredLocked("set_tokens", std::max(first_pos + n, keep)));
  std::vector<int32_t> next;
  next.reserve(size_t(std::max(first_pos + n, keep)));
  next.assign(prefix_.tokens.begin(), prefix_.tokens.begin() + first_pos);
  next.insert(next.end(), ids.begin(), ids.end());
  const std::vector<int32_t>& declared = prefix_.tokens;
  if (int64_t(next.size()) < keep)
    next.insert(next.end(), declared.begin() + int64_t(next.size()), declared.begin() + keep);
  int64_t changed = first_pos;
  while (changed < std::min<int64_t>(known, int64_t(next.size())) &&
         next[size_t(changed)] == declared[size_t(changed)]) {
    ++changed;
  }
  DeclareLocked(std::move(next), changed);
  RegisterLocked(-1);
  return InfoLocked();
}

absl::Status KvCache::CopyKeptPagesLocked(int64_t end) {
  const int page = spec_.page_size;
  if (end % page == 0) return absl::OkStatus();
  std::vector<int> layers;
  std::vector<PageCopy> copies;
  for (int l = 0; l < spec_.num_layers; ++l) {
    const LayerTable& t = layers_[size_t(l)];
    const int64_t b = end / page;
    if (t.len() <= end || b < t.first_block()) continue;
    const int32_t id = t.block(b);
    if (ctx_.pool->Writable(id)) continue;
    layers.push_back(l);
    copies.push_back(PageCopy{id, -1, int32_t(end % page)});
  }
  if (copies.empty()) return absl::OkStatus();
  const int64_t n = int64_t(copies.size());
  if (!ctx_.quota->TryChargePages(n)) {
    return RefusedError(ctx_.quota->PagesRefusal(n),
                        absl::StrCat("popn: copying ", n, " shared page(s) it cuts into needs ", n,
                                     " page(s) but ", ctx_.quota->DescribePages(n)));
  }
  std::vector<int32_t> ids, chunks;
  if (absl::Status s = AllocateLocked(n, &ids, &chunks); !s.ok()) {
    ctx_.quota->RefundPages(n);
    return Annotated(s, absl::StrCat("popn: copying ", n, " shared page(s) it cuts into: "));
  }
  for (size_t i = 0; i < copies.size(); ++i) copies[i].dst = ids[i];
  if (absl::Status s =
          kernels().CopyPages(ctx_.pool->layout(), ctx_.pool->base(), copies.data(), n);
      !s.ok()) {
    ctx_.pool->Unallocate(ids, chunks);
    ctx_.quota->RefundPages(n);
    return absl::InternalError(absl::StrCat("popn: ", s.message()));
  }
  std::vector<int32_t> old;
  for (size_t i = 0; i < copies.size(); ++i) {
    old.push_back(layers_[size_t(layers[i])].ReplaceBlock(end / page, ids[i]));
  }
  pages_held_ += n;
  ReturnPagesLocked(old);
  prefix_.cow_copies += uint64_t(n);
  ctx_.counters->cow_copies += uint64_t(n);
  return absl::OkStatus();
}

absl::Status KvCache::ForkFrom(KvCache& src) {
  // Both locks in address order, as MultiLock takes them (this cache is not visible yet,
  // but the order keeps absl's deadlock detector's lock graph acyclic).
  absl::MutexLock first(&std::min(this, &src)->mu_);
  absl::MutexLock second(&std::max(this, &src)->mu_);
  src.mu_.AssertHeld();
  mu_.AssertHeld();
  KVARENA_RETURN_IF_ERROR(src.CheckLiveLocked());
  const int page = spec_.page_size;
  std::vector<std::vector<int32_t>> shared(layers_.size());
  std::vector<int> copy_layers;
  std::vector<PageCopy> copies;
  std::vector<int32_t> all_shared;
  for (int l = 0; l < spec_.num_layers; ++l) {
    const LayerTable& t = src.layers_[size_t(l)];
    for (int64_t b = t.first_block(); b < t.len() / page; ++b)
      shared[size_t(l)].push_back(t.block(b));
    all_shared.insert(all_shared.end(), shared[size_t(l)].begin(), shared[size_t(l)].end());
    if (t.len() % page != 0 && t.len() / page >= t.first_block()) {
      copy_layers.push_back(l);
      copies.push_back(PageCopy{t.block(t.len() / page), -1, int32_t(t.len() % page)});
    }
  }
  const int64_t total = int64_t(all_shared.size() + copies.size());
  // The fork's tables name every page it shares: a slot each, besides its copy of the ids.
  const size_t table_bytes = size_t(total) * sizeof(int32_t);
  fixed_metadata_ += table_bytes;
  if (absl::Status s =
          ChargeDeclaredLocked("fork", int64_t(src.prefix_.tokens.size()), /*new_nodes=*/false);
      !s.ok()) {
    fixed_metadata_ -= table_bytes;
    return s;
  }
  if (!ctx_.quota->TryChargePages(total)) {
    CountRefusal();
    return RefusedError(
        ctx_.quota->PagesRefusal(total),
        absl::StrCat("fork: cache ", Quoted(src.id_), " holds ", total,
                     " page(s) to share or copy but ", ctx_.quota->DescribePages(total)));
  }
  std::vector<int32_t> ids, chunks;
  if (absl::Status s = AllocateLocked(int64_t(copies.size()), &ids, &chunks); !s.ok()) {
    ctx_.quota->RefundPages(total);
    CountRefusal();
    return Annotated(s, absl::StrCat("fork: copying ", copies.size(), " partial page(s): "));
  }
  for (size_t i = 0; i < copies.size(); ++i) copies[i].dst = ids[i];
  if (!copies.empty()) {
    if (absl::Status s = kernels().CopyPages(ctx_.pool->layout(), ctx_.pool->base(), copies.data(),
                                             int64_t(copies.size()));
        !s.ok()) {
      ctx_.pool->Unallocate(ids, chunks);
      ctx_.quota->RefundPages(total);
      return absl::InternalError(absl::StrCat("fork: ", s.message()));
    }
  }
  ctx_.pool->Ref(all_shared);
  for (size_t i = 0; i < copy_layers.size(); ++i) shared[size_t(copy_layers[i])].push_back(ids[i]);
  for (int l = 0; l < spec_.num_layers; ++l) {
    const LayerTable& t = src.layers_[size_t(l)];
    const std::vector<int32_t>& v = shared[size_t(l)];
    layers_[size_t(l)].Adopt(t.first_block(), v.data(), int64_t(v.size()), t.len());
  }
  pages_held_ = total;
  prefix_.tokens = src.prefix_.tokens;
  prefix_.hashes = src.prefix_.hashes;
  prefix_.keys = src.prefix_.keys;
  prefix_.reg_next = src.prefix_.reg_next;
  if (sharing()) {
    prefix_.chain = src.prefix_.chain;
    ctx_.pool->HoldChain(prefix_.chain);
  }
  prefix_.cached_tokens = SeqLenLocked();
  PublishLocked(0, 0);
  return absl::OkStatus();
}

}  // namespace kvarena
