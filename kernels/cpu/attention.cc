// PagedAttention: splits the work into units, runs them on the pool, merges the splits.
//
// A unit is (query block, group of kv heads, split of the key range). It walks its keys
// in tiles of kTileTokens consecutive positions (so tiles cross page boundaries freely),
// and for each tile runs the tile step (attention_tile.h) once per kv head over all the
// query rows of that head: the g = num_q_heads / num_kv_heads heads of the GQA group times
// the block's queries, so each K/V element is loaded once for all of them. Walking tiles
// outermost and heads inside reads the pages in address order.
//
// Decode (n = 1) puts every kv head in one unit and splits long contexts into key ranges
// (flash-decoding); each split leaves (m, l, acc) per row and the caller merges them.
// Prefill uses one head per unit and blocks of queries, splitting keys only when there
// are too few units for the threads. The tile step is also handed the next tile's
// token pointers, to prefetch them while it computes. A batch (PagedAttentionBatch) plans
// each sequence for its share of the threads and runs the units of all of them in one
// ParallelFor.
//
// With params.stop, every unit polls it before it starts and every kTilesPerPoll tiles
// while it runs; once it says stop, the units left return at once and nothing is merged.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/dtype_convert.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cpu/row_convert.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_quant.h"
#include "kernels/stop_token.h"

