// The request fuzzer's tiers (docs/tiers.md): an input that starts with kTierMode gets a
// store with a TierSet under its arena — a small host store (tiers/host_store.h, so it
// evicts) over an in-memory "disk" (core/map_tier_store.h: nothing touches the file
// system) — chunks of 1 or 2 pages, a small arena, whole 128-bit page hashes (the tiers
// are keyed by them) and three more ops: Flush (the writer finishes, so a later
// AllocatePrompt can load what went down), Corrupt (flips a byte of a value the disk
// holds, or makes it fail, so verification and tier errors are exercised) and Pressure
// (a geometry whose one chunk needs the whole arena is allocated a page, so every pool
// gives back its cached pages, and their chunks go down).
//
// After the mode byte, one configuration byte:
//   bit 0: --tier_chunk_pages 2 (else 1)   bit 1: both stores write-through
//   bits 2-3: host bytes 4 KiB << 2*(bits) bit 4: the disk write-through (as a cluster)
//   bit 5: a write queue of 4 KiB (drops) else 1 MiB
// The writer is a thread: whether a lookup finds a chunk not yet flushed is a race, so an
// input replays the same steps but not always the same hits.
#ifndef KVARENA_FUZZ_REQUESTS_TIERS_H_
#define KVARENA_FUZZ_REQUESTS_TIERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/kv_store.h"
#include "core/map_tier_store.h"
#include "core/tier_set.h"
#include "fuzz/fuzz_program.h"
#include "tiers/host_store.h"

namespace kvarena {

class FuzzTiers {
 public:
  static constexpr uint8_t kTierMode = 0xFF;
  static constexpr int kOps = 3;  // Flush, Corrupt, Pressure

  // Reads the configuration byte.
  explicit FuzzTiers(Program& in) {
    const uint8_t c = in.Byte();
    auto disk = std::make_unique<MapStore>("disk", uint64_t{256} << 10);
    disk_ = disk.get();
    std::vector<TierEntry> stores;
    stores.push_back(TierEntry{NewHostStore(uint64_t{4096} << (2 * ((c >> 2) & 3))), (c & 2) != 0});
    stores.push_back(TierEntry{std::move(disk), (c & 0x12) != 0});
    TierOptions o;
    o.chunk_pages = 1 + (c & 1);
    o.write_queue_bytes = (c & 0x20) != 0 ? size_t{4} << 10 : size_t{1} << 20;
    tiers_ = std::make_shared<TierSet>(std::move(stores), o);
  }

  // The store's options in this mode. Pages of the fuzzer's geometries commit 2 MiB
  // chunks (6 MiB and 10 MiB for a few), so a few pools fill the arena.
  void Configure(StoreOptions* o) const {
    o->tiers = tiers_;
    o->arena_bytes = kArenaBytes;
    o->TEST_prefix_hash_bits = 128;
    o->session_metadata_bytes = size_t{16} << 10;  // room for a few prompts of 4 pages
  }

  // Runs tier op `op` (< kOps); returns its name.
  const char* Step(int op, Program& in, KvStore* store) {
    switch (op) {
      case 0:
        tiers_->Flush();
        return "TierFlush";
      case 1: {
        const uint8_t which = in.Byte();
        const uint64_t at = in.Int<uint64_t>(255);
        const uint8_t mask = in.Byte();
        if (mask == 0) {
          disk_->set_fail(!failing_);
          failing_ = !failing_;
        } else {
          disk_->FlipByte(which, at, mask);
        }
        return "TierCorrupt";
      }
      default: {
        // One page of 2 x 5 tokens x 1 head x 8 dims x 4 bytes = 320 bytes: the pool's
        // chunk is lcm(320, 2 MiB) = 10 MiB, the whole arena, so the budget it lacks is
        // trimmed from every other pool's cached pages (each chunk ending there goes down).
        CacheSpec s;
        s.num_layers = 1;
        s.num_kv_heads = 1;
        s.head_dim = 8;
        s.dtype = DType::kFloat32;
        s.page_size = 5;
        absl::StatusOr<CacheInfo> info = store->Allocate("", s, "");
        if (info.ok()) {
          (void)store->Reserve("", {CacheTokens{info->cache_id, 1}});
          (void)store->Release("", info->cache_id);
        }
        return "TierPressure";
      }
    }
  }

  // Each store's counters, for KVARENA_FUZZ_TRACE.
  std::string Summary() const {
    std::string out;
    for (const TierStats& t : tiers_->Stats()) {
      absl::StrAppend(&out, t.medium, ": stored=", t.stored_chunks, " chunks=", t.chunks,
                      " hits=", t.hit_chunks, " loaded_tokens=", t.loaded_tokens,
                      " dropped=", t.dropped_writes, " corrupt=", t.corrupt_chunks,
                      " errors=", t.errors, "\n");
    }
    return out;
  }

 private:
  static constexpr size_t kArenaBytes = size_t{10} << 20;

  MapStore* disk_ = nullptr;  // owned by tiers_
  bool failing_ = false;
  std::shared_ptr<TierSet> tiers_;
};

}  // namespace kvarena

#endif  // KVARENA_FUZZ_REQUESTS_TIERS_H_
