// The shared-prefix request of bench/prefix_bench and bench/tier_bench: a prompt of a
// system prompt many requests share and a suffix unique to the request, whose "model" is
// attention alone on the served path (per layer one Attend RPC over the positions Allocate
// did not adopt). TimeFirstToken times one request's first token: from Allocate with the
// prompt to the last prompt position's attention output on the last layer. Header-only;
// thread-compatible.
#ifndef KVARENA_BENCH_PREFIX_WORKLOAD_H_
#define KVARENA_BENCH_PREFIX_WORKLOAD_H_

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "bench/half_tensor.h"
#include "kvarena/client.h"

namespace kvarena {

using Clock = std::chrono::steady_clock;

struct Workload {
  int workers = 4, requests = 8, system = 2048, suffix = 128, decode = 32;
  int layers = 4, kv_heads = 2, q_heads = 8, head_dim = 64, page_size = 16;
  DType dtype = DType::kFloat32;                // of the caches and of q, k, v (float32 or float16)
  KvFormat kv_format = KvFormat::kUnspecified;  // how the pages store K/V (unset: as dtype)
};

inline double Ms(Clock::time_point from) {
  return std::chrono::duration<double, std::milli>(Clock::now() - from).count();
}

inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p / 100.0 * double(v.size() - 1) + 0.5));
  return v[i];
}

inline size_t ElementBytes(DType dtype) { return dtype == DType::kFloat16 ? 2 : 4; }

// Random values in [-1, 1] of the workload's dtype, enough for the largest q, k or v of
// `max_positions` positions; made once, so generating them is no part of a timed request
// (the values do not matter to the timing).
class Noise {
 public:
  Noise(const Workload& w, int64_t max_positions, uint32_t seed) : dtype_(w.dtype) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t n =
        size_t(std::max(w.q_heads, w.kv_heads)) * size_t(max_positions) * size_t(w.head_dim);
    bytes_.resize(n * ElementBytes(dtype_));
    for (size_t i = 0; i < n; ++i) {
      const float f = u(rng);
      if (dtype_ == DType::kFloat16) {
        const uint16_t h = ToHalf(f);
        std::memcpy(bytes_.data() + 2 * i, &h, 2);
      } else {
        std::memcpy(bytes_.data() + 4 * i, &f, 4);
      }
    }
  }
  // [1, heads, n, dim]; n * heads * dim must not exceed what the constructor made.
  TensorArg Arg(int heads, int64_t n, int dim) const {
    return TensorArg{dtype_,
                     {1, heads, n, dim},
                     bytes_.data(),
                     size_t(heads) * size_t(n) * size_t(dim) * ElementBytes(dtype_)};
  }

 private:
  DType dtype_;
  std::vector<uint8_t> bytes_;
};

// Computes the next n positions on every layer.
inline absl::Status Compute(GenericKvCacheHandle& cache, const Workload& w, int64_t n,
                            const Noise& noise) {
  for (int l = 0; l < w.layers; ++l) {
    KVARENA_ASSIGN_OR_RETURN(auto out, cache.attention(l, noise.Arg(w.q_heads, n, w.head_dim),
                                                       noise.Arg(w.kv_heads, n, w.head_dim),
                                                       noise.Arg(w.kv_heads, n, w.head_dim)));
  }
  return absl::OkStatus();
}

inline CacheSpec WorkloadSpec(const Workload& w, const std::string& prefix_namespace) {
  CacheSpec spec;
  spec.num_layers = w.layers;
  spec.num_kv_heads = w.kv_heads;
  spec.head_dim = w.head_dim;
  spec.dtype = w.dtype;
  spec.kv_format = w.kv_format;
  spec.page_size = w.page_size;
  spec.prefix_namespace = prefix_namespace;
  return spec;
}

// w.system tokens of system prompt `system_id` (0 is prefix_bench's), then w.suffix tokens
// unique to `request` (below 1,000,000 / w.suffix requests).
inline std::vector<int32_t> WorkloadPrompt(const Workload& w, int system_id, int request) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < w.system; ++i)
    prompt.push_back(int32_t((int64_t(i) * 7919 + int64_t(system_id) * 104729) % 50000));
  for (int i = 0; i < w.suffix; ++i)
    prompt.push_back(50000 + int32_t((int64_t(request) * w.suffix + i) % 1000000));
  return prompt;
}

struct FirstToken {
  std::shared_ptr<GenericKvCacheHandle> cache;  // holding the prompt; the caller releases it
  int64_t cached = 0, tier_loaded = 0, computed = 0;
  double allocate_ms = 0, ttft_ms = 0;
};

// Allocate with the prompt, then compute what it did not adopt.
inline absl::StatusOr<FirstToken> TimeFirstToken(Client& client, const CacheSpec& spec,
                                                 const std::vector<int32_t>& prompt,
                                                 const Workload& w, const Noise& noise) {
  FirstToken t;
  const auto start = Clock::now();
  KVARENA_ASSIGN_OR_RETURN(t.cache, client.Allocate(spec, "", AllocateOptions{prompt}));
  t.allocate_ms = Ms(start);
  t.cached = t.cache->cached_tokens();
  t.tier_loaded = t.cache->tier_loaded_tokens();
  t.computed = int64_t(prompt.size()) - t.cached;
  KVARENA_RETURN_IF_ERROR(Compute(*t.cache, w, t.computed, noise));
  t.ttft_ms = Ms(start);
  return t;
}

// A client of the daemon at `address` once it answers (up to 5 s); null if it never does.
inline std::shared_ptr<Client> ConnectWhenUp(const std::string& address, const std::string& name) {
  for (int attempt = 0; attempt < 250; ++attempt) {
    ClientOptions options;
    options.client_name = name;
    options.connect_timeout = absl::Seconds(1);
    if (auto c = Client::Connect(address, options); c.ok()) return *c;
    usleep(20'000);
  }
  return nullptr;
}

}  // namespace kvarena

#endif  // KVARENA_BENCH_PREFIX_WORKLOAD_H_
