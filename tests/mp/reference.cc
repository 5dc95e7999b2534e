#include "tests/mp/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvarena::testing {

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t raw_exp = int32_t((x >> 23) & 0xff);
  uint32_t mant = x & 0x7fffff;
  if (raw_exp == 0xff) return uint16_t(sign | 0x7c00 | (mant ? 0x200 : 0));
  const int32_t exp = raw_exp - 127 + 15;
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {  // subnormal half: value = m * 2^-24
    if (exp < -10) return uint16_t(sign);
    mant |= 0x800000;
    const int shift = 14 - exp;
    uint32_t m = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (m & 1))) ++m;
    return uint16_t(sign | m);
  }
  uint32_t h = sign | (uint32_t(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry rounds into the exponent
  return uint16_t(h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    const float f = std::ldexp(float(mant), -24);
    return sign ? -f : f;
  }
  const uint32_t bits =
      exp == 31 ? (sign | 0x7f800000 | (mant << 13)) : (sign | ((exp + 112) << 23) | (mant << 13));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fff + ((x >> 16) & 1);  // round to nearest even
  return uint16_t(x >> 16);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t x = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

double RoundTo(double x, DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return HalfToFloat(FloatToHalf(float(x)));
    case DType::kBFloat16: return Bf16ToFloat(FloatToBf16(float(x)));
    default: return float(x);
  }
}

std::string EncodeValues(const std::vector<double>& values, DType dtype) {
  const size_t elem = DTypeSize(dtype);
  std::string out(values.size() * elem, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    char* dst = out.data() + i * elem;
    if (dtype == DType::kFloat32) {
      const float f = float(values[i]);
      std::memcpy(dst, &f, 4);
    } else {
      const uint16_t h = dtype == DType::kFloat16 ? FloatToHalf(float(values[i]))
                                                  : FloatToBf16(float(values[i]));
      std::memcpy(dst, &h, 2);
    }
  }
  return out;
}

std::vector<double> DecodeValues(const std::string& bytes, DType dtype) {
  const size_t elem = DTypeSize(dtype);
  std::vector<double> out(elem ? bytes.size() / elem : 0);
  for (size_t i = 0; i < out.size(); ++i) {
    const char* src = bytes.data() + i * elem;
    if (dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, src, 4);
      out[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, src, 2);
      out[i] = dtype == DType::kFloat16 ? HalfToFloat(h) : Bf16ToFloat(h);
    }
  }
  return out;
}

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
  const int group = q_heads / kv_heads_;
  if (scale == 0) scale = 1.0 / std::sqrt(double(head_dim_));
  std::vector<double> out(size_t(q_heads) * n * head_dim_, 0.0);
  std::vector<double> scores;
  for (int h = 0; h < q_heads; ++h) {
    const int kh = h / group;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = q_pos + i;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      const double* qv = &q.values[(size_t(h) * n + i) * head_dim_];
      scores.assign(size_t(p - lo + 1), 0.0);
      double max_score = -INFINITY;
      for (int64_t t = lo; t <= p; ++t) {
        const double* kv = &k_[(size_t(t) * kv_heads_ + kh) * head_dim_];
        double s = 0;
        for (int d = 0; d < head_dim_; ++d) s += qv[d] * kv[d];
        scores[t - lo] = s * scale;
        max_score = std::max(max_score, scores[t - lo]);
      }
      double denom = 0;
      for (double& s : scores) denom += (s = std::exp(s - max_score));
      double* o = &out[(size_t(h) * n + i) * head_dim_];
      for (int64_t t = lo; t <= p; ++t) {
        const double* vv = &v_[(size_t(t) * kv_heads_ + kh) * head_dim_];
        const double w = scores[t - lo] / denom;
        for (int d = 0; d < head_dim_; ++d) o[d] += w * vv[d];
      }
    }
  }
  return out;
}

double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return 3e-3;
    case DType::kBFloat16: return 2e-2;
    default: return 2e-4;
  }
}

absl::Status CompareOutput(const std::string& what, const TensorOut& out,
                           const std::vector<double>& ref) {
  const std::vector<double> got = DecodeValues(out.data, out.dtype);
  if (got.size() != ref.size()) {
    return absl::InternalError(absl::StrCat(what, ": output has ", got.size(),
                                            " elements, reference ", ref.size()));
  }
  const double tol = Tolerance(out.dtype);
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - ref[i]);
    if (!(err <= tol + tol * std::abs(ref[i]))) {  // also catches NaN
      return absl::InternalError(absl::StrCat(what, ": element ", i, " = ", got[i],
                                              ", reference ", ref[i], " (|err| ", err,
                                              " > tol ", tol, ", ", DTypeName(out.dtype), ")"));
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
