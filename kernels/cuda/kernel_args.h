// The kernels' argument blocks and the host code that validates a request and fills them
// (internal to kernels/cuda). Plain C++ over the CUDA vector types, so the launchers, the
// host tests and the kernel emulator (emulator_test.cc) share one path from API to kernel.
// Stateless functions.
#ifndef KVARENA_KERNELS_CUDA_KERNEL_ARGS_H_
#define KVARENA_KERNELS_CUDA_KERNEL_ARGS_H_

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/fast_div.h"
#include "kernels/cuda/kv_kernels_cuda.h"
#include "kernels/paged_kv.h"

namespace kvarena::gpu {

inline constexpr int kAppendThreads = 256;

struct AppendArgs {
  uint8_t* pool;             // [num_pool_pages][2][page_size][num_kv_heads][head_dim]
  const int32_t* tables;     // [sum of num_blocks] packed block tables
  const PagedSeqDesc* seqs;  // [batch], or null: every CTA uses `one`
  PagedSeqDesc one;
  uint8_t* k;  // [batch][num_kv_heads][n][head_dim]: read by append,
  uint8_t* v;  // [batch][num_kv_heads][n][head_dim]  written by gather
  int num_kv_heads;
  uint32_t n;
  uint32_t head_units;  // n * row.divisor: vectors per (sequence, kv, head)
  FastDiv row;          // vectors per head_dim row
  FastDiv page;         // page_size
  int64_t page_units;   // vectors per page
  int64_t token_units;  // vectors per token of all heads
  // Quantized formats only (QuantAppendKernel / QuantGatherKernel; PrepareQuantAppend).
  // pool rows: [num_kv_heads][head_dim] 1-byte codes, then (int8) [num_kv_heads] float32.
  int head_dim;
  int64_t token_bytes;     // one token's row of K or V
  int64_t page_bytes;      // one page
  int64_t value_bytes;     // int8: where a row's scales start
  const float* scales[2];  // fp8: K's and V's static scales [num_kv_heads], or null (1)
};

// Quantizing append / dequantizing gather: kQuantRowsPerCta (token, head) rows per CTA,
// one warp each.
inline constexpr int kQuantRowsPerCta = kAppendThreads / 32;

// Validates an append or gather and completes `a` (pool, tables, seqs/one, k, v set).
// *vec_bytes = 16 or 2: the vector each thread moves. *launch = false: nothing to do.
// max_pos: the largest start position known on the host (0 for batches).
cudaError_t PrepareAppend(const PageLayout& layout, int batch, int64_t n, int64_t max_pos,
                          AppendArgs* a, int* vec_bytes, dim3* grid, bool* launch);

// The same for a quantized format (int8, fp8_e4m3): grid = (ceil(n / kQuantRowsPerCta),
// 2 * num_kv_heads, batch). a->scales set by the caller (fp8).
cudaError_t PrepareQuantAppend(const PageLayout& layout, int batch, int64_t n, int64_t max_pos,
                               AppendArgs* a, dim3* grid, bool* launch);

struct AttentionArgs {
  const uint8_t* pool;       // [num_pool_pages][2][page_size][token row (PageLayout)]
  const int32_t* tables;     // [sum of num_blocks] packed block tables
  const PagedSeqDesc* seqs;  // [batch], or null: every CTA uses `one`
  PagedSeqDesc one;
  const void* q;    // [batch][num_q_heads][n][head_dim]
  void* out;        // [batch][num_q_heads][n][head_dim]
  float2* part_ml;  // [batch][num_q_heads][n][splits] {max log2-score, sum of exp2}
  float* part_acc;  // [batch][num_q_heads][n][splits][head_dim]
  // Static scales [num_kv_heads] (PagedKvView::k_scales / v_scales), or null (all 1):
  // K's multiplies q, V's the output.
  const float* k_scales;
  const float* v_scales;
  int64_t page_bytes;    // PageLayout::PageBytes()
  int64_t token_bytes;   // PageLayout::TokenBytes(): one token's row of K or V, all heads
  int64_t scale_offset;  // int8: where a row's per-token scales start (ValueBytes())
  int kv_load_bytes;     // 1-byte formats: 8, or 4 when rows are not 8-byte aligned
  FastDiv page;          // page_size
  int num_kv_heads;
  int num_q_heads;
  int group;          // num_q_heads / num_kv_heads
  int n;              // queries per sequence
  int rows_per_head;  // n * group
  int row_blocks;     // ceil(rows_per_head / kRowsPerCta)
  int splits;
  float scale_log2;  // scale * log2(e): scores are kept in base 2
  int window;        // 0: full causal
};

// Checks the shapes of an attention request and plans it for `cta_slots` resident CTAs.
cudaError_t PlanAttentionRequest(const PageLayout& layout, const AttentionParams& params, int batch,
                                 int64_t max_span, int64_t cta_slots, AttentionPlan* plan);

// Completes `a` (pool, tables, seqs/one, q, out already set) for `plan`, checking the
// pointers and the workspace. *launch = false: nothing to do (n == 0 or batch == 0).
cudaError_t PrepareAttention(const PageLayout& layout, const AttentionParams& params, int batch,
                             const AttentionPlan& plan, void* workspace, size_t workspace_bytes,
                             AttentionArgs* a, bool* launch);

// Grid of PagedAttentionKernel: (row_blocks * splits, num_kv_heads, batch).
dim3 AttentionGrid(const AttentionArgs& a, int batch);

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_KERNEL_ARGS_H_
