// Decode attention (n = 1) on the CPU kernels against two baselines over the same KV
// bytes: a read-only AVX2 reduction pass (the ceiling for a kernel that only reads the
// cache) and memcpy. Shape: 32 q heads, 8 kv heads, head_dim 128, page 16, f16 / bf16,
// pages shuffled in one pool; contexts 512..32k; 1 and 2 threads (ThreadPool sizes).
//
// Run with --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true on a
// shared machine: the table keeps each benchmark's best repetition.
//
// Every iteration works on the next of many layers whose pages together span at least
// kMinWorkingSetBytes, far beyond the last-level cache, as in a real decode step that
// walks every layer: each layer's KV comes from DRAM. All three report bytes of KV read
// per second, and a table of the ratios is printed at the end.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/kv_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace kvarena {
namespace {

constexpr int kNumQHeads = 32;
constexpr int kNumKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kPageSize = 16;
constexpr size_t kMinWorkingSetBytes = size_t(256) << 20;  // 8x a 32 MiB L3
constexpr int64_t kContexts[] = {512, 1024, 4096, 8192, 16384, 32768};
constexpr int kThreads[] = {1, 2};
constexpr DType kDTypes[] = {DType::kFloat16, DType::kBFloat16};

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], FreeDeleter>;

// --thp=1: ask for transparent huge pages on the pools. The daemon's pools are memfd
// (shmem) mappings, which get huge pages only where shmem THP is enabled (the host region
// asks with MADV_HUGEPAGE); where it is "never", as on the machines this was tuned on, they
// are 4 KiB pages, so that is the default here. Huge pages save TLB misses (~15% here).
bool use_thp = false;

// 2 MiB-aligned, so that huge pages can back it.
Buffer AllocBuffer(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  bytes = (bytes + kHuge - 1) / kHuge * kHuge;
  Buffer b(static_cast<uint8_t*>(std::aligned_alloc(kHuge, bytes)));
  if (use_thp) madvise(b.get(), bytes, MADV_HUGEPAGE);
  return b;
}

