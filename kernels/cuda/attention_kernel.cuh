// PagedAttentionKernel and MergeSplitsKernel (internal to kernels/cuda; included only by
// the attention_*.cu instantiation units).
//
// Templated on T, the activation dtype (q and out), KV, how pages store K/V (T itself, or
// the 1-byte Int8Kv / Fp8Kv of kv_quant.cuh), and head_dim D. The 1-byte formats read
// 8 bytes per lane (two 4-byte copies when int8's trailing scales leave rows only 4-byte
// aligned); int8 scores are multiplied by each token's K scale and its weights by its V
// scale (per-token scales ride the same pipeline), fp8's static per-head scales are folded
// into q (K's) and into the output (V's), as the CPU kernel does.
//
// One CTA (4 warps) = one (sequence, kv head, block of <= kRowsPerCta query rows, split
// of the key range). A key row (one token of one kv head, head_dim elements) is read by
// kLanes lanes with 16-byte loads (8 for the 1-byte formats); a warp reads 32 / kLanes tokens at a
// time and the CTA's warps interleave, so a step walks consecutive tokens (page after page). Each
// lane keeps its own cp.async pipeline of kStages stages in shared memory (it only ever reads back
// what it copied itself, so no barrier is needed), and scores every key against every
// row of the block: all q heads of a GQA group use the one K/V load. Scores live in base
// 2 (q is pre-scaled by scale * log2 e) with an online softmax per lane; lanes and warps
// merge their (m, l, acc) at the end, and splits are merged by MergeSplitsKernel.
#ifndef KVARENA_KERNELS_CUDA_ATTENTION_KERNEL_CUH_
#define KVARENA_KERNELS_CUDA_ATTENTION_KERNEL_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/cuda_util.cuh"

