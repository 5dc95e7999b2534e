#include "kernels/cuda/kernel_args.h"

#include <algorithm>
#include <climits>
#include <cmath>

namespace kvarena::gpu {
namespace {

constexpr int64_t kMaxIndex = int64_t{INT_MAX};
constexpr float kLog2e = 1.4426950408889634f;

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

cudaError_t PrepareAppend(const PageLayout& layout, int batch, int64_t n, int64_t max_pos,
                          AppendArgs* a, int* vec_bytes, dim3* grid, bool* launch) {
  *launch = false;
  const size_t elem = DTypeSize(layout.dtype);
  const int64_t row_bytes = int64_t(layout.head_dim) * int64_t(elem);
  if (elem == 0 || layout.format() != NativeKvFormat(layout.dtype) || layout.head_dim <= 0 ||
      layout.num_kv_heads <= 0 || layout.page_size <= 0 || n < 0 || max_pos < 0 || batch < 0 ||
      batch > 65535 || 2 * layout.num_kv_heads > 65535 || n >= kMaxIndex ||
      max_pos >= kMaxIndex - n ||  // written so neither can wrap
      (row_bytes >= 2 && n >= kMaxIndex / (row_bytes / 2))) {
    return cudaErrorInvalidValue;
  }
  if (n == 0 || batch == 0) return cudaSuccess;
  if (a->pool == nullptr || a->tables == nullptr || a->k == nullptr || a->v == nullptr) {
    return cudaErrorInvalidValue;
  }
  const bool wide = row_bytes % 16 == 0 && Aligned16(a->pool) && Aligned16(a->k) && Aligned16(a->v);
  *vec_bytes = wide ? 16 : 2;
  a->num_kv_heads = layout.num_kv_heads;
  a->n = uint32_t(n);
  a->page = FastDiv(uint32_t(layout.page_size));
  a->row = FastDiv(uint32_t(row_bytes / *vec_bytes));
  a->head_units = a->n * a->row.divisor;
  a->token_units = int64_t(a->num_kv_heads) * a->row.divisor;
  a->page_units = 2 * int64_t(layout.page_size) * a->token_units;
  *grid = dim3((a->head_units + kAppendThreads - 1) / kAppendThreads, 2 * a->num_kv_heads,
               unsigned(batch));
  *launch = true;
  return cudaSuccess;
}

cudaError_t PrepareQuantAppend(const PageLayout& layout, int batch, int64_t n, int64_t max_pos,
                               AppendArgs* a, dim3* grid, bool* launch) {
  *launch = false;
  const KvScales scales = ScalesOf(layout.format());
  if (layout.ElemBytes() != 1 || scales == KvScales::kNone || DTypeSize(layout.dtype) == 0 ||
      layout.head_dim <= 0 || layout.num_kv_heads <= 0 || layout.page_size <= 0 || n < 0 ||
      max_pos < 0 || batch < 0 || batch > 65535 || 2 * layout.num_kv_heads > 65535 ||
      n >= kMaxIndex || max_pos >= kMaxIndex - n ||  // written so neither can wrap
      int64_t(layout.num_kv_heads) * layout.head_dim >= kMaxIndex / 8) {
    return cudaErrorInvalidValue;
  }
  if (n == 0 || batch == 0) return cudaSuccess;
  if (a->pool == nullptr || a->tables == nullptr || a->k == nullptr || a->v == nullptr) {
    return cudaErrorInvalidValue;
  }
  a->num_kv_heads = layout.num_kv_heads;
  a->n = uint32_t(n);
  a->page = FastDiv(uint32_t(layout.page_size));
  a->head_dim = layout.head_dim;
  a->token_bytes = int64_t(layout.TokenBytes());
  a->page_bytes = int64_t(layout.PageBytes());
  a->value_bytes = int64_t(layout.ValueBytes());
  *grid = dim3(unsigned(CeilDiv(n, kQuantRowsPerCta)), 2 * a->num_kv_heads, unsigned(batch));
  *launch = true;
  return cudaSuccess;
}

cudaError_t PlanAttentionRequest(const PageLayout& layout, const AttentionParams& p, int batch,
                                 int64_t max_span, int64_t cta_slots, AttentionPlan* plan) {
  const int kv_heads = layout.num_kv_heads;
  if (kv_heads <= 0 || kv_heads > 65535 || p.num_q_heads < kv_heads ||
      p.num_q_heads % kv_heads != 0 || layout.page_size <= 0 || layout.head_dim <= 0 || p.n < 0 ||
      p.window < 0 || batch < 0 || batch > 65535 || !std::isfinite(p.scale)) {
    return cudaErrorInvalidValue;
  }
  const int64_t group = p.num_q_heads / kv_heads;
  const int64_t rows_per_query = std::max<int64_t>(1, int64_t(batch) * p.num_q_heads);  // <= 2^47
  if (p.n >= kMaxIndex / group || p.n >= kMaxIndex / rows_per_query ||  // written not to wrap
      int64_t(kv_heads) * layout.head_dim >= kMaxIndex) {
    return cudaErrorInvalidValue;
  }
  AttentionShape shape;
  shape.batch = batch;
  shape.num_kv_heads = kv_heads;
  shape.num_q_heads = p.num_q_heads;
  shape.n = p.n;
  shape.head_dim = layout.head_dim;
  shape.max_span = std::clamp<int64_t>(max_span, 1, kMaxIndex);
  *plan = PlanAttention(shape, cta_slots);
  if (plan->row_blocks * plan->splits >= kMaxIndex) return cudaErrorInvalidValue;
  return cudaSuccess;
}

cudaError_t PrepareAttention(const PageLayout& layout, const AttentionParams& p, int batch,
                             const AttentionPlan& plan, void* workspace, size_t workspace_bytes,
                             AttentionArgs* a, bool* launch) {
  *launch = false;
  if (p.n == 0 || batch == 0) return cudaSuccess;
  if (workspace_bytes < plan.workspace_bytes ||
      (plan.workspace_bytes > 0 && (workspace == nullptr || !Aligned16(workspace))) ||
      a->pool == nullptr || !Aligned16(a->pool) || a->tables == nullptr || a->q == nullptr ||
      !Aligned16(a->q) || a->out == nullptr || !Aligned16(a->out)) {
    return cudaErrorInvalidValue;
  }
  const int kv_heads = layout.num_kv_heads;
  a->token_bytes = int64_t(layout.TokenBytes());
  a->page_bytes = int64_t(layout.PageBytes());
  a->scale_offset = int64_t(layout.ValueBytes());
  // Rows of the 1-byte formats: 8-byte loads where every row starts 8-byte aligned (the
  // pool is 16-byte aligned; int8's trailing scales can leave rows 4-byte aligned only).
  a->kv_load_bytes = a->token_bytes % 8 == 0 ? 8 : 4;
  if (a->token_bytes % (layout.ElemBytes() == 1 ? 4 : 16) != 0) return cudaErrorInvalidValue;
  a->page = FastDiv(uint32_t(layout.page_size));
  a->num_kv_heads = kv_heads;
  a->num_q_heads = p.num_q_heads;
  a->group = p.num_q_heads / kv_heads;
  a->n = int(p.n);
  a->rows_per_head = int(p.n * a->group);
  a->row_blocks = int(plan.row_blocks);
  a->splits = plan.splits;
  a->scale_log2 = p.scale * kLog2e;
  a->window = p.window >= kMaxIndex ? 0 : int(p.window);  // wider than any position: full
  auto* ws = static_cast<uint8_t*>(workspace);
  a->part_ml = plan.splits > 1 ? reinterpret_cast<float2*>(ws + plan.ml_offset) : nullptr;
  a->part_acc = plan.splits > 1 ? reinterpret_cast<float*>(ws + plan.acc_offset) : nullptr;
  *launch = true;
  return cudaSuccess;
}

dim3 AttentionGrid(const AttentionArgs& a, int batch) {
  return dim3(unsigned(a.row_blocks) * unsigned(a.splits), unsigned(a.num_kv_heads),
              unsigned(batch));
}

}  // namespace kvarena::gpu
