// Decode attention (n = 1) on the CPU kernels against two baselines over the same KV
// bytes: a read-only AVX2 reduction pass (the ceiling for a kernel that only reads the
// cache) and memcpy. Shape: 32 q heads, 8 kv heads, head_dim 128, page 16, f16 / bf16,
// pages shuffled in one pool; contexts 512..32k; 1 and 2 threads (ThreadPool sizes).
// Attention runs once per kernel family the CPU has (cpu_kernels.h: avx512_bf16, avx512,
// avx2, portable; --kernels=avx512,avx2 picks some), side by side in one run; a prefill
// table (64 queries at the end of a 1k context) compares the families on n > 1.
//
// Run with --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true on a
// shared machine: the tables give each benchmark's median repetition.
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

#include "kernels/cpu/cpu_kernels.h"
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
constexpr int64_t kPrefillCtx = 1024;  // the prefill table: kPrefillN queries ending here (one of kContexts)
constexpr int64_t kPrefillN = 64;

// The kernel families attention runs with (--kernels=...; default: every one in use).
std::vector<CpuKernels> families;

// Whether `k` runs a tile of its own for dtype (avx512_bf16 differs from avx512 only on
// bf16 caches).
bool DistinctFor(CpuKernels k, DType dtype) {
  return k != CpuKernels::kAvx512Bf16 || dtype == DType::kBFloat16;
}

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

enum class Kind { kAttention, kReadPass, kMemcpy, kPrefill };
const char* KindName(Kind k) {
  return k == Kind::kAttention ? "attention"
         : k == Kind::kReadPass ? "read_pass"
         : k == Kind::kMemcpy   ? "memcpy"
                                : "prefill";
}

// Forces a kernel family for one benchmark's run (its repetitions may interleave with
// other benchmarks'), back to the default after.
class ForceKernels {
 public:
  explicit ForceKernels(CpuKernels k) { TEST_ForceCpuKernels(k); }
  ~ForceKernels() { TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16); }
  ForceKernels(const ForceKernels&) = delete;
  ForceKernels& operator=(const ForceKernels&) = delete;
};

// kPrefillN queries at the end of a kPrefillCtx context, every layer in turn.
void BM_Prefill(benchmark::State& state, CpuKernels kernels, DType dtype, int threads) {
  const ForceKernels force(kernels);
  const Workload& w = GetWorkload(dtype, kPrefillCtx);
  std::unique_ptr<ThreadPool> pool =
      threads > 1 ? std::make_unique<ThreadPool>(threads - 1) : nullptr;
  AttentionParams params;
  params.num_q_heads = kNumQHeads;
  params.q_pos = kPrefillCtx - kPrefillN;
  params.n = kPrefillN;
  params.scale = 1.0f / std::sqrt(float(kHeadDim));
  std::mt19937 rng(7);
  std::vector<uint16_t> q(size_t(kNumQHeads) * kPrefillN * kHeadDim), out(q.size());
  for (uint16_t& e : q) e = RandomElem(dtype, rng);
  int layer = 0;
  for (auto _ : state) {
    PagedAttention(w.View(layer), params, q.data(), out.data(), pool.get());
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % w.num_layers;
  }
}

void BM_Decode(benchmark::State& state, Kind kind, CpuKernels kernels, DType dtype, int64_t ctx,
               int threads) {
  const ForceKernels force(kernels);
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
      case Kind::kPrefill:  // BM_Prefill
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

// Collects every repetition's GB/s and ms per call of each benchmark while printing as
// usual; the tables give the medians.
class TableReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, std::vector<double>> gbps;  // benchmark name -> GB/s per repetition
  std::map<std::string, std::vector<double>> ms;    // benchmark name -> ms per call
  int repetitions = 0;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration) continue;
      repetitions = std::max<int>(repetitions, int(run.repetitions));
      ms[run.benchmark_name()].push_back(run.GetAdjustedRealTime() / 1e3);  // runs are in µs
      auto it = run.counters.find("bytes_per_second");
      if (it != run.counters.end()) gbps[run.benchmark_name()].push_back(double(it->second) / 1e9);
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

