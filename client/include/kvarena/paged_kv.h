// Paged KV geometry and the raw view a kernel needs to read or write one layer's pages.
//
// A pool is one contiguous range of pages. A page holds the keys and then the values of
// `page_size` consecutive tokens of one layer, NHD (the FlashInfer / vLLM layout):
//   page  = [2][page_size][num_kv_heads][head_dim]
//   pool  = [num_pool_pages][2][page_size][num_kv_heads][head_dim]
// so the element of token slot s, head h, dim d of page p is at
//   pool_base + p * PageBytes() + (kv * page_size + s) * TokenBytes() + (h * head_dim + d) * elem.
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

// Storage type of K/V and of attention inputs/outputs. The values match the wire enum;
// kUnspecified only ever reaches validation, never a kernel.
enum class DType : uint8_t { kUnspecified = 0, kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUnspecified:
      break;
  }
  return 0;
}
// "float32", "float16", "bfloat16", "unspecified".
inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kUnspecified:
      break;
  }
  return "unspecified";
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

// The geometry shared by every page of one pool.
struct PageLayout {
  DType dtype = DType::kFloat16;
  int page_size = 16;  // tokens per page
  int num_kv_heads = 0;
  int head_dim = 0;

  size_t ElemBytes() const { return DTypeSize(dtype); }
  // One token of K (or V) for all heads: [num_kv_heads][head_dim].
  size_t TokenBytes() const { return size_t(num_kv_heads) * head_dim * ElemBytes(); }
  // One page: [2][page_size][num_kv_heads][head_dim].
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

  int64_t first_pos() const { return first_block * layout.page_size; }
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
