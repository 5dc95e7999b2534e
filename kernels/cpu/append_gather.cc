// AppendKv / GatherKv: copies between contiguous [num_kv_heads][n][head_dim] tensors and
// the NHD pages of a PagedKvView. Both are pure byte copies, so any dtype round-trips
// bit-exactly.
#include <cstring>

#include "kernels/cpu/kv_kernels.h"

namespace kvarena {
namespace {

// Calls fn(token_index, k_token_ptr, v_token_ptr) for positions [pos, pos + n), walking
// the block table page by page instead of dividing per token.
template <class Fn>
void ForEachToken(const PagedKvView& view, int64_t pos, int64_t n, Fn&& fn) {
  const PageLayout& layout = view.layout;
  const size_t token_bytes = layout.TokenBytes();
  int64_t i = 0;
  while (i < n) {
    const int64_t t = pos + i;
    uint8_t* k = view.TokenPtr(0, t);
    uint8_t* v = view.TokenPtr(1, t);
    const int64_t in_page = layout.page_size - t % layout.page_size;
    for (int64_t j = 0; j < in_page && i < n; ++j, ++i) {
      fn(i, k + j * token_bytes, v + j * token_bytes);
    }
  }
}

}  // namespace

void AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k, const void* v) {
  const PageLayout& layout = view.layout;
  const size_t row = size_t(layout.head_dim) * layout.ElemBytes();  // one head, one token
  const auto* k_src = static_cast<const uint8_t*>(k);
  const auto* v_src = static_cast<const uint8_t*>(v);
  ForEachToken(view, pos, n, [&](int64_t i, uint8_t* k_dst, uint8_t* v_dst) {
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      const size_t src = (size_t(h) * n + i) * row;
      std::memcpy(k_dst + h * row, k_src + src, row);
      std::memcpy(v_dst + h * row, v_src + src, row);
    }
  });
}

void GatherKv(const PagedKvView& view, int64_t pos, int64_t n, void* k_out, void* v_out) {
  const PageLayout& layout = view.layout;
  const size_t row = size_t(layout.head_dim) * layout.ElemBytes();
  auto* k_dst = static_cast<uint8_t*>(k_out);
  auto* v_dst = static_cast<uint8_t*>(v_out);
  ForEachToken(view, pos, n, [&](int64_t i, const uint8_t* k_src, const uint8_t* v_src) {
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      const size_t dst = (size_t(h) * n + i) * row;
      std::memcpy(k_dst + dst, k_src + h * row, row);
      std::memcpy(v_dst + dst, v_src + h * row, row);
    }
  });
}

}  // namespace kvarena