namespace kvarena::gpu {

constexpr unsigned kFullMask = 0xffffffffu;

template <typename KV, int D>
struct AttentionConfig {
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRows = kRowsPerCta;
  static constexpr int kVec = Storage<KV>::kVec;  // elements per chunk (a 16-byte slot)
  static constexpr int kChunkBytes = Storage<KV>::kChunkBytes;
  static constexpr bool kTokenScales = Storage<KV>::kTokenScales;
  static constexpr int kLanes = D / kVec < 32 ? D / kVec : 32;  // lanes per key row
  static constexpr int kLoads = D / (kVec * kLanes);            // 16-byte loads per lane per row
  static constexpr int kDims = kVec * kLoads;                   // dims a lane owns
  static constexpr int kTokensPerWarp = 32 / kLanes;
  static constexpr int kTokensPerStep = kWarps * kTokensPerWarp;
  static constexpr int kUnroll = kLoads == 1 ? 2 : 1;  // tokens per lane per iteration
  static constexpr int kTokensPerIter = kUnroll * kTokensPerStep;
  static constexpr int kStages = 4;
  // Shared memory, 16-byte units. Loop: q [kRows][kLoads][kVec/4][kLanes] float4, then
  // stages [kStages][kUnroll][2 (K, V)][kLoads][kThreads] uint4, then with kTokenScales
  // the scales [kStages][kUnroll][2][kThreads] float. Reduction (aliases it):
  // acc [kWarps][kRows][D] float, m [kWarps][kRows], l [kWarps][kRows].
  static constexpr int kQUnits = kRows * D / 4;
  static constexpr int kStageUnits = kUnroll * 2 * kLoads * kThreads;
  static constexpr int kScaleFloats = kTokenScales ? kStages * kUnroll * 2 * kThreads : 0;
  static constexpr size_t kLoopBytes =
      size_t(kQUnits + kStages * kStageUnits) * 16 + size_t(kScaleFloats) * sizeof(float);
  static constexpr size_t kReduceBytes = size_t(kWarps) * kRows * (D + 2) * sizeof(float);
  static constexpr size_t kSmemBytes = kLoopBytes > kReduceBytes ? kLoopBytes : kReduceBytes;
  static_assert(kLanes * kTokensPerWarp == 32 && kDims * kLanes == D, "bad tiling");
  static_assert(kSmemBytes <= 48 * 1024, "needs the dynamic shared memory opt-in");
};

// grid = (row_blocks * splits, num_kv_heads, batch), block = 128 threads (3 CTAs per SM
// fit the registers),
// dynamic shared memory = AttentionConfig<KV, D>::kSmemBytes.
template <typename T, typename KV, int D>
__global__ void __launch_bounds__(128, 3) PagedAttentionKernel(const AttentionArgs a) {
  using C = AttentionConfig<KV, D>;
  using S = Storage<T>;
  using SK = Storage<KV>;
  constexpr int kRows = C::kRows;
  extern __shared__ uint4 smem[];
  float4* q_s = reinterpret_cast<float4*>(smem);
  uint4* kv_s = smem + C::kQUnits;
  float* scale_s = reinterpret_cast<float*>(kv_s + C::kStages * C::kStageUnits);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int slot = lane / C::kLanes, part = lane % C::kLanes;
  const int rb = int(blockIdx.x % unsigned(a.row_blocks));
  const int split = int(blockIdx.x / unsigned(a.row_blocks));
  const int kvh = blockIdx.y, b = blockIdx.z;
  const PagedSeqDesc seq = a.seqs ? a.seqs[b] : a.one;

  // Rows of this block: row = i * group + g; query i sits at position seq.pos + i.
  const int row0 = rb * kRows;
  const int nrows = min(kRows, a.rows_per_head - row0);
  const int first_pos = int(seq.first_block) * int(a.page.divisor);
  const int first_q = int(seq.pos) + row0 / a.group;
  const int begin = max(first_pos, a.window > 0 ? first_q - a.window + 1 : 0);
  const int end = int(seq.pos) + (row0 + nrows - 1) / a.group + 1;
  const int per =
      (((end - begin + a.splits - 1) / a.splits + C::kTokensPerIter - 1) / C::kTokensPerIter) *
      C::kTokensPerIter;
  const int s_lo = begin + split * per;
  const int s_hi = min(end, s_lo + per);
  const int iters = s_hi > s_lo ? (s_hi - s_lo + C::kTokensPerIter - 1) / C::kTokensPerIter : 0;
  // Keys row r sees within this split: [row_lo[r], row_hi[r]] (empty for unused rows).
  int row_lo[kRows], row_hi[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int pos = int(seq.pos) + (row0 + r) / a.group;
    row_lo[r] = r < nrows ? max(begin, a.window > 0 ? pos - a.window + 1 : 0) : 1;
    row_hi[r] = r < nrows ? min(pos, s_hi - 1) : 0;
  }

  // q rows, scaled (and times K's static scale), into shared memory in the order lanes
  // read them.
  constexpr int kChunks = D / C::kVec;  // a lane's chunks per row
  static_assert(C::kVec % S::kVec == 0, "q chunks are whole 16-byte loads");
  const float q_factor = a.scale_log2 * (a.k_scales ? a.k_scales[kvh] : 1.0f);
  for (int idx = tid; idx < kRows * kChunks; idx += C::kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    float f[C::kVec];
    if (r < nrows) {
      const int row = row0 + r, i = row / a.group, g = row % a.group;
      const T* qr = static_cast<const T*>(a.q) +
                    ((int64_t(b) * a.num_q_heads + kvh * a.group + g) * a.n + i) * D;
#pragma unroll
      for (int w = 0; w < C::kVec / S::kVec; ++w) {
        S::Unpack(*reinterpret_cast<const uint4*>(qr + c * C::kVec + w * S::kVec), f + w * S::kVec);
      }
    } else {
#pragma unroll
      for (int e = 0; e < C::kVec; ++e) f[e] = 0.0f;
    }
    const int j = c / C::kLanes, p = c % C::kLanes;
#pragma unroll
    for (int h = 0; h < C::kVec / 4; ++h) {
      q_s[((r * C::kLoads + j) * (C::kVec / 4) + h) * C::kLanes + p] =
          make_float4(f[4 * h] * q_factor, f[4 * h + 1] * q_factor, f[4 * h + 2] * q_factor,
                      f[4 * h + 3] * q_factor);
    }
  }
  __syncthreads();

  // Byte offset of the K token row of this lane's token u in iteration it; -1 past the split.
  const uint8_t* pool = a.pool;
  const int64_t table_base = seq.table_offset - seq.first_block;
  const int lane_token = warp * C::kTokensPerWarp + slot;
  auto row_offset = [&](int it, int u) -> int64_t {
    const int t = s_lo + it * C::kTokensPerIter + u * C::kTokensPerStep + lane_token;
    if (it >= iters || t >= s_hi) return -1;
    uint32_t block, in_page;
    a.page.DivMod(uint32_t(t), &block, &in_page);
    const int64_t page_id = a.tables[table_base + block];
    return page_id * a.page_bytes + int64_t(in_page) * a.token_bytes;
  };
  const int64_t v_offset = int64_t(a.page.divisor) * a.token_bytes;
  const int64_t head_offset = int64_t(kvh) * D * (C::kChunkBytes / C::kVec);
  const int64_t scale_offset = a.scale_offset + 4 * int64_t(kvh);
  const bool narrow = C::kChunkBytes == 8 && a.kv_load_bytes == 4;  // uniform
  auto copy_chunk = [&](uint4* dst, const uint8_t* src, bool valid) {
    if constexpr (C::kChunkBytes == 16) {
      CpAsync16(dst, src, valid);
    } else if (narrow) {
      CpAsyncSmall<4>(dst, src, valid);
      CpAsyncSmall<4>(reinterpret_cast<uint8_t*>(dst) + 4, src + 4, valid);
    } else {
      CpAsyncSmall<8>(dst, src, valid);
    }
  };
  auto issue = [&](int stage, const int64_t(&off)[C::kUnroll]) {
    uint4* st = kv_s + stage * C::kStageUnits;
#pragma unroll
    for (int u = 0; u < C::kUnroll; ++u) {
      const uint8_t* k = pool + (off[u] >= 0 ? off[u] : 0);
#pragma unroll
      for (int j = 0; j < C::kLoads; ++j) {
        const uint8_t* kj = k + head_offset + (j * C::kLanes + part) * C::kChunkBytes;
        copy_chunk(&st[((u * 2 + 0) * C::kLoads + j) * C::kThreads + tid], kj, off[u] >= 0);
        copy_chunk(&st[((u * 2 + 1) * C::kLoads + j) * C::kThreads + tid], kj + v_offset,
                   off[u] >= 0);
      }
      if constexpr (C::kTokenScales) {  // every lane of the token copies its own
        float* sc = scale_s + ((stage * C::kUnroll + u) * 2) * C::kThreads + tid;
        CpAsyncSmall<4>(sc, k + scale_offset, off[u] >= 0);
        CpAsyncSmall<4>(sc + C::kThreads, k + v_offset + scale_offset, off[u] >= 0);
      }
    }
  };

  float m[kRows], l[kRows], acc[kRows][C::kDims];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < C::kDims; ++e) acc[r][e] = 0.0f;
  }

  int64_t off[C::kUnroll];
