// Test support for DecodeBatch (kvarena/decode_batch.h), shared by the client tests, the
// multi-process tests and the worker binary: batched host tensors and one decode step
// checked sequence by sequence against the float64 reference (kv_history.h).
// Header-only; not thread-safe per object.
#ifndef KVARENA_TESTS_SUPPORT_BATCH_REFERENCE_H_
#define KVARENA_TESTS_SUPPORT_BATCH_REFERENCE_H_

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvarena/decode_batch.h"
#include "tests/support/kv_history.h"

namespace kvarena::testing {

// Per-sequence tensors [1, heads, n, head_dim] and their concatenation
// [batch, heads, n, head_dim], what DecodeBatch::Run takes.
struct BatchTensor {
  std::vector<HostTensor> rows;
  std::string bytes;

  static BatchTensor Random(std::mt19937_64& rng, DType dtype, int batch, int heads, int64_t n,
                            int head_dim) {
    BatchTensor t;
    for (int b = 0; b < batch; ++b) {
      t.rows.push_back(RandomTensor(rng, dtype, heads, n, head_dim));
      t.bytes += t.rows.back().bytes;
    }
    return t;
  }
  TensorArg arg() const {
    std::vector<int64_t> shape = rows[0].shape;
    shape[0] = int64_t(rows.size());
    return {rows[0].dtype, shape, bytes.data(), bytes.size()};
  }
};

// n random tokens on every layer of h through the local path (reserve, append_local,
// commit), recorded in history (one KvHistory per layer).
inline absl::Status PrefillLocal(GenericKvCacheHandle& h, std::vector<KvHistory>& history,
                                 int64_t n, std::mt19937_64& rng) {
  if (n == 0) return absl::OkStatus();
  if (absl::Status s = h.reserve(n); !s.ok()) return s;
  for (int layer = 0; layer < h.num_layers(); ++layer) {
    const HostTensor k = RandomTensor(rng, h.dtype(), h.num_kv_heads(), n, h.head_dim());
    const HostTensor v = RandomTensor(rng, h.dtype(), h.num_kv_heads(), n, h.head_dim());
    if (absl::Status s = h.append_local(layer, k.arg(), v.arg()); !s.ok()) return s;
    history[size_t(layer)].Append(k, v);
  }
  return h.commit(n);
}

// One step of `batch` over `caches` (in the batch's order) with fresh random q/k/v:
// Plan, Run on every layer into a poisoned output, Commit. Each sequence's output must
// match the float64 reference of its history (which gains the step's K/V) and
// position(b) must be its history's length. The first failure, naming sequence and layer.
inline absl::Status CheckedBatchStep(
    DecodeBatch& batch, const std::vector<std::shared_ptr<GenericKvCacheHandle>>& caches,
    std::vector<std::vector<KvHistory>>& history, std::mt19937_64& rng, int q_heads) {
  const GenericKvCacheHandle& h0 = *caches[0];
  const int n = int(batch.tokens_per_step()), size = batch.batch_size();
  if (absl::Status s = batch.Plan(); !s.ok()) return s;
  for (int layer = 0; layer < h0.num_layers(); ++layer) {
    const BatchTensor q = BatchTensor::Random(rng, h0.dtype(), size, q_heads, n, h0.head_dim());
    const BatchTensor k =
        BatchTensor::Random(rng, h0.dtype(), size, h0.num_kv_heads(), n, h0.head_dim());
    const BatchTensor v =
        BatchTensor::Random(rng, h0.dtype(), size, h0.num_kv_heads(), n, h0.head_dim());
    std::string out(q.bytes.size(), '\xff');  // NaN in every dtype
    if (absl::Status s = batch.Run(layer, q.arg(), k.arg(), v.arg(), {out.data(), out.size()});
        !s.ok()) {
      return s;
    }
    const size_t per_seq = out.size() / size_t(size);
    for (int b = 0; b < size; ++b) {
      KvHistory& hist = history[size_t(b)][size_t(layer)];
      const int64_t pos = hist.len();
      if (batch.position(b) != pos) {
        return absl::InternalError(absl::StrCat("sequence ", b, ": position ", batch.position(b),
                                                ", history holds ", pos));
      }
      hist.Append(k.rows[size_t(b)], v.rows[size_t(b)]);
      const TensorOut got{h0.dtype(), q.rows[size_t(b)].shape,
                          out.substr(size_t(b) * per_seq, per_seq)};
      const int window = caches[size_t(b)]->layer_windows()[size_t(layer)];
      if (absl::Status s = CompareOutput(absl::StrCat("sequence ", b, " layer ", layer), got,
                                         hist.Attention(q.rows[size_t(b)], pos, 0, window));
          !s.ok()) {
        return s;
      }
    }
  }
  return batch.Commit();
}

// What every cache holds (get_kv) equals its history, bit for bit.
inline absl::Status CheckBatchKv(const std::vector<std::shared_ptr<GenericKvCacheHandle>>& caches,
                                 const std::vector<std::vector<KvHistory>>& history) {
  for (size_t b = 0; b < caches.size(); ++b) {
    for (int layer = 0; layer < caches[b]->num_layers(); ++layer) {
      KVARENA_ASSIGN_OR_RETURN(auto kv, caches[b]->get_kv(layer));
      const KvHistory& h = history[b][size_t(layer)];
      const std::string what = absl::StrCat("cache ", b, " layer ", layer);
      if (absl::Status s = CompareExact(what + " K", kv.k, h.HeadMajor(0, kv.first_pos)); !s.ok())
        return s;
      if (absl::Status s = CompareExact(what + " V", kv.v, h.HeadMajor(1, kv.first_pos)); !s.ok())
        return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_BATCH_REFERENCE_H_
