// PagedAttention launchers: dispatch dtype, KV storage and head_dim to the instantiated
// kernels (attention_*.cu), plan and fill the arguments (kernel_args.cc), launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kv_kernels_cuda.h"
#include "kernels/cuda/kv_quant.cuh"

namespace kvarena::gpu {
namespace {

// One launch (or, with bytes_out set, only the workspace size it needs).
struct Request {
  int batch = 1;
  int64_t max_span = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  size_t* bytes_out = nullptr;
};

cudaError_t Run(const PageLayout& layout, const AttentionParams& p, AttentionArgs a,
                const Request& req, cudaStream_t stream) {
  if (req.bytes_out) *req.bytes_out = 0;
  return DispatchDType(layout.dtype, [&](auto t) {
    using T = decltype(t);
    return DispatchKvStorage<T>(layout.format(), layout.dtype, [&](auto kv) {
      using KV = decltype(kv);
      return DispatchHeadDim(layout.head_dim, [&](auto d) -> cudaError_t {
        constexpr int D = decltype(d)::value;
        int64_t slots = 0;
        AttentionPlan plan;
        bool launch = false;
        if (cudaError_t e = AttentionCtaSlots<T, KV, D>(&slots); e != cudaSuccess) return e;
        if (cudaError_t e = PlanAttentionRequest(layout, p, req.batch, req.max_span, slots, &plan);
            e != cudaSuccess) {
          return e;
        }
        if (req.bytes_out) {
          *req.bytes_out = plan.workspace_bytes;
          return cudaSuccess;
        }
        if (cudaError_t e = PrepareAttention(layout, p, req.batch, plan, req.workspace,
                                             req.workspace_bytes, &a, &launch);
            e != cudaSuccess || !launch) {
          return e;
        }
        return LaunchAttention<T, KV, D>(a, req.batch, stream);
      });
    });
  });
}

// Keys from the first query's range through the last query: the split-planning hint.
int64_t SingleSpan(const PagedKvView& view, const AttentionParams& p) {
  const int64_t lo = std::max(view.first_pos(), p.window > 0 ? p.q_pos - p.window + 1 : 0);
  return p.q_pos + p.n - lo;
}

// Written so it cannot wrap: q_pos + n < 2^31 (the kernels index tokens in 32 bits).
bool SinglePositionsOk(const PagedKvView& view, const AttentionParams& p) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  return p.q_pos >= 0 && p.n >= 0 && p.n < kLimit && p.q_pos < kLimit - p.n &&
         view.first_block >= 0;
}

AttentionArgs SingleArgs(const PagedKvView& view, const AttentionParams& p, const void* q,
                         void* out) {
  AttentionArgs a{};
  a.pool = view.pool_base;
  a.tables = view.block_table;
  a.seqs = nullptr;
  a.one = PagedSeqDesc{0, view.first_block, p.q_pos};
  a.q = q;
  a.out = out;
  a.k_scales = view.k_scales;
  a.v_scales = view.v_scales;
  return a;
}

AttentionArgs BatchArgs(const PagedKvBatch& batch, const void* q, void* out) {
  AttentionArgs a{};
  a.pool = batch.pool_base;
  a.tables = batch.block_tables;
  a.seqs = batch.seqs;
  a.q = q;
  a.out = out;
  a.k_scales = batch.k_scales;
  a.v_scales = batch.v_scales;
  return a;
}

}  // namespace

cudaError_t PagedAttentionWorkspaceSize(const PagedKvView& view, const AttentionParams& params,
                                        size_t* bytes) {
  if (bytes == nullptr || !SinglePositionsOk(view, params)) return cudaErrorInvalidValue;
  Request req;
  req.max_span = SingleSpan(view, params);
  req.bytes_out = bytes;
  return Run(view.layout, params, SingleArgs(view, params, nullptr, nullptr), req, nullptr);
}

cudaError_t PagedAttention(const PagedKvView& view, const AttentionParams& params, const void* q,
                           void* out, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  if (!SinglePositionsOk(view, params)) return cudaErrorInvalidValue;
  Request req;
  req.max_span = SingleSpan(view, params);
  req.workspace = workspace;
  req.workspace_bytes = workspace_bytes;
  return Run(view.layout, params, SingleArgs(view, params, q, out), req, stream);
}

cudaError_t PagedAttentionBatchWorkspaceSize(const PagedKvBatch& batch,
                                             const AttentionParams& params, size_t* bytes) {
  if (bytes == nullptr) return cudaErrorInvalidValue;
  Request req;
  req.batch = batch.batch;
  req.max_span = batch.max_span;
  req.bytes_out = bytes;
  return Run(batch.layout, params, BatchArgs(batch, nullptr, nullptr), req, nullptr);
}

cudaError_t PagedAttentionBatch(const PagedKvBatch& batch, const AttentionParams& params,
                                const void* q, void* out, void* workspace, size_t workspace_bytes,
                                cudaStream_t stream) {
  if (batch.seqs == nullptr && batch.batch > 0) return cudaErrorInvalidValue;
  Request req;
  req.batch = batch.batch;
  req.max_span = batch.max_span;
  req.workspace = workspace;
  req.workspace_bytes = workspace_bytes;
  return Run(batch.layout, params, BatchArgs(batch, q, out), req, stream);
}

}  // namespace kvarena::gpu
