#include "tests/support/kv_history.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tests/support/attention_reference.h"

namespace kvarena::testing {

TensorArg HostTensor::arg() const {
  TensorArg a;
  a.dtype = dtype;
  a.shape = shape;
  a.data = bytes.data();
  a.bytes = bytes.size();
  return a;
}

HostTensor RandomTensor(std::mt19937_64& rng, DType dtype, int heads, int64_t tokens,
                        int head_dim) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  HostTensor t;
  t.dtype = dtype;
  t.shape = {1, heads, tokens, head_dim};
  t.values.resize(size_t(heads) * tokens * head_dim);
  for (double& x : t.values) x = RoundTo(dist(rng), dtype);
  t.bytes = EncodeValues(t.values, dtype);
  return t;
}

void KvHistory::Append(const HostTensor& k, const HostTensor& v) {
  const int64_t n = k.shape[2];
  const size_t row = size_t(kv_heads_) * head_dim_;
  const size_t old = k_.size();
  k_.resize(old + n * row);
  v_.resize(old + n * row);
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < kv_heads_; ++h) {
      for (int d = 0; d < head_dim_; ++d) {
        const size_t src = (size_t(h) * n + t) * head_dim_ + d;
        const size_t dst = old + t * row + size_t(h) * head_dim_ + d;
        k_[dst] = k.values[src];
        v_[dst] = v.values[src];
      }
    }
  }
}

void KvHistory::Truncate(int64_t len) {
  const size_t keep = size_t(len) * kv_heads_ * head_dim_;
  if (keep < k_.size()) {
    k_.resize(keep);
    v_.resize(keep);
  }
}

std::vector<double> KvHistory::HeadMajor(int kv, int64_t first) const {
  const std::vector<double>& src = kv == 0 ? k_ : v_;
  const int64_t n = std::max<int64_t>(0, len() - first);
  std::vector<double> out(size_t(kv_heads_) * n * head_dim_);
  for (int h = 0; h < kv_heads_; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      for (int d = 0; d < head_dim_; ++d) {
        out[(size_t(h) * n + t) * head_dim_ + d] =
            src[(size_t(first + t) * kv_heads_ + h) * head_dim_ + d];
      }
    }
  }
  return out;
}

std::vector<double> KvHistory::Attention(const HostTensor& q, int64_t q_pos, double scale,
                                         int64_t window) const {
  const int q_heads = int(q.shape[1]);
  const int64_t n = q.shape[2];
  if (scale == 0) scale = 1.0 / std::sqrt(double(head_dim_));
  const ReferenceKv kv{k_.data(), v_.data(), 0, len(), kv_heads_, head_dim_};
  return ReferenceAttention(kv, q.values.data(), q_heads, n, q_pos, scale, window);
}

double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 3e-3;
    case DType::kBFloat16:
      return 2e-2;
    default:
      return 2e-4;
  }
}

absl::Status CompareOutput(const std::string& what, const TensorOut& out,
                           const std::vector<double>& ref) {
  const std::vector<double> got = DecodeValues(out.data, out.dtype);
  if (got.size() != ref.size()) {
    return absl::InternalError(
        absl::StrCat(what, ": output has ", got.size(), " elements, reference ", ref.size()));
  }
  const double tol = Tolerance(out.dtype);
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - ref[i]);
    if (!(err <= tol + tol * std::abs(ref[i]))) {  // also catches NaN
      return absl::InternalError(absl::StrCat(what, ": element ", i, " = ", got[i], ", reference ",
                                              ref[i], " (|err| ", err, " > tol ", tol, ", ",
                                              DTypeName(out.dtype), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CompareExact(const std::string& what, const TensorOut& got_t,
                          const std::vector<double>& want) {
  const std::vector<double> got = DecodeValues(got_t.data, got_t.dtype);
  if (got.size() != want.size()) {
    return absl::InternalError(
        absl::StrCat(what, ": has ", got.size(), " elements, want ", want.size()));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return absl::InternalError(
          absl::StrCat(what, ": element ", i, " = ", got[i], ", want ", want[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvarena::testing
