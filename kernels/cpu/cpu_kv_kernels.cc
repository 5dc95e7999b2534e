// KvKernels over the CPU kernels: host pages, host tensors, one thread pool.
#include <cstring>

#include "kernels/cpu/kv_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_kernels.h"
#include "kernels/stop_token.h"

namespace kvarena {
namespace {

// OK when the kernel ran to the end; else why params.stop stopped it.
absl::Status Finished(bool finished, const AttentionParams& params) {
  if (finished || params.stop == nullptr) return absl::OkStatus();
  return params.stop->status("");
}

class CpuKvKernels final : public KvKernels {
 public:
  CpuKvKernels(int num_threads, std::chrono::microseconds awake) : pool_(num_threads, awake) {}
  std::string name() const override { return "cpu"; }
  absl::Status CheckLayout(const PageLayout& layout) const override {
    return CheckKvFormat(name(), layout, {KvFormat::kInt8, KvFormat::kFp8E4M3});
  }
  absl::Status ClearPages(const PageLayout& layout, uint8_t* pool_base, const int32_t* ids,
                          int64_t n) override {
    const size_t page = layout.PageBytes();
    for (int64_t i = 0; i < n;) {  // one memset per run of consecutive ids
      int64_t j = i + 1;
      while (j < n && ids[j] == ids[j - 1] + 1) ++j;
      std::memset(pool_base + size_t(ids[i]) * page, 0, size_t(j - i) * page);
      i = j;
    }
    return absl::OkStatus();
  }
  absl::Status CopyPages(const PageLayout& layout, uint8_t* pool_base, const PageCopy* copies,
                         int64_t n) override {
    ForEachCopyPart(layout, pool_base, copies, n,
                    [](uint8_t* dst, const uint8_t* src, size_t kept, size_t rest) {
                      std::memcpy(dst, src, kept);
                      std::memset(dst + kept, 0, rest);
                      return true;
                    });
    return absl::OkStatus();
  }
  absl::Status AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k,
                        const void* v) override {
    kvarena::AppendKv(view, pos, n, k, v);
    return absl::OkStatus();
  }
  absl::Status GatherKv(const PagedKvView& view, int64_t pos, int64_t n, void* k_out,
                        void* v_out) override {
    kvarena::GatherKv(view, pos, n, k_out, v_out);
    return absl::OkStatus();
  }
  absl::Status PagedAttention(const PagedKvView& view, const AttentionParams& params, const void* q,
                              void* out) override {
    return Finished(kvarena::PagedAttention(view, params, q, out, &pool_), params);
  }
  absl::Status PagedAttentionBatch(const PagedKvView* views, const int64_t* pos, int batch,
                                   const AttentionParams& params, const void* q,
                                   void* out) override {
    return Finished(kvarena::PagedAttentionBatch(views, pos, batch, params, q, out, &pool_),
                    params);
  }

 private:
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<KvKernels> NewCpuKvKernels(int num_threads, std::chrono::microseconds awake) {
  return std::make_unique<CpuKvKernels>(num_threads, awake);
}

}  // namespace kvarena