// Layers of ctx tokens each, their pages shuffled across one pool.
struct Workload {
  DType dtype;
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
uint16_t RandomElem(DType dtype, std::mt19937& rng) {
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

// Built on first use and kept, so that interleaved repetitions do not rebuild them
// (12 workloads of kMinWorkingSetBytes: about 3 GiB in all).
const Workload& GetWorkload(DType dtype, int64_t ctx) {
  static std::map<std::pair<DType, int64_t>, std::unique_ptr<Workload>> cache;
  std::unique_ptr<Workload>& cached = cache[{dtype, ctx}];
  if (cached) return *cached;
  auto w = std::make_unique<Workload>();
  w->dtype = dtype;
  w->ctx = ctx;
  w->layout = PageLayout{dtype, kPageSize, kNumKvHeads, kHeadDim};
  w->pages_per_layer = (ctx + kPageSize - 1) / kPageSize;
  w->num_layers =
      int(std::max<size_t>(2, (kMinWorkingSetBytes + w->LayerBytes() - 1) / w->LayerBytes()));
  const size_t pages = size_t(w->num_layers) * w->pages_per_layer;
  const size_t page_bytes = w->layout.PageBytes();
  w->pool = AllocBuffer(pages * page_bytes);
  std::mt19937 rng(42);
  std::vector<uint16_t> page(page_bytes / 2);  // values do not change the speed: 4 random
                                               // pages, the last one repeated
  for (size_t p = 0; p < pages; ++p) {
    if (p < 4) {
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

// Sum of pages [b, e) of a block table as 32-bit lanes: a pure streaming read.
__attribute__((target("avx2"))) uint32_t ReadPages(const uint8_t* pool, const int32_t* table,
                                                   int64_t b, int64_t e, size_t page_bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t page = b; page < e; ++page) {
    const uint8_t* p = pool + size_t(table[page]) * page_bytes;
    for (size_t i = 0; i < page_bytes; i += 128) {
      a0 = _mm256_add_epi32(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
      a1 = _mm256_add_epi32(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
      a2 = _mm256_add_epi32(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
      a3 = _mm256_add_epi32(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
    }
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  uint32_t sum = 0;
  for (uint32_t x : lanes) sum += x;
  return sum;
}

enum class Kind { kAttention, kReadPass, kMemcpy };
const char* KindName(Kind k) {
  return k == Kind::kAttention ? "attention" : k == Kind::kReadPass ? "read_pass" : "memcpy";
}

void BM_Decode(benchmark::State& state, Kind kind, DType dtype, int64_t ctx, int threads) {
  const Workload& w = GetWorkload(dtype, ctx);
  std::unique_ptr<ThreadPool> pool =
      threads > 1 ? std::make_unique<ThreadPool>(threads - 1) : nullptr;
  AttentionParams params;
  params.num_q_heads = kNumQHeads;
  params.q_pos = ctx - 1;
  params.n = 1;
  params.scale = 1.0f / std::sqrt(float(kHeadDim));
  const size_t page_bytes = w.layout.PageBytes();
  // The baselines split the layer's pages into `threads` contiguous ranges.
  auto over_pages = [&](int layer, auto&& fn) {
    const int64_t per = (w.pages_per_layer + threads - 1) / threads;
    auto part = [&](int64_t t) {
      const int64_t b = t * per, e = std::min(w.pages_per_layer, b + per);
      fn(w.tables.data() + size_t(layer) * w.pages_per_layer, b, e);
    };
    if (pool)
      pool->ParallelFor(threads, part);
    else
      part(0);
  };
  int layer = 0;
  for (auto _ : state) {
    switch (kind) {
      case Kind::kAttention:
        PagedAttention(w.View(layer), params, w.q.data(), w.out.data(), pool.get());
        benchmark::DoNotOptimize(w.out.data());
        break;
      case Kind::kReadPass:
        over_pages(layer, [&](const int32_t* table, int64_t b, int64_t e) {
          const uint32_t sum = ReadPages(w.pool.get(), table, b, e, page_bytes);
          benchmark::DoNotOptimize(sum);
        });
        break;
      case Kind::kMemcpy:
        over_pages(layer, [&](const int32_t* table, int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            std::memcpy(w.copy_dst.get() + size_t(i) * page_bytes,
                        w.pool.get() + size_t(table[i]) * page_bytes, page_bytes);
          }
          benchmark::ClobberMemory();
        });
        break;
    }
    layer = (layer + 1) % w.num_layers;
  }
  // Attention reads ctx tokens of K and V; the baselines read the same whole pages
  // (identical when ctx is a multiple of the page size, as here).
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(w.LayerBytes()));
  state.counters["layers"] = w.num_layers;
}

// Collects the best bytes_per_second of each benchmark over its repetitions (the least
// disturbed run, on a shared machine) while printing as usual.
class TableReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> gbps;  // benchmark name -> GB/s
  int repetitions = 0;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end() || run.run_type != Run::RT_Iteration) continue;
      double& best = gbps[run.benchmark_name()];
      best = std::max(best, double(it->second) / 1e9);
      repetitions = std::max<int>(repetitions, int(run.repetitions));
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

std::string Name(Kind kind, DType dtype, int64_t ctx, int threads) {
  return std::string(KindName(kind)) + "/" + DTypeName(dtype) + "/ctx:" + std::to_string(ctx) +
         "/threads:" + std::to_string(threads);
}

void PrintTable(const TableReporter& r) {
  std::printf(
      "\nDecode attention vs baselines over the same KV bytes (GB/s of KV read, best of %d)\n",
      std::max(1, r.repetitions));
  std::printf("%-9s %6s %3s %10s %10s %10s %11s %11s\n", "dtype", "ctx", "thr", "attention",
              "read_pass", "memcpy", "attn/read", "attn/memcpy");
  for (DType dtype : kDTypes) {
    for (int64_t ctx : kContexts) {
      for (int threads : kThreads) {
        auto get = [&](Kind k) {
          // benchmark appends "/real_time" to the names of UseRealTime benchmarks.
          auto it = r.gbps.find(Name(k, dtype, ctx, threads) + "/real_time");
          return it == r.gbps.end() ? 0.0 : it->second;
        };
        const double a = get(Kind::kAttention), rp = get(Kind::kReadPass), mc = get(Kind::kMemcpy);
        if (a == 0 && rp == 0 && mc == 0) continue;
        std::printf("%-9s %6lld %3d %10.2f %10.2f %10.2f %10.0f%% %10.0f%%\n", DTypeName(dtype),
                    static_cast<long long>(ctx), threads, a, rp, mc, rp > 0 ? 100 * a / rp : 0.0,
                    mc > 0 ? 100 * a / mc : 0.0);
      }
    }
  }
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  using namespace kvarena;
  // Grouped by workload so each pool is built once.
  for (DType dtype : kDTypes) {
    for (int64_t ctx : kContexts) {
      for (int threads : kThreads) {
        for (Kind kind : {Kind::kAttention, Kind::kReadPass, Kind::kMemcpy}) {
          benchmark::RegisterBenchmark(Name(kind, dtype, ctx, threads).c_str(), BM_Decode, kind,
                                       dtype, ctx, threads)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  for (int i = 1; i < argc; ++i) {  // our one flag, removed before benchmark sees argv
    if (std::strncmp(argv[i], "--thp=", 6) == 0) {
      use_thp = std::strcmp(argv[i] + 6, "0") != 0;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      --i;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("CPU kernels vectorised (AVX2+FMA+F16C): %s; pools madvise(MADV_HUGEPAGE): %s\n",
              CpuKernelsVectorized() ? "yes" : "no", use_thp ? "yes" : "no (--thp=1 to ask)");
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  PrintTable(reporter);
  benchmark::Shutdown();
  return 0;
}
