// Paged KV geometry and the raw view a kernel needs to read or write one layer's pages.
//
// A pool is one contiguous range of pages. A page holds the keys and then the values of
// `page_size` consecutive tokens of one layer, NHD (the FlashInfer / vLLM layout):
//   page  = [2][page_size][num_kv_heads][head_dim]
//   pool  = [num_pool_pages][2][page_size][num_kv_heads][head_dim]
// so the element of token slot s, head h, dim d of page p is at
//   pool_base + p * PageBytes() + (kv * page_size + s) * TokenBytes() + (h * head_dim + d) * elem.
// A format with per-token scales (KvFormatInfo) ends each token row with them, so the
// same addressing holds and the scale of head h is at ValueBytes() + h * scale_bytes
// within the row; a page still covers everything its tokens need.
//
// These are plain value types with no synchronisation of their own. Part of the client's
// public headers (a worker's kernels address the pool with them); kernels/ and core/ use
// them through kernels/paged_kv.h. C++17, no dependencies.
#ifndef KVARENA_CLIENT_INCLUDE_KVARENA_PAGED_KV_H_
#define KVARENA_CLIENT_INCLUDE_KVARENA_PAGED_KV_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvarena {

// The activation dtype: q, k and v in, attention out, and GetKv's tensors. The values match
// the wire enum DType; kUnspecified only ever reaches validation, never a kernel.
enum class DType : uint8_t { kUnspecified = 0, kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

// The KV format: how pages store K and V, apart from the activation dtype (FlashInfer's
// DTypeQ / DTypeKV / DTypeO split). The values match the wire enum KvFormat; the plain
// formats share their DType's value. kUnspecified ("the activation dtype's own") is
// resolved at Allocate (ResolveKvFormat) and never reaches a kernel.
enum class KvFormat : uint8_t {
  kUnspecified = 0,
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,     // symmetric int8, a float32 scale per (token, kv head): kernels/kv_quant.h
  kFp8E4M3 = 5,  // OCP fp8 e4m3fn, a static float32 scale per (layer, kv head) for K and V
};

// Where a format keeps its scales.
enum class KvScales : uint8_t {
  kNone = 0,      // values as they are
  kPerToken = 1,  // one float32 per (token, kv head), after the token's values in its row
  kPerHead = 2,   // static: one float32 per (layer, kv head) for K and for V, given at
                  // Allocate (CacheSpec.k_scales / v_scales), outside the pages
};

// DLPack's type codes (dlpack.h's DLDataTypeCode), so this header needs no dlpack.h.
enum class DLPackCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4 };

// The table of activation dtypes, one row each: every switch on a dtype reads it.
struct DTypeInfo {
  DType dtype;
  const char* name;  // as the wire, the metrics and Python name it
  uint8_t bytes;
  DLPackCode dlpack_code;
};
inline constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", 4, DLPackCode::kFloat},
    {DType::kFloat16, "float16", 2, DLPackCode::kFloat},
    {DType::kBFloat16, "bfloat16", 2, DLPackCode::kBfloat},
};

// The table of KV formats, one row each: every switch on a format reads it. A page's
// token row (K or V of one token, all heads) is its values, [num_kv_heads][head_dim] of
// elem_bytes each, then with kPerToken its scales, [num_kv_heads] float32.
struct KvFormatInfo {
  KvFormat format;
  const char* name;  // as CacheSpec.kv_format, the metrics and Python name it
  uint8_t elem_bytes;
  KvScales scales;
  uint8_t scale_bytes;     // per scale (0 without)
  DType element;           // the dtype a value is stored as; kUnspecified when quantized
  DLPackCode dlpack_code;  // DLPack's type of one stored value (elem_bytes * 8 bits)
};
inline constexpr KvFormatInfo kKvFormats[] = {
    {KvFormat::kFloat32, "float32", 4, KvScales::kNone, 0, DType::kFloat32, DLPackCode::kFloat},
    {KvFormat::kFloat16, "float16", 2, KvScales::kNone, 0, DType::kFloat16, DLPackCode::kFloat},
    {KvFormat::kBFloat16, "bfloat16", 2, KvScales::kNone, 0, DType::kBFloat16, DLPackCode::kBfloat},
    {KvFormat::kInt8, "int8", 1, KvScales::kPerToken, 4, DType::kUnspecified, DLPackCode::kInt},
    // Handed out as bytes: DLPack 1.0 has no fp8 code every consumer reads.
    {KvFormat::kFp8E4M3, "fp8_e4m3", 1, KvScales::kPerHead, 4, DType::kUnspecified,
     DLPackCode::kUInt},
};

// The table's row for t or f; nullptr for kUnspecified and values outside the table.
constexpr const DTypeInfo* FindDType(DType t) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.dtype == t) return &i;
  }
  return nullptr;
}
constexpr const KvFormatInfo* FindKvFormat(KvFormat f) {
  for (const KvFormatInfo& i : kKvFormats) {
    if (i.format == f) return &i;
  }
  return nullptr;
}

