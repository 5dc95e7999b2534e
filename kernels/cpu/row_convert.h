// Whole rows between a cache's dtype and float32: the queries on their way into
// PagedAttention and its output on the way out. Chosen at run time like the tile step
// (attention_tile_select.cc); every variant gives bit for bit what dtype_convert.h's
// LoadAsFloat / StoreFromFloat give (exact in; round to nearest even out, NaN quieted).
#ifndef KVARENA_KERNELS_CPU_ROW_CONVERT_H_
#define KVARENA_KERNELS_CPU_ROW_CONVERT_H_

#include <cstddef>

#include "kernels/paged_kv.h"

namespace kvarena::cpu_internal {

// src: [n] elements of dtype -> dst: [n] floats.
using LoadRowFn = void (*)(DType dtype, const void* src, size_t n, float* dst);
// src: [n] floats -> dst: [n] elements of dtype.
using StoreRowFn = void (*)(DType dtype, const float* src, size_t n, void* dst);

struct RowConvert {
  LoadRowFn load;
  StoreRowFn store;
};

// F16C conversions, 8 elements an instruction. REQUIRES: CpuKernelsSupported() >= kAvx2,
// dtype float16 or bfloat16.
void Avx2LoadRow(DType dtype, const void* src, size_t n, float* dst);
void Avx2StoreRow(DType dtype, const float* src, size_t n, void* dst);

// The conversions for dtype with the kernels in use (CpuKernelsInUse()): AVX2 for float16
// and bfloat16 from kAvx2 up, else dtype_convert.h's portable ones (float32 is a copy).
RowConvert SelectRowConvert(DType dtype);

}  // namespace kvarena::cpu_internal

#endif  // KVARENA_KERNELS_CPU_ROW_CONVERT_H_
