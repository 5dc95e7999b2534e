// KvKernels: the kernels core runs on a pool's pages, behind one interface with a CPU
// implementation (kernels/cpu) and a CUDA one (kernels/cuda, built with the toolkit).
//
// q, k, v, out and the gather outputs are host memory — what a served RPC carries; the
// view's pool memory belongs to the backend (host pages for the CPU kernels, device pages
// for CUDA, which stages host tensors and the block table itself). Shapes as in
// kernels/cpu/kv_kernels.h: k, v [num_kv_heads][n][head_dim]; q, out [num_q_heads][n][head_dim].
//
// Callers validate first (core/ does): these only fail for device errors, which they
// return as INTERNAL naming the call, and — attention with AttentionParams::stop — with
// CANCELLED or DEADLINE_EXCEEDED when the token stopped it early (out is then incomplete;
// the CPU kernels poll it, the CUDA ones run to the end). Thread-safe: concurrent calls
// on disjoint pages.
#ifndef KVARENA_KERNELS_KV_KERNELS_H_
#define KVARENA_KERNELS_KV_KERNELS_H_

#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace kvarena {

// CopyPages' work, the same on every backend: for the K half, then the V half, of each
// copy, part(dst, src, kept, rest): copy `kept` bytes from src to dst, then zero the `rest`
// bytes after them. Stops at the first part that returns false; returns whether all ran.
template <typename Part>
bool ForEachCopyPart(const PageLayout& layout, uint8_t* pool_base, const PageCopy* copies,
                     int64_t n, Part part) {
  const size_t page = layout.PageBytes(), half = page / 2, token = layout.TokenBytes();
  for (int64_t i = 0; i < n; ++i) {
    const PageCopy& c = copies[i];
    const size_t kept = size_t(c.tokens) * token;
    for (size_t offset : {size_t{0}, half}) {
      if (!part(pool_base + size_t(c.dst) * page + offset,
                pool_base + size_t(c.src) * page + offset, kept, half - kept)) {
        return false;
      }
    }
  }
  return true;
}

// What one set of kernels can index. Core refuses anything beyond (INVALID_ARGUMENT for a
// spec or call, RESOURCE_EXHAUSTED for growth), so the kernels may trust their arguments.
struct KernelLimits {
  int64_t max_positions = int64_t{1} << 40;  // every position and length is below this
  int max_group = 64;                        // q heads per kv head
};