// The median of a benchmark's repetitions (the mean of the middle two for an even count);
// 0 if it did not run.
double Median(const std::map<std::string, std::vector<double>>& m, const std::string& name) {
  auto it = m.find(name);
  if (it == m.end() || it->second.empty()) return 0;
  std::vector<double> v = it->second;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Prints x with the format, or "-" in the same width when it is 0 (not run).
void Cell(const char* format, int width, double x) {
  if (x == 0) {
    std::printf(" %*s", width, "-");
  } else {
    std::printf(format, x);
  }
}

// kernels names the family of attention and prefill rows; the baselines have none.
std::string Name(Kind kind, CpuKernels kernels, DType dtype, int64_t ctx, int threads) {
  std::string name = KindName(kind);
  if (kind == Kind::kAttention || kind == Kind::kPrefill) name += std::string(":") + CpuKernelsName(kernels);
  name += std::string("/") + DTypeName(dtype) + "/ctx:" + std::to_string(ctx);
  if (kind == Kind::kPrefill) name += "/n:" + std::to_string(kPrefillN);
  return name + "/threads:" + std::to_string(threads);
}

void PrintTable(const TableReporter& r) {
  auto get = [&](const std::map<std::string, std::vector<double>>& m, Kind k, CpuKernels f,
                 DType dtype, int64_t ctx, int threads) {
    // benchmark appends "/real_time" to the names of UseRealTime benchmarks.
    return Median(m, Name(k, f, dtype, ctx, threads) + "/real_time");
  };
  std::printf(
      "\nDecode attention per kernel family vs baselines over the same KV bytes (GB/s of KV "
      "read, median of %d; attn/read = attention / read_pass)\n",
      std::max(1, r.repetitions));
  std::printf("%-9s %6s %3s %10s %10s", "dtype", "ctx", "thr", "read_pass", "memcpy");
  for (CpuKernels f : families) std::printf(" %12s %9s", CpuKernelsName(f), "attn/read");
  std::printf("\n");
  for (DType dtype : kDTypes) {
    for (int64_t ctx : kContexts) {
      for (int threads : kThreads) {
        const double rp = get(r.gbps, Kind::kReadPass, families[0], dtype, ctx, threads);
        const double mc = get(r.gbps, Kind::kMemcpy, families[0], dtype, ctx, threads);
        if (rp == 0 && mc == 0) continue;
        std::printf("%-9s %6lld %3d", DTypeName(dtype), static_cast<long long>(ctx), threads);
        Cell(" %10.2f", 10, rp);
        Cell(" %10.2f", 10, mc);
        for (CpuKernels f : families) {
          const double a = get(r.gbps, Kind::kAttention, f, dtype, ctx, threads);
          Cell(" %12.2f", 12, a);
          Cell(" %8.0f%%", 9, rp > 0 ? 100 * a / rp : 0.0);
        }
        std::printf("\n");
      }
    }
  }
  std::printf("\nPrefill, %lld queries at the end of a %lld context (ms per call, median of %d)\n",
              static_cast<long long>(kPrefillN), static_cast<long long>(kPrefillCtx),
              std::max(1, r.repetitions));
  std::printf("%-9s %3s", "dtype", "thr");
  for (CpuKernels f : families) std::printf(" %12s", CpuKernelsName(f));
  std::printf("\n");
  for (DType dtype : kDTypes) {
    for (int threads : kThreads) {
      std::printf("%-9s %3d", DTypeName(dtype), threads);
      for (CpuKernels f : families) {
        Cell(" %12.3f", 12, get(r.ms, Kind::kPrefill, f, dtype, kPrefillCtx, threads));
      }
      std::printf("\n");
    }
  }
}


// Parses --kernels=a,b,... (names as CpuKernelsName gives them); false on an unknown one.
bool ParseKernels(const char* list) {
  families.clear();
  std::string rest = list;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string name = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    bool found = false;
    for (int k = int(CpuKernels::kAvx512Bf16); k >= 0; --k) {
      if (name == CpuKernelsName(CpuKernels(k))) {
        families.push_back(CpuKernels(k));
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr, "--kernels: unknown family '%s' (portable, avx2, avx512, avx512_bf16)\n",
                   name.c_str());
      return false;
    }
  }
  return !families.empty();
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  using namespace kvarena;
  for (int k = int(CpuKernelsInUse()); k >= 0; --k) families.push_back(CpuKernels(k));
  for (int i = 1; i < argc; ++i) {  // our flags, removed before benchmark sees argv
    bool ours = true;
    if (std::strncmp(argv[i], "--thp=", 6) == 0) {
      use_thp = std::strcmp(argv[i] + 6, "0") != 0;
    } else if (std::strncmp(argv[i], "--kernels=", 10) == 0) {
      if (!ParseKernels(argv[i] + 10)) return 1;
    } else {
      ours = false;
    }
    if (ours) {
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      --i;
    }
  }
  for (CpuKernels f : families) {
    if (int(f) > int(CpuKernelsInUse())) {
      std::fprintf(stderr, "--kernels: %s is not available here (in use: %s)\n", CpuKernelsName(f),
                   CpuKernelsName(CpuKernelsInUse()));
      return 1;
    }
  }
  // Grouped by workload so each pool is built once.
  for (DType dtype : kDTypes) {
    for (int64_t ctx : kContexts) {
      for (int threads : kThreads) {
        for (Kind kind : {Kind::kAttention, Kind::kReadPass, Kind::kMemcpy}) {
          for (CpuKernels f : families) {
            if (kind == Kind::kAttention && !DistinctFor(f, dtype)) continue;
            benchmark::RegisterBenchmark(Name(kind, f, dtype, ctx, threads).c_str(), BM_Decode,
                                         kind, f, dtype, ctx, threads)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
            if (kind != Kind::kAttention) break;  // the baselines once
          }
        }
      }
      if (ctx != kPrefillCtx) continue;
      for (int threads : kThreads) {
        for (CpuKernels f : families) {
          if (!DistinctFor(f, dtype)) continue;
          benchmark::RegisterBenchmark(Name(Kind::kPrefill, f, dtype, ctx, threads).c_str(),
                                       BM_Prefill, f, dtype, threads)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("CPU kernels supported: %s, in use: %s; pools madvise(MADV_HUGEPAGE): %s\n",
              CpuKernelsName(CpuKernelsSupported()), CpuKernelsName(CpuKernelsInUse()),
              use_thp ? "yes" : "no (--thp=1 to ask)");
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  PrintTable(reporter);
  benchmark::Shutdown();
  return 0;
}
