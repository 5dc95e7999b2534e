// The decode workload of bench/attention_bench: layers of one shape (32 q heads, 8 kv
// heads, head_dim 128, page 16, f16 or bf16) whose pages, shuffled across one pool, span
// at least min_working_set_bytes, so that each layer's KV comes from DRAM. Built on first
// use and kept. Not thread-safe: the benchmark's main thread builds them.
#ifndef KVARENA_BENCH_ATTENTION_WORKLOAD_H_
#define KVARENA_BENCH_ATTENTION_WORKLOAD_H_

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/paged_kv.h"

namespace kvarena::bench {

inline constexpr int kNumQHeads = 32;
inline constexpr int kNumKvHeads = 8;
inline constexpr int kHeadDim = 128;
inline constexpr int kPageSize = 16;
// --working_set_mib=N: the layers of one workload span at least this much (two layers at
// least). The default, 8x a 32 MiB L3, puts every layer's KV in DRAM; a few MiB keeps it
// in the last-level cache, which measures what the kernels compute when memory is no limit.
inline size_t min_working_set_bytes = size_t(256) << 20;

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], FreeDeleter>;

// --thp=1: ask for transparent huge pages on the pools. The daemon's pools are memfd
// (shmem) mappings, which get huge pages only where shmem THP is enabled (the host region
// asks with MADV_HUGEPAGE); where it is "never", as on the machines this was tuned on, they
// are 4 KiB pages, so that is the default here. Huge pages save TLB misses (~15% here).
inline bool use_thp = false;

// 2 MiB-aligned, so that huge pages can back it.
inline Buffer AllocBuffer(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  bytes = (bytes + kHuge - 1) / kHuge * kHuge;
  Buffer b(static_cast<uint8_t*>(std::aligned_alloc(kHuge, bytes)));
  if (use_thp) madvise(b.get(), bytes, MADV_HUGEPAGE);
  return b;
}

// Layers of ctx tokens each, their pages shuffled across one pool.
struct Workload {
  DType dtype;  // of q and the output
  int64_t ctx;
  PageLayout layout;
  int64_t pages_per_layer = 0;
  int num_layers = 0;
  Buffer pool;                       // [num_layers * pages_per_layer][2][16][8][128]
  std::vector<int32_t> tables;       // [num_layers][pages_per_layer]
  std::vector<uint8_t> q;            // [32][1][128]
  mutable std::vector<uint8_t> out;  // [32][1][128]
  Buffer copy_dst;                   // one layer's KV bytes

  size_t LayerBytes() const { return size_t(pages_per_layer) * layout.PageBytes(); }
  PagedKvView View(int layer) const {
    PagedKvView view;
    view.layout = layout;
    view.pool_base = pool.get();
    view.block_table = tables.data() + size_t(layer) * pages_per_layer;
    view.num_blocks = pages_per_layer;
    view.len = ctx;
    return view;
  }
};

// Random values in [-1, 1] of dtype (f16 or bf16 bits).
inline uint16_t RandomElem(DType dtype, std::mt19937& rng) {
  const float f = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  if (dtype == DType::kFloat16) {
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    return bits;
  }
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

// One page of random int8 K/V: codes in [-127, 127], every scale 2^-7 (values within
// [-1, 1], as the 16-bit pages hold).
inline std::vector<uint8_t> RandomInt8Page(const PageLayout& layout, std::mt19937& rng) {
  std::vector<uint8_t> page(layout.PageBytes());
  const float scale = 0x1p-7f;
  for (size_t row = 0; row < 2 * size_t(layout.page_size); ++row) {
    uint8_t* r = page.data() + row * layout.TokenBytes();
    for (size_t i = 0; i < layout.ValueBytes(); ++i) r[i] = uint8_t(int8_t(int(rng() % 255) - 127));
    for (int h = 0; h < layout.num_kv_heads; ++h)
      std::memcpy(r + layout.ValueBytes() + 4 * size_t(h), &scale, 4);
  }
  return page;
}

// Built on first use and kept, so that interleaved repetitions do not rebuild them
// (12 workloads of min_working_set_bytes: about 3 GiB in all by default). The pages store
// K/V in `format` (kUnspecified: as dtype); q and the output are dtype.
inline const Workload& GetWorkload(DType dtype, int64_t ctx,
                                   KvFormat format = KvFormat::kUnspecified) {
  static std::map<std::tuple<DType, KvFormat, int64_t>, std::unique_ptr<Workload>> cache;
  std::unique_ptr<Workload>& cached = cache[{dtype, ResolveKvFormat(format, dtype), ctx}];
  if (cached) return *cached;
  auto w = std::make_unique<Workload>();
  w->dtype = dtype;
  w->ctx = ctx;
  w->layout = PageLayout{dtype, kPageSize, kNumKvHeads, kHeadDim, format};
  w->pages_per_layer = (ctx + kPageSize - 1) / kPageSize;
  w->num_layers =
      int(std::max<size_t>(2, (min_working_set_bytes + w->LayerBytes() - 1) / w->LayerBytes()));
  const size_t pages = size_t(w->num_layers) * w->pages_per_layer;
  const size_t page_bytes = w->layout.PageBytes();
  w->pool = AllocBuffer(pages * page_bytes);
  std::mt19937 rng(42);
  std::vector<uint16_t> page(page_bytes / 2);  // values do not change the speed: 4 random
                                               // pages, the last one repeated
  for (size_t p = 0; p < pages; ++p) {
    if (p < 4 && w->layout.format() == KvFormat::kInt8) {
      const std::vector<uint8_t> q8 = RandomInt8Page(w->layout, rng);
      std::memcpy(page.data(), q8.data(), page_bytes);
    } else if (p < 4 && w->layout.format() == KvFormat::kFp8E4M3) {
      auto* codes = reinterpret_cast<uint8_t*>(page.data());  // below 2, either sign (no NaN)
      for (size_t i = 0; i < page_bytes; ++i) codes[i] = uint8_t(rng() & 0xBF);
    } else if (p < 4) {
      for (uint16_t& e : page) e = RandomElem(dtype, rng);
    }
    std::memcpy(w->pool.get() + p * page_bytes, page.data(), page_bytes);
  }
  w->tables.resize(pages);
  std::iota(w->tables.begin(), w->tables.end(), 0);
  std::shuffle(w->tables.begin(), w->tables.end(), rng);
  w->q.resize(size_t(kNumQHeads) * kHeadDim * 2);
  for (size_t i = 0; i < w->q.size() / 2; ++i) {
    const uint16_t e = RandomElem(dtype, rng);
    std::memcpy(w->q.data() + 2 * i, &e, 2);
  }
  w->out.resize(w->q.size());
  w->copy_dst = AllocBuffer(w->LayerBytes());
  std::memset(w->copy_dst.get(), 0, w->LayerBytes());
  cached = std::move(w);
  return *cached;
}

}  // namespace kvarena::bench

#endif  // KVARENA_BENCH_ATTENTION_WORKLOAD_H_
