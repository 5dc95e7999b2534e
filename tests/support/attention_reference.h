// The one float64 attention reference of the tests: causal softmax attention with grouped
// query heads (GQA) and sliding windows, over one layer's K/V rows. Every test layer
// (kernels, core, client, daemon RPCs, workers) checks its output against this; paged
// layers gather their rows first (test_paged_layer.h). Plain functions, no state.
#ifndef KVARENA_TESTS_SUPPORT_ATTENTION_REFERENCE_H_
#define KVARENA_TESTS_SUPPORT_ATTENTION_REFERENCE_H_

#include <cstdint>
#include <vector>

namespace kvarena::testing {

// One layer's keys and values, token-major: row t - first holds positions t's
// [kv_heads][head_dim] values, for t in [first, first + len).
struct ReferenceKv {
  const double* k = nullptr;
  const double* v = nullptr;
  int64_t first = 0;
  int64_t len = 0;
  int kv_heads = 0;
  int head_dim = 0;
};

// out [q_heads][n][head_dim] for q [q_heads][n][head_dim] whose row i sits at position
// p = q_pos + i: softmax over keys t in [max(first, p - window + 1), p] (window 0: from
// first) of scale * q . K[t], times V[t]; query head h reads kv head h / (q_heads /
// kv_heads). Float64 throughout.
std::vector<double> ReferenceAttention(const ReferenceKv& kv, const double* q, int q_heads,
                                       int64_t n, int64_t q_pos, double scale, int64_t window);

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_ATTENTION_REFERENCE_H_