namespace kvarena {
namespace {

using cpu_internal::AttendTileArgs;
using cpu_internal::AttendTileFn;
using cpu_internal::kTileTokens;

// K's (kv 0) or V's (kv 1) static scale of head h as the tiles need it: times
// kFp8TileScale for fp8, whose codes they read as value / 2^8; 1 without.
float TileStaticScale(const PagedKvView& view, int kv, int h) {
  const float s = view.StaticScale(kv, h);
  return view.layout.format() == KvFormat::kFp8E4M3 ? s * cpu_internal::kFp8TileScale : s;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kMaxRowsPerUnit = 64;       // query rows whose state one unit keeps
constexpr int64_t kMinSplitTokens = 256;  // shortest key range worth its own split
constexpr int kUnitsPerThread = 4;        // slack for load balance
constexpr int kTilesPerPoll = 64;         // a running unit polls params.stop this often

struct Plan {
  int group = 1;      // q heads per kv head
  int64_t block = 1;  // queries per query block
  int64_t q_blocks = 1;
  int heads_per_unit = 1;
  int head_chunks = 1;
  int64_t splits = 1;
  int64_t num_units() const { return q_blocks * head_chunks * splits; }
};

// Everything a unit reads, plus where it writes.
struct Call {
  const PagedKvView* view = nullptr;
  const AttentionParams* params = nullptr;
  Plan plan;
  AttendTileFn tile_fn = nullptr;
  cpu_internal::RowConvert rows{};  // q in, the output out
  const float* qs = nullptr;        // [num_kv_heads][n][group][head_dim], scaled by scale * log2(e)
  const uint16_t* qs_bf16 = nullptr;  // the same rows as bf16, unscaled (BFloat16Queries)
  // The VNNI tile: the rows of qs quantized to int8, their scales and code sums.
  const int8_t* q8_codes = nullptr;
  const float* q8_scale = nullptr;
  const int32_t* q8_sum = nullptr;
  void* out = nullptr;  // [num_q_heads][n][head_dim] in the activation dtype
  // Split partials, [num_kv_heads][n][group][splits] rows of {m, l, acc[head_dim]}.
  float* partial = nullptr;
};

// The rows of qs quantized to int8, for the tile that multiplies int8 q by int8 K
// (Avx512VnniAttendTile): each row as kernels/kv_quant.h quantizes a token's head, its
// scale and the sum of its codes.
struct QueryCodes {
  std::vector<int8_t> codes;  // [rows][head_dim]
  std::vector<float> scale;   // [rows]
  std::vector<int32_t> sum;   // [rows]

  // Rows [r0, r1) of qs ([rows][dim]).
  void Quantize(const float* qs, int dim, size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const float* x = qs + r * dim;
      int8_t* q = codes.data() + r * dim;
      scale[r] = Int8Scale(x, dim);
      QuantizeInt8(x, dim, scale[r], q);
      int32_t s = 0;
      for (int d = 0; d < dim; ++d) s += q[d];
      sum[r] = s;
    }
  }
  void Resize(size_t rows, int dim) {
    codes.resize(rows * size_t(dim));
    scale.resize(rows);
    sum.resize(rows);
  }
  // Points call at the rows from element `at` of qs on.
  void Point(size_t at, int dim, Call* call) const {
    call->q8_codes = codes.data() + at;
    call->q8_scale = scale.data() + at / size_t(dim);
    call->q8_sum = sum.data() + at / size_t(dim);
  }
};

// Whether the tile multiplies bf16 q (Call::qs_bf16): bf16 activations keep their rows
// for it, and the fp8 tile on AVX512_BF16 takes f16 / f32 ones rounded to bf16.
bool BFloat16Queries(DType dtype, AttendTileFn tile_fn) {
  return dtype == DType::kBFloat16 || tile_fn == &cpu_internal::Avx512Bf16Fp8AttendTile;
}

int64_t FirstVisible(const PagedKvView& view, const AttentionParams& p, int64_t pos) {
  const int64_t lo = p.window > 0 ? pos - p.window + 1 : 0;
  return std::max(view.first_pos(), lo);
}

Plan MakePlan(const PagedKvView& view, const AttentionParams& p, int threads) {
  Plan plan;
  const int num_kv_heads = view.layout.num_kv_heads;
  plan.group = p.num_q_heads / num_kv_heads;
  plan.block = std::min<int64_t>(p.n, std::max(1, kMaxRowsPerUnit / plan.group));
  plan.q_blocks = CeilDiv(p.n, plan.block);
  const int64_t rows_per_head = plan.block * plan.group;
  plan.heads_per_unit = int(std::clamp<int64_t>(kMaxRowsPerUnit / rows_per_head, 1, num_kv_heads));
  plan.head_chunks = int(CeilDiv(num_kv_heads, plan.heads_per_unit));
  if (threads <= 1) return plan;

  const int64_t target = int64_t(threads) * kUnitsPerThread;
  const int64_t last_pos = p.q_pos + p.n - 1;
  const int64_t first_pos_of_last_block = p.q_pos + (plan.q_blocks - 1) * plan.block;
  const int64_t span = last_pos - FirstVisible(view, p, first_pos_of_last_block) + 1;
  const int64_t base = plan.q_blocks * plan.head_chunks;
  if (base < target) {
    plan.splits =
        std::clamp<int64_t>(CeilDiv(target, base), 1, std::max<int64_t>(1, span / kMinSplitTokens));
  }
  // Split the heads of a unit only when there are still fewer units than threads (a unit
  // with every head reads whole token rows, in address order) and the key range is long
  // enough to be worth a split: shorter, waking a worker costs more than the unit's work.
  if (plan.num_units() < threads && plan.head_chunks < num_kv_heads && span >= kMinSplitTokens) {
    const int64_t want = CeilDiv(threads, plan.q_blocks * plan.splits);
    plan.heads_per_unit = int(CeilDiv(num_kv_heads, std::min<int64_t>(want, num_kv_heads)));
    plan.head_chunks = int(CeilDiv(num_kv_heads, plan.heads_per_unit));
  }
  return plan;
}

// Fills ptrs[j] = K of position pos + j (head 0) and V likewise, for j < count.
void TokenPointers(const PagedKvView& view, int64_t pos, int count, const uint8_t** k,
                   const uint8_t** v) {
  const PageLayout& layout = view.layout;
  const size_t token_bytes = layout.TokenBytes();
  const size_t v_offset = size_t(layout.page_size) * token_bytes;
  for (int j = 0; j < count;) {
    const uint8_t* base = view.TokenPtr(0, pos + j);
    const int64_t in_page = layout.page_size - (pos + j) % layout.page_size;
    for (int64_t s = 0; s < in_page && j < count; ++s, ++j) {
      k[j] = base + s * token_bytes;
      v[j] = k[j] + v_offset;
    }
  }
}

// Returns early, writing nothing, once p.stop says stop.
void RunUnit(const Call& call, int64_t unit) {
  const PagedKvView& view = *call.view;
  const AttentionParams& p = *call.params;
  const Plan& plan = call.plan;
  const int dim = view.layout.head_dim;
  const int64_t split = unit % plan.splits;
  const int head_chunk = int(unit / plan.splits % plan.head_chunks);
  const int64_t q_block = unit / plan.splits / plan.head_chunks;

  const int64_t i0 = q_block * plan.block;
  const int64_t nq = std::min(plan.block, p.n - i0);
  const int rows = int(nq * plan.group);  // per kv head, row = i * group + g
  const int h0 = head_chunk * plan.heads_per_unit;
  const int h1 = std::min(view.layout.num_kv_heads, h0 + plan.heads_per_unit);

  std::vector<int64_t> row_lo(rows), row_hi(rows);
  for (int r = 0; r < rows; ++r) {
    const int64_t pos = p.q_pos + i0 + r / plan.group;
    row_lo[r] = FirstVisible(view, p, pos);
    row_hi[r] = pos;
  }
  // This split's share of the block's key range, cut at tile-aligned positions.
  const int64_t lo = row_lo[0], end = p.q_pos + i0 + nq;
  const int64_t aligned = lo / kTileTokens * kTileTokens;
  const int64_t chunk = CeilDiv(CeilDiv(end - aligned, plan.splits), kTileTokens) * kTileTokens;
  const int64_t s_lo = std::max(lo, aligned + split * chunk);
  const int64_t s_end = std::min(end, aligned + (split + 1) * chunk);

  const size_t state_rows = size_t(h1 - h0) * rows;
  std::vector<float> m(state_rows, kNegInf), l(state_rows, 0.0f), acc(state_rows * dim, 0.0f);
  std::vector<float> scratch(size_t(rows) * (kTileTokens + 1));
  const uint8_t* k_ptr[kTileTokens];
  const uint8_t* v_ptr[kTileTokens];
  const uint8_t* next_k[kTileTokens];  // the tile after this one, for prefetching
  const uint8_t* next_v[kTileTokens];
  AttendTileArgs args;
  args.kv_format = view.layout.format();
  args.head_dim = dim;
  args.rows = rows;
  args.row_lo = row_lo.data();
  args.row_hi = row_hi.data();
  args.k = k_ptr;
  args.v = v_ptr;
  args.next_k = next_k;
  args.next_v = next_v;
  args.scratch = scratch.data();
  const size_t head_bytes = size_t(dim) * view.layout.ElemBytes();
  const KvFormatInfo& format = *FindKvFormat(view.layout.format());
  const size_t scale_bytes = format.scales == KvScales::kPerToken ? format.scale_bytes : 0;
  auto tile_end = [&](int64_t t0) {
    return std::min(s_end, t0 / kTileTokens * kTileTokens + kTileTokens);
  };
  if (s_lo < s_end) TokenPointers(view, s_lo, int(tile_end(s_lo) - s_lo), next_k, next_v);
  int tiles = 0;
  for (int64_t t0 = s_lo; t0 < s_end;) {
    if (p.stop != nullptr && ++tiles % kTilesPerPoll == 0 && p.stop->Poll()) return;
    const int64_t t1 = tile_end(t0);
    args.pos0 = t0;
    args.tokens = int(t1 - t0);
    std::copy(next_k, next_k + args.tokens, k_ptr);
    std::copy(next_v, next_v + args.tokens, v_ptr);
    const int next_tokens = t1 < s_end ? int(tile_end(t1) - t1) : 0;
    if (next_tokens > 0) TokenPointers(view, t1, next_tokens, next_k, next_v);
    args.next_tokens = next_tokens;
    for (int h = h0; h < h1; ++h) {
      const size_t off = size_t(h) * head_bytes;
      const size_t s = size_t(h - h0) * rows;
      const size_t q_at = (size_t(h) * p.n + i0) * plan.group * dim;
      args.q = call.qs + q_at;
      args.q_bf16 = call.qs_bf16 != nullptr ? call.qs_bf16 + q_at : nullptr;
      args.q_scale = p.scale * std::numbers::log2e_v<float> * TileStaticScale(view, 0, h);
      if (call.q8_codes != nullptr) {
        args.q_i8 = call.q8_codes + q_at;
        args.q_i8_scale = call.q8_scale + q_at / size_t(dim);
        args.q_i8_sum = call.q8_sum + q_at / size_t(dim);
      }
      args.head_offset = off;
      args.scale_offset = scale_bytes > 0 ? view.layout.ValueBytes() + size_t(h) * scale_bytes : 0;
      args.m = m.data() + s;
      args.l = l.data() + s;
      args.acc = acc.data() + s * dim;
      call.tile_fn(args);
    }
    t0 = t1;
  }

  for (int h = h0; h < h1; ++h) {
    const float v_scale = TileStaticScale(view, 1, h);  // V's, outside the sum
    for (int r = 0; r < rows; ++r) {
      const size_t s = size_t(h - h0) * rows + r;
      const int64_t i = i0 + r / plan.group;
      const int g = r % plan.group;
      float* a = acc.data() + s * dim;
      if (v_scale != 1.0f) {
        for (int d = 0; d < dim; ++d) a[d] *= v_scale;
      }
      if (plan.splits > 1) {
        float* part =
            call.partial +
            ((((size_t(h) * p.n + i) * plan.group + g) * plan.splits + split) * (dim + 2));
        part[0] = m[s];
        part[1] = l[s];
        std::copy(a, a + dim, part + 2);
        continue;
      }
      const float inv = l[s] > 0 ? 1.0f / l[s] : 0.0f;
      for (int d = 0; d < dim; ++d) a[d] *= inv;
      const size_t out_row = (size_t(h) * plan.group + g) * p.n + i;
      call.rows.store(
          view.layout.dtype, a, dim,
          static_cast<uint8_t*>(call.out) + out_row * dim * view.layout.ActivationBytes());
    }
  }
}

// Combines the splits of every row into the output.
void MergeSplits(const Call& call) {
  const PagedKvView& view = *call.view;
  const AttentionParams& p = *call.params;
  const Plan& plan = call.plan;
  const int dim = view.layout.head_dim;
  std::vector<float> o(dim);
  const int64_t rows = int64_t(view.layout.num_kv_heads) * p.n * plan.group;
  for (int64_t row = 0; row < rows; ++row) {  // row = (h * n + i) * group + g
    const float* parts = call.partial + size_t(row) * plan.splits * (dim + 2);
    float m = kNegInf;
    for (int64_t s = 0; s < plan.splits; ++s) m = std::max(m, parts[s * (dim + 2)]);
    std::fill(o.begin(), o.end(), 0.0f);
    float l = 0;
    if (m != kNegInf) {
      for (int64_t s = 0; s < plan.splits; ++s) {
        const float* part = parts + s * (dim + 2);
        if (part[0] == kNegInf) continue;
        const float w = std::exp2(part[0] - m);
        l += w * part[1];
        for (int d = 0; d < dim; ++d) o[d] += w * part[2 + d];
      }
    }
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int d = 0; d < dim; ++d) o[d] *= inv;
    const int64_t g = row % plan.group, i = row / plan.group % p.n, h = row / plan.group / p.n;
    const size_t out_row = (size_t(h) * plan.group + g) * p.n + i;
    call.rows.store(
        view.layout.dtype, o.data(), dim,
        static_cast<uint8_t*>(call.out) + out_row * dim * view.layout.ActivationBytes());
  }
}

// qs[h][i][g][:] = q[h * group + g][i][:] * scale * log2(e) * K's TileStaticScale of head
// h, for kv heads [h0, h1); qs_bf16 (same layout), if wanted, gets the rows unscaled as
// bf16: bf16 ones as stored, others rounded to nearest even.
void ScaleQueries(const PagedKvView& view, const AttentionParams& p, int group, const void* q,
                  int h0, int h1, cpu_internal::LoadRowFn load, float* qs, uint16_t* qs_bf16) {
  const int dim = view.layout.head_dim;
  const float factor = p.scale * std::numbers::log2e_v<float>;
  const size_t elem = view.layout.ActivationBytes();
  for (int h = h0; h < h1; ++h) {
    const float head_factor = factor * TileStaticScale(view, 0, h);
    for (int64_t i = 0; i < p.n; ++i) {
      for (int g = 0; g < group; ++g) {
        const size_t src_row = (size_t(h) * group + g) * p.n + i;
        const size_t dst_row = (size_t(h) * p.n + i) * group + g;
        const uint8_t* src = static_cast<const uint8_t*>(q) + src_row * dim * elem;
        float* dst = qs + dst_row * dim;
        load(view.layout.dtype, src, dim, dst);
        if (qs_bf16 != nullptr && view.layout.dtype == DType::kBFloat16) {
          std::memcpy(qs_bf16 + dst_row * dim, src, dim * elem);
        } else if (qs_bf16 != nullptr) {
          for (int d = 0; d < dim; ++d)
            qs_bf16[dst_row * dim + d] = cpu_internal::FloatToBFloat16(dst[d]);
        }
        for (int d = 0; d < dim; ++d) dst[d] *= head_factor;
      }
    }
  }
}

// Runs the calls' units (call c owns units [first[c], first[c + 1])) on the pool, then
// merges the splits of every call that has them. Returns false, merging nothing, when the
// calls' stop token (they share one) stopped them.
bool RunCalls(const std::vector<Call>& calls, ThreadPool* pool) {
  std::vector<int64_t> first(calls.size() + 1, 0);
  for (size_t c = 0; c < calls.size(); ++c) first[c + 1] = first[c] + calls[c].plan.num_units();
  const StopToken* stop = calls.front().params->stop;
  auto run = [&](int64_t u) {
    if (stop != nullptr && stop->Poll()) return;
    const size_t c = size_t(std::upper_bound(first.begin(), first.end(), u) - first.begin()) - 1;
    RunUnit(calls[c], u - first[c]);
  };
  if (pool != nullptr && first.back() > 1) {
    pool->ParallelFor(first.back(), run);
  } else {
    for (int64_t u = 0; u < first.back(); ++u) run(u);
  }
  if (stop != nullptr && stop->stopped()) return false;
  std::vector<size_t> split;
  for (size_t c = 0; c < calls.size(); ++c) {
    if (calls[c].plan.splits > 1) split.push_back(c);
  }
  if (pool != nullptr && split.size() > 1) {
    pool->ParallelFor(int64_t(split.size()),
                      [&](int64_t i) { MergeSplits(calls[split[size_t(i)]]); });
  } else {
    for (size_t c : split) MergeSplits(calls[c]);
  }
  return true;
}

}  // namespace

