// CUDA kernels over paged KV: append new tokens into their pages, gather them back, and
// paged attention (decode and prefill, GQA, sliding-window masking), with the semantics
// of the CPU kernels in kernels/cpu/kv_kernels.h (NewCudaKvKernels in cuda_kv_kernels.h
// wraps them behind core's KvKernels interface). Float32 accumulation; attention takes
// head_dim 64, 128 or 256; page_size, GQA ratio and window are run-time.
//
// KV formats (PageLayout::format(), kvarena/paged_kv.h): K/V stored as the activation
// dtype (f32 / f16 / bf16), or quantized, with q, k, v and out in the activation dtype:
//   int8     : a token row is [num_kv_heads][head_dim] int8 codes, then [num_kv_heads]
//              float32 scales (one per token and head, absmax / 127, computed at append).
//              With num_kv_heads odd the rows are only 4-byte aligned (e.g. 1 x 128 =
//              132 bytes): attention then reads them with 4-byte copies instead of 8.
//   fp8_e4m3 : [num_kv_heads][head_dim] OCP e4m3fn codes of x / scale, with the layer's
//              static scales view.k_scales / v_scales ([num_kv_heads] float32, DEVICE
//              memory here, nullptr = 1; PagedKvBatch has its own pair). Attention folds
//              K's scale into q and V's into the output, as the CPU kernel does.
// Append quantizes exactly as kernels/kv_quant.h does, so the pages hold the CPU kernel's
// bytes (codes and scales) for the same input; gather returns the dequantized values
// (code * scale, rounded once to the activation dtype). Quantized append / gather take
// any head_dim; attention over them takes head_dim 64, 128 or 256 like the plain formats.
//
// Every pointer here is a DEVICE pointer, including PagedKvView::block_table (unlike the
// CPU kernels, which read it on the host), PagedKvView::pool_base and the static scales.
// Tensors are contiguous, row-major, in the activation dtype, 16-byte aligned:
//   k, v      : [num_kv_heads][n][head_dim]           (batched: [batch][num_kv_heads][n][head_dim])
//   k/v_out   : [num_kv_heads][n][head_dim]
//   q, out    : [num_q_heads][n][head_dim]            (batched: [batch][num_q_heads][n][head_dim])
//
// Batches are many caches of ONE pool (same layout, same pool_base): their block tables
// are packed back to back in one device array, and a device array of PagedSeqDesc says
// where each sequence's table starts, its first_block, and its position. Every sequence
// of a batch appends (or queries) the same number n of tokens.
//
// Launchers enqueue on `stream` and return cudaErrorInvalidValue for arguments they
// reject (unsupported dtype / head_dim, misaligned pointers, group not dividing, short
// workspace), else the launch status. Like the CPU kernels they do not check page
// coverage or positions against the pages: the caller (core/) validates first.
// Concurrent launches are safe when they write disjoint pages / outputs.
//
// Positions and token counts must stay below 2^31 (kernels index tokens in 32 bits).
//
// The names match the CPU kernels' (kvarena::AppendKv ...); call these qualified
// (gpu::AppendKv): unqualified, argument-dependent lookup finds both.
#ifndef KVARENA_KERNELS_CUDA_KV_KERNELS_CUDA_H_
#define KVARENA_KERNELS_CUDA_KV_KERNELS_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/paged_kv.h"

namespace kvarena::gpu {

// One sequence of a batch.
struct PagedSeqDesc {
  int64_t table_offset = 0;  // index of the sequence's block_table[0] in the packed tables
  int64_t first_block = 0;   // logical page index of that entry (PagedKvView::first_block)
  int64_t pos = 0;  // append: position of the first new token; attention: of the first query
};

// Many caches of one pool, all on the device.
struct PagedKvBatch {
  PageLayout layout;
  uint8_t* pool_base = nullptr;           // [num_pool_pages][2][page_size][num_kv_heads][head_dim]
  const int32_t* block_tables = nullptr;  // [sum over sequences of their num_blocks] pool page ids
  const PagedSeqDesc* seqs = nullptr;     // [batch]
  int batch = 0;
  // fp8_e4m3: the layer's static scales, [num_kv_heads] each (PagedKvView's), or null (1).
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  // Host-side hint: about how many keys the longest query of the batch sees (window
  // applied). It only chooses how far long contexts are split (and so the workspace
  // size); results are exact whatever it says.
  int64_t max_span = 0;
};

// ---- Append -----------------------------------------------------------------------------

// Writes n tokens at absolute positions [pos, pos + n) of one layer.
// REQUIRES: view.block_table covers the positions; pos >= view.first_pos().
cudaError_t AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k, const void* v,
                     cudaStream_t stream = nullptr);

// Copies positions [pos, pos + n) out of the pages into k_out / v_out.
// REQUIRES: view.first_pos() <= pos and pos + n <= view.len.
cudaError_t GatherKv(const PagedKvView& view, int64_t pos, int64_t n, void* k_out, void* v_out,
                     cudaStream_t stream = nullptr);

// Writes n tokens for each sequence b at [seqs[b].pos, seqs[b].pos + n).
cudaError_t AppendKvBatch(const PagedKvBatch& batch, int64_t n, const void* k, const void* v,
                          cudaStream_t stream = nullptr);

// ---- Paged attention --------------------------------------------------------------------
//
// out[h][i] = softmax(scale * q[h][i] . K[t]) V[t] over keys t with
// max(first_pos, p - window + 1) <= t <= p, p = query position (causal), the CPU contract.
// q head h reads kv head h / (num_q_heads / num_kv_heads).
//
// One CTA serves up to 8 query rows (a row = one q head of one query) of one kv head,
// so the q heads of a GQA group (<= 8) share every K/V load; long key ranges are split
// across CTAs (flash-decoding) and a second kernel merges the splits. The split partials
// live in a caller-provided workspace whose size the *WorkspaceSize functions give; it
// depends on the shapes and on the current device (SM count), so query it on the device
// the launch runs on. A size of 0 means no workspace is needed (nullptr is then fine).

// Single cache: queries at [params.q_pos, params.q_pos + params.n).
// REQUIRES: q_pos + n <= view.len; every query sees at least one key.
cudaError_t PagedAttentionWorkspaceSize(const PagedKvView& view, const AttentionParams& params,
                                        size_t* bytes);
cudaError_t PagedAttention(const PagedKvView& view, const AttentionParams& params, const void* q,
                           void* out, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream = nullptr);

// Batch of caches: sequence b's queries sit at [seqs[b].pos, seqs[b].pos + params.n);
// params.q_pos is ignored. Decode is params.n == 1.
cudaError_t PagedAttentionBatchWorkspaceSize(const PagedKvBatch& batch,
                                             const AttentionParams& params, size_t* bytes);
cudaError_t PagedAttentionBatch(const PagedKvBatch& batch, const AttentionParams& params,
                                const void* q, void* out, void* workspace, size_t workspace_bytes,
                                cudaStream_t stream = nullptr);

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_KV_KERNELS_CUDA_H_
