// CPU kernels over a PagedKvView: append new tokens into their pages, gather a layer's
// tokens back into contiguous tensors, and paged attention (prefill and decode, GQA,
// sliding-window masking) with float32 accumulation for f32 / f16 / bf16 storage.
//
// Tensors at this interface are contiguous, row-major, in the view's dtype:
//   k, v, k_out, v_out : [num_kv_heads][n][head_dim]
//   q, out             : [num_q_heads][n][head_dim]
// (the API's [1, heads, tokens, head_dim] with the batch dimension dropped).
//
// The kernels do not validate: the caller (core/) checks shapes, positions and page
// coverage first. Concurrent calls are safe when they write disjoint pages / outputs.
#ifndef KVARENA_KERNELS_CPU_KV_KERNELS_H_
#define KVARENA_KERNELS_CPU_KV_KERNELS_H_

#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/paged_kv.h"

namespace kvarena {

class ThreadPool;

// Writes n tokens at absolute positions [pos, pos + n).
// REQUIRES: the view's blocks cover positions [pos, pos + n); pos >= view.first_pos().
void AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k, const void* v);

// Copies positions [pos, pos + n) out of the pages.
// REQUIRES: view.first_pos() <= pos and pos + n <= view.len.
void GatherKv(const PagedKvView& view, int64_t pos, int64_t n, void* k_out, void* v_out);

// out[h][i] = softmax(scale * q[h][i] . K[t]) V[t] over keys t with
// max(view.first_pos(), p - window + 1) <= t <= p, where p = q_pos + i (causal).
// REQUIRES: q_pos + n <= view.len, and every query has at least one visible key.
// pool may be null (runs on the calling thread). Returns false when params.stop stopped
// it: the units left were skipped and out is incomplete.
bool PagedAttention(const PagedKvView& view, const AttentionParams& params, const void* q,
                    void* out, ThreadPool* pool);

// PagedAttention for a batch of sequences in one call (a decode step of many caches): the
// units of every sequence share the pool, so a batch of short contexts keeps every thread
// busy. Sequence b attends over views[b] with queries at [q_pos[b], q_pos[b] + params.n)
// (params.q_pos is ignored); q and out are [batch][num_q_heads][n][head_dim]. Each
// sequence's output equals what PagedAttention gives it to within float32 rounding (the
// key range may be split differently).
// REQUIRES: per sequence what PagedAttention requires. Returns false as PagedAttention does.
bool PagedAttentionBatch(const PagedKvView* views, const int64_t* q_pos, int batch,
                         const AttentionParams& params, const void* q, void* out, ThreadPool* pool);

// Whether a vectorised (AVX2 or AVX-512) path is in use on this CPU (cpu_kernels.h says
// which).
bool CpuKernelsVectorized();

}  // namespace kvarena

#endif  // KVARENA_KERNELS_CPU_KV_KERNELS_H_
