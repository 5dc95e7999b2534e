// gpu_bench: CUDA decode attention and append bandwidth beside a device-to-device
// cudaMemcpy of the same bytes, timed with cudaEvents. A plain program (no Google
// Benchmark) so scripts/gpu_check.sh can run it on a bare GPU box.
//
// Shape: bf16, head_dim 128, 32 q heads / 8 kv heads (GQA 4), page 16, pages shuffled in
// the pool; batch x context from --batch=1,16,64 --context=1024,4096,32768.
//   attention: one decode query per sequence at its last position; bytes = the K and V
//     it reads. copy GB/s = those bytes copied by cudaMemcpy (which reads AND writes
//     them), per second. The copy moves each byte twice, so this ratio is not the
//     read-only pass DESIGN.md's target names, nor a fraction of peak bandwidth
//     (bench/RESULTS.md, "What the ratios compare").
//   append: every sequence appends its whole context (prefill-sized writes; bytes = K+V
//     written), beside cudaMemcpy of the same bytes: target >= 80%. The decode-sized
//     append (one token per sequence) is listed by latency.
// Exits 0 with a message when there is no CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/kv_kernels_cuda.h"

namespace kvarena::gpu {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "gpu_bench: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

std::vector<int64_t> ParseList(const char* arg, const char* flag, std::vector<int64_t> fallback) {
  const size_t len = std::strlen(flag);
  if (std::strncmp(arg, flag, len) != 0) return fallback;
  std::vector<int64_t> out;
  for (const char* p = arg + len; *p;) {
    char* end = nullptr;
    const long long v = std::strtoll(p, &end, 10);
    if (end == p || v <= 0) break;
    out.push_back(v);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    Check(cudaMalloc(&p_, std::max<size_t>(bytes, 16)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

// Seconds per call of fn, averaged over enough calls to fill ~100 ms.
template <typename Fn>
double TimeIt(Fn fn) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) fn();  // warm up
  Check(cudaEventRecord(start), "cudaEventRecord");
  fn();
  Check(cudaEventRecord(stop), "cudaEventRecord");
  Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  const int iters = std::clamp(int(100.0 / std::max(ms, 1e-3f)), 5, 1000);
  Check(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) fn();
  Check(cudaEventRecord(stop), "cudaEventRecord");
  Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3 / iters;
}

struct Config {
  int batch;
  int64_t context;
};

// batch caches of `context` tokens in one pool of shuffled pages, on the device.
struct Pool {
  Pool(const PageLayout& layout, const Config& c, std::mt19937_64& rng)
      : blocks_per_seq((c.context + layout.page_size - 1) / layout.page_size),
        pool(size_t(blocks_per_seq) * c.batch * layout.PageBytes()),
        tables(size_t(blocks_per_seq) * c.batch * sizeof(int32_t)),
        descs(size_t(c.batch) * sizeof(PagedSeqDesc)) {
    std::vector<int32_t> ids(size_t(blocks_per_seq) * c.batch);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    Check(
        cudaMemcpy(tables.get(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
        "tables");
    Check(cudaMemset(pool.get(), 0x3c, size_t(blocks_per_seq) * c.batch * layout.PageBytes()),
          "fill");
    batch.layout = layout;
    batch.pool_base = pool.get<uint8_t>();
    batch.block_tables = tables.get<int32_t>();
    batch.seqs = descs.get<PagedSeqDesc>();
    batch.batch = c.batch;
    batch.max_span = c.context;
  }
  // Every sequence at position `pos`.
  void SetPositions(int64_t pos, int n) {
    std::vector<PagedSeqDesc> d(static_cast<size_t>(n));
    for (int b = 0; b < n; ++b) d[b] = PagedSeqDesc{b * blocks_per_seq, 0, pos};
    Check(
        cudaMemcpy(descs.get(), d.data(), d.size() * sizeof(PagedSeqDesc), cudaMemcpyHostToDevice),
        "descs");
  }

  int64_t blocks_per_seq;
  DeviceBuffer pool, tables, descs;
  PagedKvBatch batch;
};

double CopySeconds(size_t bytes) {
  DeviceBuffer src(bytes), dst(bytes);
  return TimeIt([&] {
    Check(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice), "memcpy");
  });
}

void Run(const std::vector<Config>& configs) {
  const PageLayout layout{DType::kBFloat16, 16, 8, 128};
  const int num_q_heads = 32;
  std::mt19937_64 rng(1);
  std::printf("\n%-6s %-8s %9s | %10s %9s %9s %6s | %10s %9s %9s %6s | %12s\n", "batch", "context",
              "KV MiB", "attend us", "GB/s", "copy GB/s", "ratio", "append us", "GB/s", "copy GB/s",
              "ratio", "1-tok app us");
  for (const Config& c : configs) {
    const size_t kv_bytes = size_t(c.batch) * c.context * layout.TokenBytes() * 2;
    Pool pool(layout, c, rng);
    const double copy = CopySeconds(kv_bytes);

    // Decode attention: one query per sequence at position context - 1.
    pool.SetPositions(c.context - 1, c.batch);
    AttentionParams p;
    p.num_q_heads = num_q_heads;
    p.n = 1;
    p.scale = 1.0f / std::sqrt(128.0f);
    size_t ws_bytes = 0;
    Check(PagedAttentionBatchWorkspaceSize(pool.batch, p, &ws_bytes), "workspace size");
    const size_t q_bytes = size_t(c.batch) * num_q_heads * 128 * 2;
    DeviceBuffer q(q_bytes), out(q_bytes), ws(ws_bytes);
    Check(cudaMemset(q.get(), 0x3c, q_bytes), "q");
    const double attend = TimeIt([&] {
      Check(PagedAttentionBatch(pool.batch, p, q.get(), out.get(), ws.get(), ws_bytes),
            "PagedAttentionBatch");
    });

    // Append: each sequence writes its whole context from position 0.
    pool.SetPositions(0, c.batch);
    const size_t kv_in = size_t(c.batch) * c.context * layout.TokenBytes();
    double append = 0, one = 0;
    {
      DeviceBuffer k(kv_in), v(kv_in);
      append = TimeIt(
          [&] { Check(AppendKvBatch(pool.batch, c.context, k.get(), v.get()), "AppendKvBatch"); });
      pool.SetPositions(c.context - 1, c.batch);
      one = TimeIt(
          [&] { Check(AppendKvBatch(pool.batch, 1, k.get(), v.get()), "AppendKvBatch(1)"); });
    }
    auto gbs = [](size_t bytes, double s) { return double(bytes) / s / 1e9; };
    std::printf(
        "%-6d %-8lld %9.1f | %10.1f %9.0f %9.0f %5.0f%% | %10.1f %9.0f %9.0f %5.0f%% | %12.1f\n",
        c.batch, (long long)c.context, kv_bytes / 1048576.0, attend * 1e6, gbs(kv_bytes, attend),
        gbs(kv_bytes, copy), 100 * copy / attend, append * 1e6, gbs(kv_bytes, append),
        gbs(kv_bytes, copy), 100 * copy / append, one * 1e6);
    std::fflush(stdout);
  }
  std::printf(
      "\nGB/s = KV bytes (K+V the call reads or writes) per second; copy = cudaMemcpy D2D of\n"
      "the same bytes (each read and written); ratio = copy time / kernel time.\n");
}

}  // namespace
}  // namespace kvarena::gpu

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("gpu_bench: no CUDA device (no driver, or no GPU visible); nothing to measure\n");
    return 0;
  }
  std::vector<int64_t> batches = {1, 16, 64}, contexts = {1024, 4096, 32768};
  for (int i = 1; i < argc; ++i) {
    batches = kvarena::gpu::ParseList(argv[i], "--batch=", batches);
    contexts = kvarena::gpu::ParseList(argv[i], "--context=", contexts);
  }
  cudaDeviceProp prop;
  kvarena::gpu::Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("gpu_bench: %s, %d SMs, %.0f GiB; bf16, head_dim 128, 32 q / 8 kv heads, page 16\n",
              prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
  std::vector<kvarena::gpu::Config> configs;
  for (int64_t b : batches) {
    for (int64_t c : contexts) configs.push_back({int(b), c});
  }
  kvarena::gpu::Run(configs);
  return 0;
}
