// AttentionParams: what one paged-attention call computes, the same for the CPU kernels
// (kernels/cpu/kv_kernels.h), the CUDA ones (kernels/cuda/kv_kernels_cuda.h) and core's
// KvKernels interface (kernels/kv_kernels.h).
#ifndef KVARENA_KERNELS_ATTENTION_PARAMS_H_
#define KVARENA_KERNELS_ATTENTION_PARAMS_H_

#include <cstdint>

namespace kvarena {

class StopToken;

struct AttentionParams {
  int num_q_heads = 0;  // a multiple of layout.num_kv_heads (GQA)
  int64_t q_pos = 0;    // absolute position of the first query
  int64_t n = 1;        // queries: positions [q_pos, q_pos + n)
  float scale = 0;      // softmax scale (callers set it with AttentionScale, kvarena/paged_kv.h)
  int64_t window = 0;   // 0: full causal; w >= 1: query at p sees keys in (p - w, p]
  // Polled between units of work (kernels/stop_token.h); null: run to the end. Must
  // outlive the call.
  const StopToken* stop = nullptr;
};

}  // namespace kvarena

#endif  // KVARENA_KERNELS_ATTENTION_PARAMS_H_
