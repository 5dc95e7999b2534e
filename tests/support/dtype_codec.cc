#include "tests/support/dtype_codec.h"

#include <cmath>
#include <cstring>

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

double Fp8E4M3Value(uint8_t code) {
  const int exponent = (code >> 3) & 0xF, mantissa = code & 7;
  const double sign = (code & 0x80) != 0 ? -1.0 : 1.0;
  if (exponent == 15 && mantissa == 7) return std::nan("");
  if (exponent == 0) return sign * mantissa / 8.0 * std::pow(2.0, -6);
  return sign * (1.0 + mantissa / 8.0) * std::pow(2.0, exponent - 7);
}

double RoundTo(double x, DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return HalfToFloat(FloatToHalf(float(x)));
    case DType::kBFloat16:
      return Bf16ToFloat(FloatToBf16(float(x)));
    default:
      return float(x);
  }
}

double DecodeStored(DType dtype, const void* p) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return dtype == DType::kFloat16 ? HalfToFloat(bits) : Bf16ToFloat(bits);
}

std::vector<double> DecodeValues(DType dtype, const void* data, size_t count) {
  const size_t elem = DTypeSize(dtype);
  std::vector<double> out(count);
  for (size_t i = 0; i < count; ++i) {
    out[i] = DecodeStored(dtype, static_cast<const char*>(data) + i * elem);
  }
  return out;
}

std::vector<double> DecodeValues(const std::string& bytes, DType dtype) {
  const size_t elem = DTypeSize(dtype);
  return DecodeValues(dtype, bytes.data(), elem ? bytes.size() / elem : 0);
}

std::vector<double> DecodeAll(DType dtype, const std::vector<uint8_t>& bytes) {
  return DecodeValues(dtype, bytes.data(), bytes.size() / DTypeSize(dtype));
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
      const uint16_t h =
          dtype == DType::kFloat16 ? FloatToHalf(float(values[i])) : FloatToBf16(float(values[i]));
      std::memcpy(dst, &h, 2);
    }
  }
  return out;
}

std::vector<uint8_t> RandomStored(DType dtype, size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<double> values(n);
  for (double& x : values) x = dist(rng);
  const std::string bytes = EncodeValues(values, dtype);
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

}  // namespace kvarena::testing
