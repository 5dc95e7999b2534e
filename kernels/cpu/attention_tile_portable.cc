// Portable C++ implementation of the attention tile step (see attention_tile.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/dtype_convert.h"
#include "kernels/kv_quant.h"

namespace kvarena {
namespace cpu_internal {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Eight partial sums: independent chains the compiler can also keep in vector registers.
float Dot(const float* a, const float* b, int n) {
  float part[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) part[j] += a[i + j] * b[i + j];
  }
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 8; ++j) s += part[j];
  return s;
}

// acc[0, n) += p * v[0, n), in fixed blocks of 8 that -O2 vectorises.
void Axpy(float p, const float* __restrict v, int n, float* __restrict acc) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[i + j] += p * v[i + j];
  }
  for (; i < n; ++i) acc[i] += p * v[i];
}

// This kv head's K or V of the token whose row starts at `row`, as floats: converted from
// a plain format's element type, an int8 format's codes times its scale, or fp8 codes'
// values / kFp8TileScale (their static scales are the caller's: attention.cc).
void LoadRow(const AttendTileArgs& args, DType element, const uint8_t* row, float* out) {
  if (args.kv_format == KvFormat::kFp8E4M3)
    return DequantizeFp8E4M3(row + args.head_offset, args.head_dim, 1.0f / kFp8TileScale, out);
  if (args.scale_offset == 0)
    return LoadAsFloat(element, row + args.head_offset, args.head_dim, out);
  float scale;
  std::memcpy(&scale, row + args.scale_offset, sizeof(scale));
  DequantizeInt8(reinterpret_cast<const int8_t*>(row + args.head_offset), args.head_dim, scale,
                 out);
}

}  // namespace

void PortableAttendTile(const AttendTileArgs& args) {
  const int rows = args.rows;
  const int dim = args.head_dim;
  const DType element = FindKvFormat(args.kv_format)->element;  // kUnspecified: quantized
  float* scores = args.scratch;                                 // [rows][kTileTokens]
  float* corr = args.scratch + size_t(rows) * kTileTokens;      // [rows]
  thread_local std::vector<float> row_buf;
  thread_local std::vector<int> range_buf;
  row_buf.resize(size_t(dim));
  range_buf.resize(size_t(rows) * 2);
  float* kv_row = row_buf.data();  // [dim]
  int* first = range_buf.data();   // [rows] visible tile range [first, last)
  int* last = first + rows;        // [rows]

  int lo_all = args.tokens, hi_all = 0;
  for (int r = 0; r < rows; ++r) {
    first[r] = int(std::clamp<int64_t>(args.row_lo[r] - args.pos0, 0, args.tokens));
    last[r] = int(std::clamp<int64_t>(args.row_hi[r] + 1 - args.pos0, 0, args.tokens));
    if (first[r] < last[r]) {
      lo_all = std::min(lo_all, first[r]);
      hi_all = std::max(hi_all, last[r]);
    }
  }
  if (lo_all >= hi_all) return;

  // Scores, each K converted once for all rows.
  for (int t = lo_all; t < hi_all; ++t) {
    LoadRow(args, element, args.k[t], kv_row);
    for (int r = 0; r < rows; ++r) {
      if (t >= first[r] && t < last[r]) {
        scores[size_t(r) * kTileTokens + t] = Dot(args.q + size_t(r) * dim, kv_row, dim);
      }
    }
  }
  // Online softmax: scores become weights 2^(s - m).
  for (int r = 0; r < rows; ++r) {
    corr[r] = 1;
    if (first[r] >= last[r]) continue;
    float* s = scores + size_t(r) * kTileTokens;
    float m_new = args.m[r];
    for (int t = first[r]; t < last[r]; ++t) m_new = std::max(m_new, s[t]);
    float sum = 0;
    for (int t = first[r]; t < last[r]; ++t) {
      s[t] = std::exp2(s[t] - m_new);
      sum += s[t];
    }
    corr[r] = args.m[r] == kNegInf ? 0.0f : std::exp2(args.m[r] - m_new);
    args.l[r] = args.l[r] * corr[r] + sum;
    args.m[r] = m_new;
    float* acc = args.acc + size_t(r) * dim;
    for (int d = 0; d < dim; ++d) acc[d] *= corr[r];
  }
  // Weighted V, each V converted once for all rows.
  for (int t = lo_all; t < hi_all; ++t) {
    LoadRow(args, element, args.v[t], kv_row);
    for (int r = 0; r < rows; ++r) {
      if (t < first[r] || t >= last[r]) continue;
      Axpy(scores[size_t(r) * kTileTokens + t], kv_row, dim, args.acc + size_t(r) * dim);
    }
  }
}

}  // namespace cpu_internal
}  // namespace kvarena