// Bytes of one element of t; 0 for kUnspecified.
constexpr size_t DTypeSize(DType t) { return FindDType(t) != nullptr ? FindDType(t)->bytes : 0; }
// "float32", "float16", "bfloat16", "unspecified".
constexpr const char* DTypeName(DType t) {
  return FindDType(t) != nullptr ? FindDType(t)->name : "unspecified";
}
// "float16", "int8", ...; "unspecified".
constexpr const char* KvFormatName(KvFormat f) {
  return FindKvFormat(f) != nullptr ? FindKvFormat(f)->name : "unspecified";
}
// Where format f keeps its scales (kNone for a format outside the table).
constexpr KvScales ScalesOf(KvFormat f) {
  return FindKvFormat(f) != nullptr ? FindKvFormat(f)->scales : KvScales::kNone;
}
// The format that stores values as dtype t does.
constexpr KvFormat NativeKvFormat(DType t) { return KvFormat(uint8_t(t)); }
// The rule for an unset format, in one place: kUnspecified means the activation dtype's own.
constexpr KvFormat ResolveKvFormat(KvFormat f, DType t) {
  return f == KvFormat::kUnspecified ? NativeKvFormat(t) : f;
}

// ceil(a / b), for a >= 0 and b > 0: pages for a count of tokens, tiles, chunks; and a
// rounded up to a multiple of b. Signed counts take the int64_t forms; sizes in bytes
// (both arguments size_t) the size_t ones.
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }
template <typename T, typename = std::enable_if_t<std::is_same_v<T, size_t>>>
constexpr T CeilDiv(T a, T b) {
  return (a + b - 1) / b;
}
template <typename T, typename = std::enable_if_t<std::is_same_v<T, size_t>>>
constexpr T RoundUp(T a, T b) {
  return CeilDiv(a, b) * b;
}

// The pages of page_size tokens that positions [first_pos, end) take, counted from the
// page-aligned first_pos of a block table: 0 when end <= first_pos.
constexpr int64_t PagesCovering(int64_t first_pos, int64_t end, int64_t page_size) {
  return end > first_pos ? CeilDiv(end - first_pos, page_size) : 0;
}

// Attention's softmax scale when the caller gives none (scale <= 0): 1 / sqrt(head_dim).
inline float DefaultScale(int head_dim) { return 1.0f / std::sqrt(float(head_dim)); }
// The scale an attention call runs with: the caller's `scale` when positive, else the default.
inline float AttentionScale(double scale, int head_dim) {
  return scale > 0 ? float(scale) : DefaultScale(head_dim);
}

// The geometry shared by every page of one pool, and the dtype its caches compute in.
struct PageLayout {
  DType dtype = DType::kFloat16;  // the activation dtype
  int page_size = 16;             // tokens per page
  int num_kv_heads = 0;
  int head_dim = 0;
  KvFormat kv_format = KvFormat::kUnspecified;  // how pages store K/V (unset: as dtype)

  KvFormat format() const { return ResolveKvFormat(kv_format, dtype); }
  // One stored value of K or V (0 for a format outside the table).
  size_t ElemBytes() const {
    const KvFormatInfo* f = FindKvFormat(format());
    return f != nullptr ? f->elem_bytes : 0;
  }
  // One element of q, k, v or the output as callers pass them.
  size_t ActivationBytes() const { return DTypeSize(dtype); }
  // The values of one token of K (or V), all heads: [num_kv_heads][head_dim].
  size_t ValueBytes() const { return size_t(num_kv_heads) * head_dim * ElemBytes(); }
  // The scales of one token of K (or V), after its values: [num_kv_heads] (0 without).
  size_t ScaleBytes() const {
    return ScalesOf(format()) == KvScales::kPerToken
               ? size_t(num_kv_heads) * FindKvFormat(format())->scale_bytes
               : 0;
  }
  // One token's row of K (or V): its values, then its scales.
  size_t TokenBytes() const { return ValueBytes() + ScaleBytes(); }
  // One page: [2][page_size] token rows, K's then V's.
  size_t PageBytes() const { return 2 * size_t(page_size) * TokenBytes(); }
};

// One layer's pages inside a pool. Absolute token position t lives in
// block_table[t / page_size - first_block] at slot t % page_size. Positions below
// first_block * page_size have been evicted (sliding window) and cannot be read.
struct PagedKvView {
  PageLayout layout;
  uint8_t* pool_base = nullptr;          // [num_pool_pages][2][page_size][num_kv_heads][head_dim]
  const int32_t* block_table = nullptr;  // [num_blocks] pool page ids
  int64_t first_block = 0;               // logical page index of block_table[0]
  int64_t num_blocks = 0;
  int64_t len = 0;  // tokens written: positions [first_pos(), len) are readable
  // A format with static scales (KvScales::kPerHead): this layer's, [num_kv_heads] each;
  // stored value = x / scale, read back as value * scale. nullptr: every scale is 1.
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;

  int64_t first_pos() const { return first_block * layout.page_size; }
  // The static scale of K (kv=0) or V (kv=1) of kv head h: 1 without.
  float StaticScale(int kv, int h) const {
    const float* s = kv == 0 ? k_scales : v_scales;
    return s != nullptr ? s[h] : 1.0f;
  }
  // Address of K (kv=0) or V (kv=1) of absolute position t, all heads.
  uint8_t* TokenPtr(int kv, int64_t t) const {
    const int64_t block = t / layout.page_size - first_block;
    const int64_t slot = t % layout.page_size;
    return pool_base + size_t(block_table[block]) * layout.PageBytes() +
           (size_t(kv) * layout.page_size + size_t(slot)) * layout.TokenBytes();
  }
};

// One page copy (KvKernels::CopyPages): token slots [0, tokens) of K and of V of page
// src go to the same slots of page dst; dst's slots [tokens, page_size) are zeroed.
struct PageCopy {
  int32_t src = 0;
  int32_t dst = 0;
  int32_t tokens = 0;  // 0 <= tokens <= page_size
};

}  // namespace kvarena

#endif  // KVARENA_CLIENT_INCLUDE_KVARENA_PAGED_KV_H_
