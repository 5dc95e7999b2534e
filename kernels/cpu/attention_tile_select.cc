// The run-time choice of the attention tile step (attention_tile.h, cpu_kernels.h) and
// of the row conversions (row_convert.h): cpuid once, the KVARENA_CPU_KERNELS cap once, the test
// hook's cap on every call.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dtype_convert.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cpu/row_convert.h"

namespace kvarena {
namespace {

constexpr CpuKernels kAll[] = {CpuKernels::kPortable, CpuKernels::kAvx2, CpuKernels::kAvx512,
                               CpuKernels::kAvx512Vnni, CpuKernels::kAvx512Bf16};

CpuKernels Lower(CpuKernels a, CpuKernels b) { return int(a) < int(b) ? a : b; }

#if defined(__x86_64__)
// XCR0: which register state the OS saves (XGETBV 0; only valid when OSXSAVE is set).
uint64_t Xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuKernels DetectCpuKernels() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return CpuKernels::kPortable;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), f16c = c & (1u << 29);
  if (!osxsave || !fma || !f16c) return CpuKernels::kPortable;
  const uint64_t xcr0 = Xcr0();
  if ((xcr0 & 0x6) != 0x6) return CpuKernels::kPortable;  // SSE + AVX state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return CpuKernels::kPortable;
  if (!(b & (1u << 5))) return CpuKernels::kPortable;                            // AVX2
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31));  // F, BW, VL
  if (!avx512 || (xcr0 & 0xe0) != 0xe0) return CpuKernels::kAvx2;  // + opmask, ZMM state
  if (!(c & (1u << 11))) return CpuKernels::kAvx512;               // AVX512_VNNI
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  const bool bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));
  return bf16 ? CpuKernels::kAvx512Bf16 : CpuKernels::kAvx512Vnni;
}
#else
CpuKernels DetectCpuKernels() { return CpuKernels::kPortable; }
#endif

// KVARENA_CPU_KERNELS: a cap from start-up on.
CpuKernels EnvCap() {
  const char* env = std::getenv("KVARENA_CPU_KERNELS");
  if (env == nullptr || *env == '\0') return CpuKernels::kAvx512Bf16;
  for (CpuKernels k : kAll) {
    if (std::strcmp(env, CpuKernelsName(k)) == 0) return k;
  }
  std::fprintf(stderr,
               "kvarena: KVARENA_CPU_KERNELS=%s is none of portable, avx2, avx512, avx512_vnni, "
               "avx512_bf16; "
               "ignored\n",
               env);
  return CpuKernels::kAvx512Bf16;
}

std::atomic<CpuKernels> forced{CpuKernels::kAvx512Bf16};  // TEST_ForceCpuKernels

}  // namespace

const char* CpuKernelsName(CpuKernels kernels) {
  switch (kernels) {
    case CpuKernels::kPortable:
      return "portable";
    case CpuKernels::kAvx2:
      return "avx2";
    case CpuKernels::kAvx512:
      return "avx512";
    case CpuKernels::kAvx512Vnni:
      return "avx512_vnni";
    case CpuKernels::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "unknown";
}

CpuKernels CpuKernelsSupported() {
  static const CpuKernels supported = DetectCpuKernels();
  return supported;
}

CpuKernels CpuKernelsInUse() {
  static const CpuKernels capped = Lower(CpuKernelsSupported(), EnvCap());
  return Lower(capped, forced.load(std::memory_order_relaxed));
}

void TEST_ForceCpuKernels(CpuKernels kernels) { forced.store(kernels, std::memory_order_relaxed); }

bool CpuKernelsVectorized() { return CpuKernelsInUse() != CpuKernels::kPortable; }

namespace cpu_internal {

AttendTileFn SelectAttendTile(int head_dim, DType dtype, KvFormat kv_format) {
  const CpuKernels use = CpuKernelsInUse();
  if (use == CpuKernels::kAvx512Bf16 && dtype == DType::kBFloat16 &&
      kv_format == KvFormat::kBFloat16 && head_dim % 32 == 0) {
    return &Avx512Bf16AttendTile;
  }
  if (use == CpuKernels::kAvx512Bf16 && kv_format == KvFormat::kFp8E4M3 && head_dim % 32 == 0) {
    return &Avx512Bf16Fp8AttendTile;
  }
  if (use >= CpuKernels::kAvx512Vnni && kv_format == KvFormat::kInt8 && head_dim % 64 == 0) {
    return &Avx512VnniAttendTile;
  }
  if (use >= CpuKernels::kAvx512 && head_dim % 16 == 0) return &Avx512AttendTile;
  if (use >= CpuKernels::kAvx2 && head_dim % 8 == 0) return &Avx2AttendTile;
  return &PortableAttendTile;
}

RowConvert SelectRowConvert(DType dtype) {
  const bool halves = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  if (halves && CpuKernelsInUse() >= CpuKernels::kAvx2) return {&Avx2LoadRow, &Avx2StoreRow};
  return {&LoadAsFloat, &StoreFromFloat};
}

}  // namespace cpu_internal
}  // namespace kvarena