#pragma unroll
  for (int st = 0; st < C::kStages - 1; ++st) {
#pragma unroll
    for (int u = 0; u < C::kUnroll; ++u) off[u] = row_offset(st, u);
    if (st < iters) issue(st, off);
    CpAsyncCommit();
  }
#pragma unroll
  for (int u = 0; u < C::kUnroll; ++u) off[u] = row_offset(C::kStages - 1, u);

  for (int it = 0; it < iters; ++it) {
    // Refill the stage consumed last iteration (this lane's own slots), then look up the
    // pages of the next refill while this iteration's copies land.
    const int refill = it + C::kStages - 1;
    if (refill < iters) issue(refill % C::kStages, off);
    CpAsyncCommit();
#pragma unroll
    for (int u = 0; u < C::kUnroll; ++u) off[u] = row_offset(refill + 1, u);
    CpAsyncWait<C::kStages - 1>();

    const uint4* st = kv_s + (it % C::kStages) * C::kStageUnits;
    const float* sc = scale_s + (it % C::kStages) * C::kUnroll * 2 * C::kThreads + tid;
    int tok[C::kUnroll];
    float s[C::kUnroll][kRows];
    {
      float kf[C::kUnroll][C::kDims];
#pragma unroll
      for (int u = 0; u < C::kUnroll; ++u) {
        tok[u] = s_lo + it * C::kTokensPerIter + u * C::kTokensPerStep + lane_token;
#pragma unroll
        for (int j = 0; j < C::kLoads; ++j) {
          SK::Unpack(st[((u * 2 + 0) * C::kLoads + j) * C::kThreads + tid], &kf[u][j * C::kVec]);
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= nrows) break;  // uniform across the CTA
        float qf[C::kDims];
#pragma unroll
        for (int j = 0; j < C::kLoads; ++j) {
#pragma unroll
          for (int h = 0; h < C::kVec / 4; ++h) {
            const float4 x = q_s[((r * C::kLoads + j) * (C::kVec / 4) + h) * C::kLanes + part];
            float* d = &qf[j * C::kVec + 4 * h];
            d[0] = x.x, d[1] = x.y, d[2] = x.z, d[3] = x.w;
          }
        }
#pragma unroll
        for (int u = 0; u < C::kUnroll; ++u) {
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < C::kDims; ++e) dot = fmaf(qf[e], kf[u][e], dot);
#pragma unroll
          for (int o = C::kLanes / 2; o > 0; o /= 2) dot += __shfl_xor_sync(kFullMask, dot, o);
          if constexpr (C::kTokenScales) dot *= sc[(u * 2 + 0) * C::kThreads];
          s[u][r] = tok[u] >= row_lo[r] && tok[u] <= row_hi[r] ? dot : -INFINITY;
        }
      }
    }

    float vf[C::kUnroll][C::kDims];
