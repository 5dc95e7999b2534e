// Test-only: batches of paged caches on the host, the sweeps the CUDA kernels are checked
// over, and the CPU kernels' answers to compare with. Shared by the GPU test
// (kv_kernels_cuda_test.cc) and the emulator test (emulator_test.cc).
#ifndef KVARENA_KERNELS_CUDA_TEST_PROBLEMS_H_
#define KVARENA_KERNELS_CUDA_TEST_PROBLEMS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/kv_kernels.h"
#include "kernels/cuda/kv_kernels_cuda.h"
#include "kernels/paged_kv.h"
#include "tests/support/test_paged_layer.h"

namespace kvarena::gpu::testing {

using kvarena::testing::DecodeAll;
using kvarena::testing::RandomStored;

// One sequence of a problem: positions [first_block * page_size, len) are readable, and
// its queries (or appended tokens) start at pos.
struct SeqSpec {
  int64_t first_block = 0;
  int64_t pos = 0;
  int64_t len = 0;
};

struct Problem {
  PageLayout layout;
  int group = 1;
  int64_t n = 1;  // queries (attention) or new tokens (append) per sequence
  int64_t window = 0;
  float scale_factor = 1;  // scale = scale_factor / sqrt(head_dim)
  std::vector<SeqSpec> seqs;

