// KvCache's adoption of a prompt's prefix at start: the arena's hit, then the chunks the
// tiers below it hold (core/tier_set.h, docs/tiers.md), loaded into new pages that are
// registered and adopted exactly as if they had stayed in the arena.
#include <algorithm>
#include <utility>

#include "core/kv_cache.h"

namespace kvarena {

std::vector<ChunkIdentity> KvCache::TierChunksLocked(int64_t blocks, int64_t max_adopt) const {
  std::vector<ChunkIdentity> out;
  // Chunks are keyed by full 128-bit hashes: a test's narrowed hashes never reach a tier.
  if (ctx_.tiers == nullptr || !sharing() || ctx_.prefix_hash_bits < 128 || blocks >= max_adopt) {
    return out;
  }
  const PageLayout& layout = ctx_.pool->layout();
  const int32_t pages = ctx_.tiers->ChunkPagesFor(layout, spec_.num_layers);
  const int64_t page = spec_.page_size;
  const uint64_t scales_digest = StaticScalesDigest(spec_);
  const int64_t declared =
      std::min<int64_t>(int64_t(prefix_.keys.size()), int64_t(prefix_.chain.nodes.size()));
  for (int64_t c = blocks / pages; c * pages < max_adopt && (c + 1) * pages <= declared; ++c) {
    ChunkIdentity id;
    id.tenant = ctx_.pool->owner();
    id.prefix_namespace = spec_.prefix_namespace;
    id.layout = layout;
    id.scales_digest = scales_digest;
    id.num_layers = spec_.num_layers;
    id.chunk_pages = pages;
    id.first_block = c * pages;
    id.parent_hash = c == 0 ? prefix_.root_hash : prefix_.keys[size_t(c * pages - 1)];
    id.last_hash = prefix_.keys[size_t((c + 1) * pages - 1)];
    id.tokens.assign(prefix_.tokens.begin() + c * pages * page,
                     prefix_.tokens.begin() + (c + 1) * pages * page);
    out.push_back(std::move(id));
  }
  return out;
}

void KvCache::AdoptHitLocked(const PrefixHit& hit, int64_t max_adopt,
                             const std::vector<ChunkIdentity>& wanted,
                             const std::vector<std::shared_ptr<const LoadedChunk>>& loaded) {
  const int page = spec_.page_size;
  const int layers = spec_.num_layers;
  const int64_t k0 = hit.blocks;
  const int32_t pages = wanted.empty() ? 1 : wanted[0].chunk_pages;
  const int64_t c0 = wanted.empty() ? 0 : wanted[0].first_block / pages;
  auto window = [&](int l) { return spec_.layer_windows[size_t(l)]; };
  // Where block b of layer l comes from: the arena's hit, a loaded chunk, or nowhere.
  auto in_arena = [&](int64_t b, int l) { return b < k0 && b >= hit.first_block[size_t(l)]; };
  auto in_chunk = [&](int64_t b, int l) {
    const int64_t c = b / pages - c0;
    return b >= k0 && c >= 0 && c < int64_t(loaded.size()) &&
           b % pages >= loaded[size_t(c)]->chunk.first_page[size_t(l)];
  };
  // The longest hit whose every needed page is somewhere.
  int64_t k = std::max(k0, std::min<int64_t>(max_adopt, (c0 + int64_t(loaded.size())) * pages));
  for (; k > k0; --k) {
    bool all = true;
    for (int l = 0; l < layers && all; ++l) {
      for (int64_t b = FirstBlockNeeded(window(l), k, page); b < k && all; ++b) {
        all = in_arena(b, l) || in_chunk(b, l);
      }
    }
    if (all) break;
  }
  // The tiers' part: new pages, charged, written, registered (or another's adopted).
  std::vector<PageToRegister> fresh;
  for (int l = 0; l < layers && k > k0; ++l) {
    for (int64_t b = std::max(k0, FirstBlockNeeded(window(l), k, page)); b < k; ++b) {
      fresh.push_back(PageToRegister{prefix_.chain.nodes[size_t(b)], l, -1});
    }
  }
  std::vector<int32_t> ids, chunks;
  const int64_t n = int64_t(fresh.size());
  if (n > 0 && !ctx_.quota->TryChargePages(n)) {
    k = k0;
    fresh.clear();
  } else if (n > 0 && !AllocateLocked(n, &ids, &chunks).ok()) {
    ctx_.quota->RefundPages(n);
    k = k0;
    fresh.clear();
  }
  for (size_t i = 0; i < fresh.size(); ++i) fresh[i].page = ids[i];
  if (!fresh.empty()) {
    // Each page's bytes from its chunk (whole pages: nothing of the page's past survives).
    size_t i = 0;
    for (int l = 0; l < layers; ++l) {
      for (int64_t b = std::max(k0, FirstBlockNeeded(window(l), k, page)); b < k; ++b, ++i) {
        const LoadedChunk& c = *loaded[size_t(b / pages - c0)];
        const uint8_t* bytes = c.chunk.Page(wanted[size_t(b / pages - c0)], l, int(b % pages));
        if (!kernels()
                 .WritePages(ctx_.pool->layout(), ctx_.pool->base(), &fresh[i].page, 1, bytes)
                 .ok()) {
          ctx_.pool->Unallocate(ids, chunks);
          ctx_.quota->RefundPages(n);
          k = k0;
          fresh.clear();
          break;
        }
      }
      if (fresh.empty()) break;
    }
  }
  if (!fresh.empty()) ctx_.pool->InstallLoaded(absl::MakeSpan(fresh));
  if (k == 0) return;
  // Each layer's table: the hit's arena pages it still needs, then the loaded ones.
  pages_held_ += hit.pages_adopted + int64_t(fresh.size());
  std::vector<int32_t> unneeded;
  size_t next = 0;
  for (int l = 0; l < layers; ++l) {
    const int64_t first = FirstBlockNeeded(window(l), k, page);
    const std::vector<int32_t>& arena =
        hit.pages.empty() ? std::vector<int32_t>() : hit.pages[size_t(l)];
    const int64_t arena_first = hit.first_block.empty() ? 0 : hit.first_block[size_t(l)];
    std::vector<int32_t> table;
    for (int64_t b = arena_first; b < k0; ++b) {
      (b >= first ? table : unneeded).push_back(arena[size_t(b - arena_first)]);
    }
    for (int64_t b = std::max(k0, first); b < k; ++b) table.push_back(fresh[next++].page);
    layers_[size_t(l)].Adopt(first, table.data(), int64_t(table.size()), k * page);
    prefix_.reg_next[size_t(l)] = k;
  }
  ReturnPagesLocked(unneeded);
  prefix_.cached_tokens = k * page;
  prefix_.hit = uint64_t(prefix_.cached_tokens);
  ctx_.counters->prefix_hit_tokens += uint64_t(prefix_.cached_tokens);
  if (k > k0) {
    prefix_.tier_from = k0 * page;
    for (int64_t c = k0 / pages; c * pages < k; ++c) {
      const int64_t taken =
          std::min<int64_t>(k, (c + 1) * pages) - std::max<int64_t>(k0, c * pages);
      ctx_.tiers->CountLoaded(loaded[size_t(c - c0)]->tier, taken * page);
    }
  }
  PublishLocked(0, 0);
}

}  // namespace kvarena
