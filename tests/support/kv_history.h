// Test support shared by the worker binaries, the multi-process tests and the client tests:
// host tensors in the API layout and a worker's own copy of the K/V it sent, with the
// float64 attention reference (attention_reference.h) over it.
//
// Values are kept as doubles already rounded to the storage dtype, next to the bytes sent,
// so the reference sees exactly what the arena stores. Not thread-safe per object.
#ifndef KVARENA_TESTS_SUPPORT_KV_HISTORY_H_
#define KVARENA_TESTS_SUPPORT_KV_HISTORY_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/types.h"
#include "tests/support/dtype_codec.h"

namespace kvarena::testing {

// A tensor [1, heads, tokens, head_dim] that owns its bytes.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<double> values;  // head-major, rounded to dtype
  std::string bytes;           // what the arena receives

  TensorArg arg() const;
};

// Uniform values in [-1, 1], rounded to dtype.
HostTensor RandomTensor(std::mt19937_64& rng, DType dtype, int heads, int64_t tokens, int head_dim);

// One layer's K/V history as sent: token-major [tokens][kv_heads][head_dim].
class KvHistory {
 public:
  KvHistory(int kv_heads, int head_dim) : kv_heads_(kv_heads), head_dim_(head_dim) {}

  int64_t len() const { return int64_t(k_.size()) / (int64_t(kv_heads_) * head_dim_); }
  void Append(const HostTensor& k, const HostTensor& v);  // [1, kv_heads, n, head_dim]
  void Truncate(int64_t len);
  // Tokens [first, len()) as [1, kv_heads, n, head_dim] values: kv 0 = K, 1 = V.
  std::vector<double> HeadMajor(int kv, int64_t first) const;

  // Attention of q ([1, q_heads, n, head_dim], queries at absolute q_pos..q_pos+n-1)
  // over this history, causal, keys in (p - window, p] when window > 0. scale 0 means
  // 1/sqrt(head_dim). Returns [1, q_heads, n, head_dim].
  std::vector<double> Attention(const HostTensor& q, int64_t q_pos, double scale,
                                int64_t window) const;

 private:
  int kv_heads_;
  int head_dim_;
  std::vector<double> k_, v_;
};

// Absolute and relative tolerance of an attention output stored in dtype.
double Tolerance(DType dtype);
// OK when every element of out is within tolerance of ref; else names the first miss.
absl::Status CompareOutput(const std::string& what, const TensorOut& out,
                           const std::vector<double>& ref);
// OK when got (decoded from dtype bytes) equals want exactly.
absl::Status CompareExact(const std::string& what, const TensorOut& got,
                          const std::vector<double>& want);

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_KV_HISTORY_H_
