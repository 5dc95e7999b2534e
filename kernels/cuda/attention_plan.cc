#include "kernels/cuda/attention_plan.h"

#include <algorithm>

#include "kernels/paged_kv.h"

namespace kvarena::gpu {
AttentionPlan PlanAttention(const AttentionShape& shape, int64_t cta_slots) {
  AttentionPlan plan;
  const int group = shape.num_kv_heads > 0 ? shape.num_q_heads / shape.num_kv_heads : 1;
  plan.row_blocks = CeilDiv(std::max<int64_t>(1, shape.n * group), kRowsPerCta);
  const int64_t units = int64_t(shape.batch) * shape.num_kv_heads * plan.row_blocks;
  const int64_t span = std::max<int64_t>(1, shape.max_span);
  const int64_t slots = std::max<int64_t>(1, cta_slots);
  const int64_t max_splits = std::clamp<int64_t>(span / kMinSplitTokens, 1, kMaxSplits);

  int64_t best = 1;
  int64_t best_cost = CeilDiv(units, slots) * (span + kCtaOverheadTokens);
  for (int64_t s = 2; s <= max_splits; ++s) {
    const int64_t cost = CeilDiv(units * s, slots) * (CeilDiv(span, s) + kCtaOverheadTokens);
    if (cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  plan.splits = int(best);
  if (plan.splits > 1) {
    const size_t rows = size_t(shape.batch) * shape.num_q_heads * size_t(shape.n);
    const size_t partials = rows * size_t(plan.splits);
    plan.ml_offset = 0;
    plan.acc_offset = (partials * 2 * sizeof(float) + 255) / 256 * 256;
    plan.workspace_bytes = plan.acc_offset + partials * size_t(shape.head_dim) * sizeof(float);
  }
  return plan;
}

}  // namespace kvarena::gpu