  int num_q_heads() const { return layout.num_kv_heads * group; }
  float scale() const { return scale_factor / std::sqrt(float(layout.head_dim)); }
  std::string Describe() const {
    std::ostringstream s;
    s << DTypeName(layout.dtype) << " head_dim=" << layout.head_dim
      << " page_size=" << layout.page_size << " kv_heads=" << layout.num_kv_heads
      << " group=" << group << " window=" << window << " n=" << n
      << " scale_factor=" << scale_factor << " seqs=[";
    for (const SeqSpec& q : seqs)
      s << " {first_block=" << q.first_block << " pos=" << q.pos << " len=" << q.len << "}";
    s << " ]";
    return s.str();
  }
};

// Every sequence's pages in one pool, page ids shuffled; block tables packed back to back.
// Pool bytes nobody wrote are 0xFF (NaN in every dtype).
class HostBatch {
 public:
  HostBatch(const Problem& pb, std::mt19937_64& rng) : layout_(pb.layout) {
    const int ps = layout_.page_size;
    int64_t total = 0;
    for (const SeqSpec& s : pb.seqs) {
      const int64_t blocks = (std::max(s.len, s.pos + pb.n) + ps - 1) / ps - s.first_block;
      descs_.push_back(PagedSeqDesc{total, s.first_block, s.pos});
      num_blocks_.push_back(blocks);
      lens_.push_back(s.len);
      total += blocks;
    }
    const int64_t pool_pages = total + 2 + int64_t(rng() % 5);
    pool_.assign(size_t(pool_pages) * layout_.PageBytes(), 0xFF);
    std::vector<int32_t> ids(static_cast<size_t>(pool_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables_.assign(ids.begin(), ids.begin() + total);
  }

  // Random K/V in [-1, 1) at every readable position [first_pos, len) of every sequence
  // (xorshift: the benchmark-sized tests fill hundreds of millions of values).
  void FillRandom(std::mt19937_64& rng) {
    const size_t elems = size_t(layout_.num_kv_heads) * layout_.head_dim;
    uint64_t x = rng() | 1;
    for (int b = 0; b < batch(); ++b) {
      const PagedKvView v = View(b);
      for (int64_t t = v.first_pos(); t < v.len; ++t) {
        for (int kv = 0; kv < 2; ++kv) {
          uint8_t* p = v.TokenPtr(kv, t);
          for (size_t i = 0; i < elems; ++i) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const float f = float(x >> 40) * 0x1p-23f - 1.0f;
            if (layout_.dtype == DType::kFloat32) {
              std::memcpy(p + 4 * i, &f, 4);
            } else if (layout_.dtype == DType::kBFloat16) {
              uint32_t u;
              std::memcpy(&u, &f, 4);
              const uint16_t h = uint16_t(u >> 16);
              std::memcpy(p + 2 * i, &h, 2);
            } else {
              const _Float16 h = static_cast<_Float16>(f);
              std::memcpy(p + 2 * i, &h, 2);
            }
          }
        }
      }
    }
  }

  int batch() const { return int(descs_.size()); }
  // Sequence b as a host view over pool() and tables().
  PagedKvView View(int b) {
    PagedKvView v;
    v.layout = layout_;
    v.pool_base = pool_.data();
    v.block_table = tables_.data() + descs_[b].table_offset;
    v.first_block = descs_[b].first_block;
    v.num_blocks = num_blocks_[b];
    v.len = lens_[b];
    if (!k_scales_.empty()) v.k_scales = k_scales_.data();
    if (!v_scales_.empty()) v.v_scales = v_scales_.data();
    return v;
  }
  // fp8: the layer's static scales, [num_kv_heads] each, that View() hands out.
  void SetStaticScales(std::vector<float> k, std::vector<float> v) {
    k_scales_ = std::move(k);
    v_scales_ = std::move(v);
  }
  const std::vector<float>& k_scales() const { return k_scales_; }
  const std::vector<float>& v_scales() const { return v_scales_; }
  std::vector<uint8_t>& pool() { return pool_; }
  const std::vector<int32_t>& tables() const { return tables_; }
  const std::vector<PagedSeqDesc>& descs() const { return descs_; }

 private:
  PageLayout layout_;
  std::vector<uint8_t> pool_;
  std::vector<int32_t> tables_;
  std::vector<PagedSeqDesc> descs_;
  std::vector<int64_t> num_blocks_;
  std::vector<int64_t> lens_;
  std::vector<float> k_scales_, v_scales_;
};

inline AttentionParams ParamsFor(const Problem& pb, int64_t q_pos) {
  AttentionParams p;
  p.num_q_heads = pb.num_q_heads();
  p.q_pos = q_pos;
  p.n = pb.n;
  p.scale = pb.scale();
  p.window = pb.window;
  return p;
}

// The CPU kernel's output for every sequence: [batch][num_q_heads][n][head_dim] stored.
inline std::vector<uint8_t> CpuAttention(const Problem& pb, HostBatch& hb,
                                         const std::vector<uint8_t>& q) {
  const size_t per_seq =
      size_t(pb.num_q_heads()) * pb.n * pb.layout.head_dim * pb.layout.ActivationBytes();
  std::vector<uint8_t> out(per_seq * hb.batch());
  for (int b = 0; b < hb.batch(); ++b) {
    ::kvarena::PagedAttention(hb.View(b), ParamsFor(pb, pb.seqs[b].pos), q.data() + b * per_seq,
                              out.data() + b * per_seq, nullptr);
  }
  return out;
}

// Compares decoded outputs: within one output ULP of the dtype (both sides round once)
// plus float32 accumulation error. Returns a description of the first few misfits.
inline std::string CompareOutputs(DType dtype, const std::vector<uint8_t>& got_bytes,
                                  const std::vector<uint8_t>& want_bytes, int head_dim) {
  const std::vector<double> got = DecodeAll(dtype, got_bytes), want = DecodeAll(dtype, want_bytes);
  const double rel = dtype == DType::kFloat16 ? 0x1p-10 : dtype == DType::kBFloat16 ? 0x1p-7 : 1e-6;
  std::ostringstream s;
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    const double tol = 2e-5 + rel * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {  // NaN fails too
      ++bad;
      s << "element " << i << " (row " << i / head_dim << ", dim " << i % head_dim << "): got "
        << got[i] << " want " << want[i] << "\n";
    }
  }
  return s.str();
}

// Random problems of the sweep: dtype x head_dim x page_size x group x window, decode
// (n = 1) and prefill (n > 1), one to three sequences of random lengths, sometimes with an
// evicted prefix. `long_context` adds contexts long enough to split.
inline std::vector<Problem> AttentionSweep(DType dtype, std::mt19937_64& rng, bool long_context) {
  auto rand = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
  std::vector<Problem> out;
  for (int head_dim : {64, 128, 256}) {
    for (int page_size : {1, 3, 16, 64}) {
      for (int group : {1, 4, 8, 12}) {
        for (int64_t window : {int64_t(0), int64_t(2), rand(5, 40)}) {
          for (bool prefill : {false, true}) {
            Problem pb;
            pb.layout = PageLayout{dtype, page_size, group == 12 ? 1 : 2, head_dim};
            pb.group = group;
            pb.window = window;
            pb.n = prefill ? rand(2, 11) : 1;
            pb.scale_factor = rand(0, 1) ? 4.0f : 1.0f;
            const int batch = int(rand(1, 3));
            for (int b = 0; b < batch; ++b) {
              SeqSpec s;
              s.pos = long_context ? rand(300, 900) : rand(0, 70);
              s.len = s.pos + pb.n + (rand(0, 3) == 0 ? rand(1, 4) : 0);
              if (s.pos >= page_size && rand(0, 1)) s.first_block = rand(1, s.pos / page_size);
              pb.seqs.push_back(s);
            }
            out.push_back(pb);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace kvarena::gpu::testing

#endif  // KVARENA_KERNELS_CUDA_TEST_PROBLEMS_H_
