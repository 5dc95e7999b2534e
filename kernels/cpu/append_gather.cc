// AppendKv / GatherKv: copies between contiguous [num_kv_heads][n][head_dim] tensors and
// the NHD pages of a PagedKvView. A plain format stores what it is given (pure byte
// copies: any dtype round-trips bit-exactly); a quantized one (int8, fp8_e4m3) quantizes
// each (token, head) row at append and dequantizes it at gather (kernels/kv_quant.h).
#include <cstring>
#include <vector>

#include "kernels/cpu/dtype_convert.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/kv_quant.h"

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

// The quantized formats' halves of AppendKv and GatherKv: the tensors in the activation
// dtype, each (token, kv head) row through kernels/kv_quant.h; int8 keeps its scale after
// the token's codes, fp8 reads the view's static scale of the head.
void AppendQuantized(const PagedKvView& view, int64_t pos, int64_t n, const void* k,
                     const void* v) {
  const PageLayout& l = view.layout;
  const bool int8 = l.format() == KvFormat::kInt8;
  const int dim = l.head_dim;
  const size_t src_row = size_t(dim) * l.ActivationBytes(), values = l.ValueBytes();
  const uint8_t* src[2] = {static_cast<const uint8_t*>(k), static_cast<const uint8_t*>(v)};
  std::vector<float> x(static_cast<size_t>(dim));
  ForEachToken(view, pos, n, [&](int64_t i, uint8_t* k_dst, uint8_t* v_dst) {
    uint8_t* dst[2] = {k_dst, v_dst};
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < l.num_kv_heads; ++h) {
        cpu_internal::LoadAsFloat(l.dtype, src[kv] + (size_t(h) * n + i) * src_row, dim, x.data());
        uint8_t* codes = dst[kv] + size_t(h) * dim;
        if (!int8) {
          QuantizeFp8E4M3(x.data(), dim, view.StaticScale(kv, h), codes);
          continue;
        }
        const float scale = Int8Scale(x.data(), dim);
        QuantizeInt8(x.data(), dim, scale, reinterpret_cast<int8_t*>(codes));
        std::memcpy(dst[kv] + values + size_t(h) * sizeof(float), &scale, sizeof(float));
      }
    }
  });
}

void GatherQuantized(const PagedKvView& view, int64_t pos, int64_t n, void* k_out, void* v_out) {
  const PageLayout& l = view.layout;
  const bool int8 = l.format() == KvFormat::kInt8;
  const int dim = l.head_dim;
  const size_t dst_row = size_t(dim) * l.ActivationBytes(), values = l.ValueBytes();
  uint8_t* dst[2] = {static_cast<uint8_t*>(k_out), static_cast<uint8_t*>(v_out)};
  std::vector<float> x(static_cast<size_t>(dim));
  ForEachToken(view, pos, n, [&](int64_t i, const uint8_t* k_src, const uint8_t* v_src) {
    const uint8_t* src[2] = {k_src, v_src};
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < l.num_kv_heads; ++h) {
        const uint8_t* codes = src[kv] + size_t(h) * dim;
        if (int8) {
          float scale;
          std::memcpy(&scale, src[kv] + values + size_t(h) * sizeof(float), sizeof(float));
          DequantizeInt8(reinterpret_cast<const int8_t*>(codes), dim, scale, x.data());
        } else {
          DequantizeFp8E4M3(codes, dim, view.StaticScale(kv, h), x.data());
        }
        cpu_internal::StoreFromFloat(l.dtype, x.data(), dim,
                                     dst[kv] + (size_t(h) * n + i) * dst_row);
      }
    }
  });
}

}  // namespace

void AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k, const void* v) {
  const PageLayout& layout = view.layout;
  if (FindKvFormat(layout.format())->element == DType::kUnspecified) {
    return AppendQuantized(view, pos, n, k, v);
  }
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
  if (FindKvFormat(layout.format())->element == DType::kUnspecified) {
    return GatherQuantized(view, pos, n, k_out, v_out);
  }
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