#pragma unroll
    for (int u = 0; u < C::kUnroll; ++u) {
#pragma unroll
      for (int j = 0; j < C::kLoads; ++j) {
        SK::Unpack(st[((u * 2 + 1) * C::kLoads + j) * C::kThreads + tid], &vf[u][j * C::kVec]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= nrows) break;
      float mx = m[r];
#pragma unroll
      for (int u = 0; u < C::kUnroll; ++u) mx = fmaxf(mx, s[u][r]);
      if (mx == -INFINITY) continue;  // nothing visible yet (per lane; no shuffles below)
      if (mx > m[r]) {  // a new maximum: rescale what is summed (rare after the first keys)
        const float corr = exp2f(m[r] - mx);  // 0 while m[r] is still -inf
        l[r] *= corr;
#pragma unroll
        for (int e = 0; e < C::kDims; ++e) acc[r][e] *= corr;
        m[r] = mx;
      }
#pragma unroll
      for (int u = 0; u < C::kUnroll; ++u) {
        const float p = exp2f(s[u][r] - mx);
        l[r] += p;
        float pv = p;
        if constexpr (C::kTokenScales) pv *= sc[(u * 2 + 1) * C::kThreads];
#pragma unroll
        for (int e = 0; e < C::kDims; ++e) acc[r][e] = fmaf(pv, vf[u][e], acc[r][e]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // everyone is done with q_s / kv_s: the reduction reuses them

  // Merge the token slots of each warp (lanes l and l ^ o, o >= kLanes, own the same dims).
#pragma unroll
  for (int o = C::kLanes; o < 32; o *= 2) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= nrows) break;
      const float mo = __shfl_xor_sync(kFullMask, m[r], o);
      const float lo = __shfl_xor_sync(kFullMask, l[r], o);
      const float mx = fmaxf(m[r], mo);
      const float cs = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - mx);
      const float co = mo == -INFINITY ? 0.0f : exp2f(mo - mx);
      l[r] = l[r] * cs + lo * co;
#pragma unroll
      for (int e = 0; e < C::kDims; ++e) {
        acc[r][e] = acc[r][e] * cs + __shfl_xor_sync(kFullMask, acc[r][e], o) * co;
      }
      m[r] = mx;
    }
  }
  float* red_acc = reinterpret_cast<float*>(smem);  // [kWarps][kRows][D]
  float* red_m = red_acc + C::kWarps * kRows * D;   // [kWarps][kRows]
  float* red_l = red_m + C::kWarps * kRows;         // [kWarps][kRows]
  if (slot == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= nrows) break;
#pragma unroll
      for (int j = 0; j < C::kLoads; ++j) {
#pragma unroll
        for (int e = 0; e < C::kVec; ++e) {
          red_acc[(warp * kRows + r) * D + (j * C::kLanes + part) * C::kVec + e] =
              acc[r][j * C::kVec + e];
        }
      }
      if (part == 0) {
        red_m[warp * kRows + r] = m[r];
        red_l[warp * kRows + r] = l[r];
      }
    }
  }
  __syncthreads();

  // Merge the warps; write the output (one split) or this split's partials, times V's
  // static scale.
  const float v_static = a.v_scales ? a.v_scales[kvh] : 1.0f;
  for (int idx = tid; idx < nrows * D; idx += C::kThreads) {
    const int r = idx / D, d = idx % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) mx = fmaxf(mx, red_m[w * kRows + r]);
    float sum = 0.0f, val = 0.0f;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) {
      const float mw = red_m[w * kRows + r];
      const float sc = mw == -INFINITY ? 0.0f : exp2f(mw - mx);
      sum += red_l[w * kRows + r] * sc;
      val += red_acc[(w * kRows + r) * D + d] * sc;
    }
    val *= v_static;
    const int row = row0 + r, i = row / a.group, g = row % a.group;
    const int64_t out_row = (int64_t(b) * a.num_q_heads + kvh * a.group + g) * a.n + i;
    if (a.splits == 1) {
      static_cast<T*>(a.out)[out_row * D + d] = S::FromFloat(val / sum);
    } else {
      a.part_acc[(out_row * a.splits + split) * D + d] = val;
      if (d == 0) a.part_ml[out_row * a.splits + split] = make_float2(mx, sum);
    }
  }
}

}  // namespace kvarena::gpu

#endif  // KVARENA_KERNELS_CUDA_ATTENTION_KERNEL_CUH_
