// Test-only: this directory's kernels compiled as host C++ for the fiber emulator
// (emulator.h), in namespace kvarena::gpu_emu so they can never be confused with the real
// kernels' launch stubs (same names) in kvarena_kernels_cuda, and RunEmulatedAttention,
// which plans and prepares an attention call as attention.cu does and runs it here.
// Shared by the emulator tests. Include it LAST: emulator.h defines the CUDA built-ins as
// macros. Not thread-safe (one emulated grid at a time).
#ifndef KVARENA_KERNELS_CUDA_EMULATOR_KERNELS_H_
#define KVARENA_KERNELS_CUDA_EMULATOR_KERNELS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kv_quant.cuh"
// Last: defines the CUDA built-ins as macros.
#include "kernels/cuda/emulator.h"

namespace kvarena {
namespace gpu_real = gpu;
namespace gpu_emu {
using namespace gpu_real;
using std::max;
using std::min;
}  // namespace gpu_emu
}  // namespace kvarena
#define gpu gpu_emu
#include "kernels/cuda/append_kernel.cuh"
#include "kernels/cuda/attention_kernel.cuh"
#include "kernels/cuda/attention_merge.cuh"
#include "kernels/cuda/quant_append_kernel.cuh"
#undef gpu

namespace kvarena::gpu_emu {
// PagedAttentionKernel's dynamic shared memory, and MergeSplitsKernel's.
alignas(16) inline uint4 smem[48 * 1024 / 16];
alignas(16) inline float merge_smem[kMaxSplits + 32];
}  // namespace kvarena::gpu_emu

namespace kvarena::gpu::testing {

template <typename T, typename KV, int D>
void EmulateAttention(const AttentionArgs& a, int batch) {
  using C = gpu_emu::AttentionConfig<KV, D>;
  emu::LaunchGrid(AttentionGrid(a, batch), dim3(C::kThreads), gpu_emu::smem, C::kSmemBytes,
                  [&] { gpu_emu::PagedAttentionKernel<T, KV, D>(a); });
  if (a.splits == 1) return;
  const unsigned rows = unsigned(batch) * a.num_q_heads * a.n;
  emu::LaunchGrid(dim3(rows), dim3(gpu_emu::kMergeThreads), gpu_emu::merge_smem,
                  gpu_emu::MergeSmemBytes(a.splits), [&] {
                    gpu_emu::MergeSplitsKernel<T>(a.part_ml, a.part_acc, static_cast<T*>(a.out),
                                                  a.splits, D);
                  });
}

// Plans for `slots` resident CTAs, prepares the arguments like attention.cu (a: pool,
// tables, seqs / one, q, out and the static scales set), runs the emulated kernels;
// returns the splits used.
inline int RunEmulatedAttention(const PageLayout& layout, const AttentionParams& p, AttentionArgs a,
                                int batch, int64_t max_span, int64_t slots) {
  AttentionPlan plan;
  EXPECT_EQ(PlanAttentionRequest(layout, p, batch, max_span, slots, &plan), cudaSuccess);
  std::vector<float4> workspace(plan.workspace_bytes / 16 + 1);
  bool launch = false;
  EXPECT_EQ(PrepareAttention(layout, p, batch, plan, workspace.data(), workspace.size() * 16, &a,
                             &launch),
            cudaSuccess);
  if (!launch) return 0;
  EXPECT_EQ(DispatchDType(layout.dtype,
                          [&](auto t) {
                            using T = decltype(t);
                            return DispatchKvStorage<T>(
                                layout.format(), layout.dtype, [&](auto kv) {
                                  return DispatchHeadDim(layout.head_dim, [&](auto d) {
                                    EmulateAttention<T, decltype(kv), decltype(d)::value>(a, batch);
                                    return cudaSuccess;
                                  });
                                });
                          }),
            cudaSuccess);
  return plan.splits;
}

}  // namespace kvarena::gpu::testing

#endif  // KVARENA_KERNELS_CUDA_EMULATOR_KERNELS_H_
