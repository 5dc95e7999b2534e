// AppendKv / GatherKv launchers: validate and fill the arguments (kernel_args.cc), then
// dispatch the vector width to AppendKvKernel / GatherKvKernel (append_kernel.cuh), or
// for a quantized format the activation dtype and format to QuantAppendKvKernel /
// QuantGatherKvKernel (quant_append_kernel.cuh).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/append_kernel.cuh"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kv_kernels_cuda.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/quant_append_kernel.cuh"

namespace kvarena::gpu {
namespace {

template <typename V>
cudaError_t Launch(bool gather, dim3 grid, const AppendArgs& a, cudaStream_t stream) {
  if (gather) {
    GatherKvKernel<V><<<grid, kAppendThreads, 0, stream>>>(a);
  } else {
    AppendKvKernel<V><<<grid, kAppendThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t QuantCopy(bool gather, const PageLayout& layout, AppendArgs a, int batch, int64_t n,
                      int64_t max_pos, cudaStream_t stream) {
  dim3 grid;
  bool launch = false;
  if (cudaError_t e = PrepareQuantAppend(layout, batch, n, max_pos, &a, &grid, &launch);
      e != cudaSuccess || !launch) {
    return e;
  }
  return DispatchDType(layout.dtype, [&](auto t) {
    using T = decltype(t);
    return DispatchKvStorage<T>(layout.format(), layout.dtype, [&](auto kv) -> cudaError_t {
      using KV = decltype(kv);
      if constexpr (std::is_same_v<KV, Int8Kv> || std::is_same_v<KV, Fp8Kv>) {
        if (gather) {
          QuantGatherKvKernel<T, KV><<<grid, kAppendThreads, 0, stream>>>(a);
        } else {
          QuantAppendKvKernel<T, KV><<<grid, kAppendThreads, 0, stream>>>(a);
        }
        return cudaGetLastError();
      } else {
        return cudaErrorInvalidValue;  // a plain format: Copy's
      }
    });
  });
}

cudaError_t Copy(bool gather, const PageLayout& layout, AppendArgs a, int batch, int64_t n,
                 int64_t max_pos, cudaStream_t stream) {
  if (ScalesOf(layout.format()) != KvScales::kNone) {
    return QuantCopy(gather, layout, a, batch, n, max_pos, stream);
  }
  int vec_bytes = 0;
  dim3 grid;
  bool launch = false;
  if (cudaError_t e = PrepareAppend(layout, batch, n, max_pos, &a, &vec_bytes, &grid, &launch);
      e != cudaSuccess || !launch) {
    return e;
  }
  switch (vec_bytes) {
    case 16:
      return Launch<uint4>(gather, grid, a, stream);
    case 2:
      return Launch<uint16_t>(gather, grid, a, stream);
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

AppendArgs SingleArgs(const PagedKvView& view, int64_t pos, const void* k, const void* v) {
  AppendArgs a{};
  a.pool = view.pool_base;
  a.tables = view.block_table;
  a.seqs = nullptr;
  a.one = PagedSeqDesc{0, view.first_block, pos};
  a.k = static_cast<uint8_t*>(const_cast<void*>(k));  // append only reads them
  a.v = static_cast<uint8_t*>(const_cast<void*>(v));
  a.scales[0] = view.k_scales;
  a.scales[1] = view.v_scales;
  return a;
}

}  // namespace

cudaError_t AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k, const void* v,
                     cudaStream_t stream) {
  return Copy(false, view.layout, SingleArgs(view, pos, k, v), 1, n, pos, stream);
}

cudaError_t GatherKv(const PagedKvView& view, int64_t pos, int64_t n, void* k_out, void* v_out,
                     cudaStream_t stream) {
  return Copy(true, view.layout, SingleArgs(view, pos, k_out, v_out), 1, n, pos, stream);
}

cudaError_t AppendKvBatch(const PagedKvBatch& batch, int64_t n, const void* k, const void* v,
                          cudaStream_t stream) {
  if (batch.seqs == nullptr && batch.batch > 0) return cudaErrorInvalidValue;
  AppendArgs a{};
  a.pool = batch.pool_base;
  a.tables = batch.block_tables;
  a.seqs = batch.seqs;
  a.k = static_cast<uint8_t*>(const_cast<void*>(k));  // append only reads them
  a.v = static_cast<uint8_t*>(const_cast<void*>(v));
  a.scales[0] = batch.k_scales;
  a.scales[1] = batch.v_scales;
  // Positions live on the device; keeping them below 2^31 is the caller's part.
  return Copy(false, batch.layout, a, batch.batch, n, 0, stream);
}

}  // namespace kvarena::gpu
