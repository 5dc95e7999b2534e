// Test-only: KvKernels that forward every single-cache call to inner kernels, the base of
// the tests' fault injectors and probes (override what the test changes). The batch calls
// are not forwarded: KvKernels' defaults run them through the forwarded single-cache calls.
#ifndef KVARENA_TESTS_SUPPORT_FORWARDING_KERNELS_H_
#define KVARENA_TESTS_SUPPORT_FORWARDING_KERNELS_H_

#include <memory>
#include <string>
#include <utility>

#include "kernels/kv_kernels.h"

namespace kvarena::testing {

class ForwardingKvKernels : public KvKernels {
 public:
  explicit ForwardingKvKernels(std::unique_ptr<KvKernels> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  absl::Status CheckLayout(const PageLayout& layout) const override {
    return inner_->CheckLayout(layout);
  }
  KernelLimits limits() const override { return inner_->limits(); }
  absl::Status ClearPages(const PageLayout& layout, uint8_t* pool_base, const int32_t* ids,
                          int64_t n) override {
    return inner_->ClearPages(layout, pool_base, ids, n);
  }
  absl::Status CopyPages(const PageLayout& layout, uint8_t* pool_base, const PageCopy* copies,
                         int64_t n) override {
    return inner_->CopyPages(layout, pool_base, copies, n);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::Status AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k,
                        const void* v) override {
    return inner_->AppendKv(view, pos, n, k, v);
  }
  absl::Status GatherKv(const PagedKvView& view, int64_t pos, int64_t n, void* k_out,
                        void* v_out) override {
    return inner_->GatherKv(view, pos, n, k_out, v_out);
  }
  absl::Status PagedAttention(const PagedKvView& view, const AttentionParams& params, const void* q,
                              void* out) override {
    return inner_->PagedAttention(view, params, q, out);
  }

 private:
  std::unique_ptr<KvKernels> inner_;
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_FORWARDING_KERNELS_H_
