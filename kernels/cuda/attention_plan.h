// How a paged-attention launch is cut into CTAs: host-only arithmetic shared by the
// launcher and the workspace query, kept apart from CUDA so it is tested on any machine.
//
// A CTA serves kRowsPerCta query rows of one (sequence, kv head): row = i * group + g for
// query i and q head g of the GQA group, so decode with group <= 8 is one row block. Long
// key ranges split into `splits` CTAs, each leaving (m, l, acc) partials per row in the
// workspace for the merge kernel:
//   workspace = ml  [batch][num_q_heads][n][splits] float2 {max of log2-scores, sum}
//             + acc [batch][num_q_heads][n][splits][head_dim] float
// Plain functions, no state.
#ifndef KVARENA_KERNELS_CUDA_ATTENTION_PLAN_H_
#define KVARENA_KERNELS_CUDA_ATTENTION_PLAN_H_

#include <cstddef>
#include <cstdint>

namespace kvarena::gpu {

inline constexpr int kRowsPerCta = 8;
inline constexpr int64_t kMinSplitTokens = 128;  // shortest key range worth its own CTA
inline constexpr int kMaxSplits = 1024;          // the merge kernel's bound
// A CTA's fixed cost (prologue, reduction, partial write), in tokens of streaming.
inline constexpr int64_t kCtaOverheadTokens = 64;

struct AttentionShape {
  int batch = 1;
  int num_kv_heads = 0;
  int num_q_heads = 0;
  int64_t n = 1;  // queries per sequence
  int head_dim = 0;
  int64_t max_span = 0;  // keys the longest query range covers (a hint)
};

struct AttentionPlan {
  int64_t row_blocks = 1;  // per (sequence, kv head)
  int splits = 1;
  size_t workspace_bytes = 0;  // 0 when splits == 1
  size_t ml_offset = 0;        // byte offsets inside the workspace
  size_t acc_offset = 0;
};

// cta_slots: CTAs the device runs at once (SMs x resident CTAs per SM). Splits are chosen
// to minimise waves x (keys per split + kCtaOverheadTokens), among splits that keep at
// least kMinSplitTokens keys each.
AttentionPlan PlanAttention(const AttentionShape& shape, int64_t cta_slots);

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_ATTENTION_PLAN_H_
