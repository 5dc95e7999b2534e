// Decode attention (n = 1) on the CPU kernels against two baselines over the same KV
// bytes: a read-only AVX2 reduction pass (the ceiling for a kernel that only reads the
// cache) and memcpy. Shape: 32 q heads, 8 kv heads, head_dim 128, page 16, f16 / bf16,
// pages shuffled in one pool; contexts 512..32k; 1 and 2 threads (ThreadPool sizes).
// Attention runs once per kernel family the CPU has (cpu_kernels.h: avx512_bf16,
// avx512_vnni, avx512, avx2, portable; --kernels=avx512,avx2 picks some), side by side in one run;
// a prefill table (64 queries at the end of a 1k context) compares the families on n > 1.
//
// Run with --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true on a
// shared machine: the tables give each benchmark's median repetition.
//
// Every iteration works on the next of many layers whose pages together span at least
// --working_set_mib (default 256), far beyond the last-level cache, as in a real decode
// step that walks every layer: each layer's KV comes from DRAM. All three report bytes of
// KV read per second, and a table of the ratios is printed at the end. A working set of a
// few MiB keeps the KV in the last-level cache instead: the kernels' compute rate.
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

#include "bench/attention_workload.h"
#include "bench/median_reporter.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace kvarena {
namespace {

using bench::Cell;
using bench::GetWorkload;
using bench::kHeadDim;
using bench::kNumQHeads;
using bench::Median;
using bench::RandomElem;
using bench::TableReporter;
using bench::Workload;

constexpr int64_t kContexts[] = {512, 1024, 4096, 8192, 16384, 32768};
constexpr int kThreads[] = {1, 2};
constexpr DType kBenchDTypes[] = {DType::kFloat16, DType::kBFloat16};
constexpr int64_t kPrefillCtx =
    1024;  // the prefill table: kPrefillN queries ending here (one of kContexts)
constexpr int64_t kPrefillN = 64;

// The kernel families attention runs with (--kernels=...; default: every one in use).
std::vector<CpuKernels> families;

// Whether `k` gets rows of its own for dtype: avx512_bf16 differs from avx512 only on
// bf16 caches and avx512_vnni only on int8 ones (none here: the format/ rows run them),
// so they are left out where avx512 runs too.
bool DistinctFor(CpuKernels k, DType dtype) {
  const bool avx512_runs =
      std::find(families.begin(), families.end(), CpuKernels::kAvx512) != families.end();
  if (k == CpuKernels::kAvx512Vnni) return !avx512_runs;
  return k != CpuKernels::kAvx512Bf16 || dtype == DType::kBFloat16 || !avx512_runs;
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
  return k == Kind::kAttention  ? "attention"
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

// A pool of `threads` with the caller's thread (ThreadPool's size); null for one.
std::unique_ptr<ThreadPool> MakePool(int threads) {
  return threads > 1 ? std::make_unique<ThreadPool>(threads - 1) : nullptr;
}

// The parameters of n queries ending at position ctx - 1.
AttentionParams LastQueries(int64_t ctx, int64_t n) {
  AttentionParams params;
  params.num_q_heads = kNumQHeads;
  params.q_pos = ctx - n;
  params.n = n;
  params.scale = 1.0f / std::sqrt(float(kHeadDim));
  return params;
}

// kPrefillN queries at the end of a kPrefillCtx context, every layer in turn.
void BM_Prefill(benchmark::State& state, CpuKernels kernels, DType dtype, int threads) {
  const ForceKernels force(kernels);
  const Workload& w = GetWorkload(dtype, kPrefillCtx);
  const std::unique_ptr<ThreadPool> pool = MakePool(threads);
  const AttentionParams params = LastQueries(kPrefillCtx, kPrefillN);
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
  const std::unique_ptr<ThreadPool> pool = MakePool(threads);
  const AttentionParams params = LastQueries(ctx, 1);
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

// The KV formats table: decode over pages of each format with the kernels in use, beside
// the 16-bit pages, at a short and a long context.
struct FormatRow {
  DType dtype;
  KvFormat format;  // kUnspecified: as dtype
};
constexpr FormatRow kFormatRows[] = {
    {DType::kFloat16, KvFormat::kUnspecified}, {DType::kBFloat16, KvFormat::kUnspecified},
    {DType::kFloat16, KvFormat::kInt8},        {DType::kBFloat16, KvFormat::kInt8},
    {DType::kFloat16, KvFormat::kFp8E4M3},     {DType::kBFloat16, KvFormat::kFp8E4M3}};
constexpr int64_t kFormatContexts[] = {4096, 32768};

void BM_DecodeFormat(benchmark::State& state, FormatRow row, int64_t ctx, int threads) {
  const Workload& w = GetWorkload(row.dtype, ctx, row.format);
  const std::unique_ptr<ThreadPool> pool = MakePool(threads);
  const AttentionParams params = LastQueries(ctx, 1);
  int layer = 0;
  for (auto _ : state) {
    PagedAttention(w.View(layer), params, w.q.data(), w.out.data(), pool.get());
    benchmark::DoNotOptimize(w.out.data());
    layer = (layer + 1) % w.num_layers;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(w.LayerBytes()));
}

std::string FormatName(FormatRow row, int64_t ctx, int threads) {
  return std::string("format/") + DTypeName(row.dtype) +
         "/kv:" + KvFormatName(ResolveKvFormat(row.format, row.dtype)) +
         "/ctx:" + std::to_string(ctx) + "/threads:" + std::to_string(threads);
}

void PrintFormatTable(const TableReporter& r) {
  const PageLayout f16{DType::kFloat16, bench::kPageSize, bench::kNumKvHeads, kHeadDim};
  std::printf(
      "\nKV formats: decode attention per call with the kernels in use (%s), us, median of %d;\n"
      "pages/GiB vs f16 = capacity against float16 pages; time/bf16 = this row's time over the\n"
      "bfloat16 pages' at the same ctx and threads\n",
      CpuKernelsName(CpuKernelsInUse()), std::max(1, r.repetitions));
  std::printf("%-9s %-9s %10s %9s %6s %3s %10s %9s\n", "dtype", "kv_format", "page_bytes",
              "pages/GiB", "ctx", "thr", "us", "time/bf16");
  for (const FormatRow& row : kFormatRows) {
    const PageLayout l{row.dtype, bench::kPageSize, bench::kNumKvHeads, kHeadDim, row.format};
    for (int64_t ctx : kFormatContexts) {
      for (int threads : kThreads) {
        const double us = 1e3 * Median(r.ms, FormatName(row, ctx, threads) + "/real_time");
        const double bf16 =
            1e3 *
            Median(r.ms, FormatName({DType::kBFloat16, KvFormat::kUnspecified}, ctx, threads) +
                             "/real_time");
        if (us == 0) continue;
        std::printf("%-9s %-9s %10zu %8.2fx %6lld %3d", DTypeName(row.dtype),
                    KvFormatName(l.format()), l.PageBytes(),
                    double(f16.PageBytes()) / double(l.PageBytes()), static_cast<long long>(ctx),
                    threads);
        Cell(" %10.1f", 10, us);
        Cell(" %8.2fx", 9, bf16 > 0 ? us / bf16 : 0.0);
        std::printf("\n");
      }
    }
  }
}

// kernels names the family of attention and prefill rows; the baselines have none.
std::string Name(Kind kind, CpuKernels kernels, DType dtype, int64_t ctx, int threads) {
  std::string name = KindName(kind);
  if (kind == Kind::kAttention || kind == Kind::kPrefill)
    name += std::string(":") + CpuKernelsName(kernels);
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
  for (DType dtype : kBenchDTypes) {
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
  std::printf(
      "\nOne thread by CPU time (GB/s over the time the thread was on a core, median of %d)\n",
      std::max(1, r.repetitions));
  std::printf("%-9s %6s %10s", "dtype", "ctx", "read_pass");
  for (CpuKernels f : families) std::printf(" %12s %9s", CpuKernelsName(f), "attn/read");
  std::printf("\n");
  for (DType dtype : kBenchDTypes) {
    for (int64_t ctx : kContexts) {
      const double rp = get(r.cpu_gbps, Kind::kReadPass, families[0], dtype, ctx, 1);
      if (rp == 0) continue;
      std::printf("%-9s %6lld", DTypeName(dtype), static_cast<long long>(ctx));
      Cell(" %10.2f", 10, rp);
      for (CpuKernels f : families) {
        const double a = get(r.cpu_gbps, Kind::kAttention, f, dtype, ctx, 1);
        Cell(" %12.2f", 12, a);
        Cell(" %8.0f%%", 9, 100 * a / rp);
      }
      std::printf("\n");
    }
  }
  std::printf("\nPrefill, %lld queries at the end of a %lld context (ms per call, median of %d)\n",
              static_cast<long long>(kPrefillN), static_cast<long long>(kPrefillCtx),
              std::max(1, r.repetitions));
  std::printf("%-9s %3s", "dtype", "thr");
  for (CpuKernels f : families) std::printf(" %12s", CpuKernelsName(f));
  std::printf("\n");
  for (DType dtype : kBenchDTypes) {
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
      std::fprintf(stderr,
                   "--kernels: unknown family '%s' (portable, avx2, avx512, avx512_vnni, "
                   "avx512_bf16)\n",
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
      bench::use_thp = std::strcmp(argv[i] + 6, "0") != 0;
    } else if (std::strncmp(argv[i], "--working_set_mib=", 18) == 0) {
      char* end = nullptr;
      const unsigned long long mib = std::strtoull(argv[i] + 18, &end, 10);
      if (end == argv[i] + 18 || *end != '\0' || mib == 0 || mib > (1ull << 20)) {
        std::fprintf(stderr, "--working_set_mib: want 1..1048576, got '%s'\n", argv[i] + 18);
        return 1;
      }
      bench::min_working_set_bytes = size_t(mib) << 20;
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
  for (DType dtype : kBenchDTypes) {
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
  for (const FormatRow& row : kFormatRows) {
    for (int64_t ctx : kFormatContexts) {
      for (int threads : kThreads) {
        benchmark::RegisterBenchmark(FormatName(row, ctx, threads).c_str(), BM_DecodeFormat, row,
                                     ctx, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf(
      "CPU kernels supported: %s, in use: %s; pools madvise(MADV_HUGEPAGE): %s; working set "
      "per workload >= %zu MiB\n",
      CpuKernelsName(CpuKernelsSupported()), CpuKernelsName(CpuKernelsInUse()),
      bench::use_thp ? "yes" : "no (--thp=1 to ask)", bench::min_working_set_bytes >> 20);
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  PrintTable(reporter);
  PrintFormatTable(reporter);
  benchmark::Shutdown();
  return 0;
}