bool PagedAttentionBatch(const PagedKvView* views, const int64_t* q_pos, int batch,
                         const AttentionParams& params, const void* q, void* out,
                         ThreadPool* pool) {
  if (params.n <= 0 || batch <= 0) return true;
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  // Each sequence plans for its share of the threads: a batch at least as large as the
  // pool runs one unit per sequence (every kv head, the whole key range) with no merge.
  const int threads_per_seq = int(CeilDiv(threads, batch));
  const PageLayout& layout = views[0].layout;
  const int dim = layout.head_dim;
  const size_t q_bytes = size_t(params.num_q_heads) * params.n * dim * layout.ActivationBytes();
  std::vector<AttentionParams> seq_params(size_t(batch), params);
  std::vector<Call> calls(static_cast<size_t>(batch));
  const int group = params.num_q_heads / layout.num_kv_heads;
  const size_t qs_per_seq = size_t(layout.num_kv_heads) * params.n * group * dim;
  std::vector<float> qs(qs_per_seq * size_t(batch));
  const AttendTileFn tile_fn = cpu_internal::SelectAttendTile(dim, layout.dtype, layout.format());
  std::vector<uint16_t> qs_bf16(BFloat16Queries(layout.dtype, tile_fn) ? qs.size() : 0);
  QueryCodes q8;
  if (tile_fn == &cpu_internal::Avx512VnniAttendTile) q8.Resize(qs.size() / dim, dim);
  std::vector<size_t> partial_at(size_t(batch) + 1, 0);
  for (int b = 0; b < batch; ++b) {
    seq_params[b].q_pos = q_pos[b];
    Call& call = calls[size_t(b)];
    call.view = &views[b];
    call.params = &seq_params[b];
    call.plan = MakePlan(views[b], seq_params[b], threads_per_seq);
    call.tile_fn = tile_fn;
    call.rows = cpu_internal::SelectRowConvert(layout.dtype);
    call.out = static_cast<uint8_t*>(out) + size_t(b) * q_bytes;
    call.qs = qs.data() + size_t(b) * qs_per_seq;
    if (!qs_bf16.empty()) call.qs_bf16 = qs_bf16.data() + size_t(b) * qs_per_seq;
    if (!q8.codes.empty()) q8.Point(size_t(b) * qs_per_seq, dim, &call);
    const int64_t splits = call.plan.splits;
    partial_at[b + 1] = partial_at[b] + (splits > 1 ? qs_per_seq / dim * splits * (dim + 2) : 0);
  }
  auto scale = [&](int64_t b) {
    ScaleQueries(views[b], seq_params[b], group,
                 static_cast<const uint8_t*>(q) + size_t(b) * q_bytes, 0, layout.num_kv_heads,
                 calls[size_t(b)].rows.load, qs.data() + size_t(b) * qs_per_seq,
                 qs_bf16.empty() ? nullptr : qs_bf16.data() + size_t(b) * qs_per_seq);
    const size_t rows = qs_per_seq / size_t(dim);
    if (!q8.codes.empty()) q8.Quantize(qs.data(), dim, size_t(b) * rows, size_t(b + 1) * rows);
  };
  if (pool != nullptr && qs.size() >= (size_t(1) << 16)) {
    pool->ParallelFor(batch, scale);
  } else {
    for (int b = 0; b < batch; ++b) scale(b);
  }
  std::vector<float> partial(partial_at.back());
  for (int b = 0; b < batch; ++b) {
    if (calls[b].plan.splits > 1) calls[b].partial = partial.data() + partial_at[b];
  }
  return RunCalls(calls, pool);
}