// OK when layout stores K/V as its activation dtype or in one of the quantized formats
// `quantized` the kernels also take; else INVALID_ARGUMENT naming the format, the dtype,
// the kernels (`kernels`, their name()) and what they take.
inline absl::Status CheckKvFormat(const std::string& kernels, const PageLayout& layout,
                                  std::initializer_list<KvFormat> quantized) {
  const KvFormat f = layout.format();
  std::string also;
  for (KvFormat q : quantized) {
    if (f == q) return absl::OkStatus();
    absl::StrAppend(&also, also.empty() ? " or as " : ", ", KvFormatName(q));
  }
  if (f == NativeKvFormat(layout.dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("spec.kv_format=", KvFormatName(f), " with spec.dtype=", DTypeName(layout.dtype),
                   ": the ", kernels, " kernels store K/V as the activation dtype", also, " only"));
}

class KvKernels {
 public:
  virtual ~KvKernels() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  // OK when these kernels serve pages of this geometry and KV format; else
  // INVALID_ARGUMENT naming the field and the values they take (checked at Allocate,
  // before anything is written). The default takes the plain format of the activation
  // dtype only: K/V stored as they come.
  virtual absl::Status CheckLayout(const PageLayout& layout) const {
    return CheckKvFormat(name(), layout, {});
  }
  virtual KernelLimits limits() const { return KernelLimits{}; }
  // Zeroes pages ids[0..n) of the pool at pool_base ([num_pool_pages][2][page_size][heads]
  // [head_dim]), so no slot of a page handed to a cache holds another cache's bytes.
  virtual absl::Status ClearPages(const PageLayout& layout, uint8_t* pool_base, const int32_t* ids,
                                  int64_t n) = 0;
  // Copies pages within the pool (copy-on-write of a shared page, a fork's partial last
  // page): copies[0..n), each src != dst, no dst written twice, as PageCopy says.
  virtual absl::Status CopyPages(const PageLayout& layout, uint8_t* pool_base,
                                 const PageCopy* copies, int64_t n) = 0;
  // The tiers' copies (core/tier_set.h): whole pages ids[0..n) of the pool at pool_base
  // to host memory `out` (n * PageBytes() bytes, in the order of ids), and back from `in`.
  // Synchronous: the bytes are in place when they return. The default is for pools in
  // host memory; a device's kernels copy on a stream of their own, never the caller's.
  virtual absl::Status ReadPages(const PageLayout& layout, const uint8_t* pool_base,
                                 const int32_t* ids, int64_t n, uint8_t* out) {
    const size_t page = layout.PageBytes();
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out + size_t(i) * page, pool_base + size_t(ids[i]) * page, page);
    return absl::OkStatus();
  }
  virtual absl::Status WritePages(const PageLayout& layout, uint8_t* pool_base, const int32_t* ids,
                                  int64_t n, const uint8_t* in) {
    const size_t page = layout.PageBytes();
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(pool_base + size_t(ids[i]) * page, in + size_t(i) * page, page);
    return absl::OkStatus();
  }
  // Returns once every operation these kernels started has finished with the pages it
  // touched (a no-op for synchronous kernels). Callers run it before they give pages back.
  virtual absl::Status Synchronize() { return absl::OkStatus(); }
  virtual absl::Status AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k,
                                const void* v) = 0;
  virtual absl::Status GatherKv(const PagedKvView& view, int64_t pos, int64_t n, void* k_out,
                                void* v_out) = 0;
  virtual absl::Status PagedAttention(const PagedKvView& view, const AttentionParams& params,
                                      const void* q, void* out) = 0;

  // A batch of caches of one pool in one call (the client's DecodeBatch, a layer of a
  // decode step): sequence b's n tokens go to [pos[b], pos[b] + n) of views[b], from
  // k, v [batch][num_kv_heads][n][head_dim]; attention reads q and writes out, both
  // [batch][num_q_heads][n][head_dim], with sequence b's queries at [pos[b], pos[b] + n)
  // (params.q_pos is ignored). These defaults run the single-cache calls one by one; the
  // CPU kernels spread the whole batch over their thread pool.
  virtual absl::Status AppendKvBatch(const PagedKvView* views, const int64_t* pos, int batch,
                                     int64_t n, const void* k, const void* v) {
    const PageLayout* l = batch > 0 ? &views[0].layout : nullptr;
    const size_t bytes =
        l != nullptr ? size_t(n) * l->num_kv_heads * l->head_dim * l->ActivationBytes() : 0;
    for (int b = 0; b < batch; ++b) {
      if (auto s = AppendKv(views[b], pos[b], n, static_cast<const uint8_t*>(k) + b * bytes,
                            static_cast<const uint8_t*>(v) + b * bytes);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  virtual absl::Status PagedAttentionBatch(const PagedKvView* views, const int64_t* pos, int batch,
                                           const AttentionParams& params, const void* q,
                                           void* out) {
    if (batch <= 0) return absl::OkStatus();
    const size_t bytes = size_t(params.num_q_heads) * params.n * views[0].layout.head_dim *
                         views[0].layout.ActivationBytes();
    for (int b = 0; b < batch; ++b) {
      AttentionParams p = params;
      p.q_pos = pos[b];
      if (auto s = PagedAttention(views[b], p, static_cast<const uint8_t*>(q) + b * bytes,
                                  static_cast<uint8_t*>(out) + b * bytes);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
};

// The CPU kernels with a pool of num_threads threads (-1: one per core; 0: caller only)
// whose idle workers stay awake for `awake` (ThreadPool) before they sleep.
std::unique_ptr<KvKernels> NewCpuKvKernels(
    int num_threads, std::chrono::microseconds awake = ThreadPool::kDefaultAwake);

}  // namespace kvarena

#endif  // KVARENA_KERNELS_KV_KERNELS_H_