bool PagedAttention(const PagedKvView& view, const AttentionParams& params, const void* q,
                    void* out, ThreadPool* pool) {
  if (params.n <= 0) return true;
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  const int num_kv_heads = view.layout.num_kv_heads;
  const int dim = view.layout.head_dim;
  Call call;
  call.view = &view;
  call.params = &params;
  call.plan = MakePlan(view, params, threads);
  call.tile_fn = cpu_internal::SelectAttendTile(dim, view.layout.dtype, view.layout.format());
  call.rows = cpu_internal::SelectRowConvert(view.layout.dtype);
  call.out = out;

  const int group = call.plan.group;
  std::vector<float> qs(size_t(num_kv_heads) * params.n * group * dim);
  std::vector<uint16_t> qs_bf16(BFloat16Queries(view.layout.dtype, call.tile_fn) ? qs.size() : 0);
  uint16_t* raw = qs_bf16.empty() ? nullptr : qs_bf16.data();
  const bool big_q = qs.size() >= (size_t(1) << 16);
  if (pool != nullptr && big_q) {
    pool->ParallelFor(num_kv_heads, [&](int64_t h) {
      ScaleQueries(view, params, group, q, int(h), int(h) + 1, call.rows.load, qs.data(), raw);
    });
  } else {
    ScaleQueries(view, params, group, q, 0, num_kv_heads, call.rows.load, qs.data(), raw);
  }
  call.qs = qs.data();
  call.qs_bf16 = raw;
  QueryCodes q8;
  if (call.tile_fn == &cpu_internal::Avx512VnniAttendTile) {
    q8.Resize(qs.size() / dim, dim);
    q8.Quantize(qs.data(), dim, 0, qs.size() / dim);
    q8.Point(0, dim, &call);
  }

  std::vector<float> partial;
  if (call.plan.splits > 1) {
    partial.resize(qs.size() / dim * call.plan.splits * (dim + 2));
    call.partial = partial.data();
  }
  return RunCalls({call}, pool);
}

}  // namespace kvarena
