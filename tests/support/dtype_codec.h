// The one dtype encoder/decoder of the tests: float32, float16 and bfloat16 to and from
// double, written from the formats' definitions (sign, exponent, mantissa), not with the
// kernels' converters, so that it can serve as their oracle. Round to nearest even on the
// way in; exact on the way out, subnormals, infinities and NaN included. Plain functions.
#ifndef KVARENA_TESTS_SUPPORT_DTYPE_CODEC_H_
#define KVARENA_TESTS_SUPPORT_DTYPE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvarena/paged_kv.h"

namespace kvarena::testing {

uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);

// The value of an OCP fp8 e4m3fn code, from the format's definition (bias 7, 3 mantissa
// bits, subnormals below 2^-6, S.1111.111 NaN, no infinities).
double Fp8E4M3Value(uint8_t code);

// x round-tripped through the storage type.
double RoundTo(double x, DType dtype);

// One stored element of dtype at p, decoded.
double DecodeStored(DType dtype, const void* p);
// count elements of dtype at data, decoded.
std::vector<double> DecodeValues(DType dtype, const void* data, size_t count);
// Every whole element of bytes, decoded.
std::vector<double> DecodeValues(const std::string& bytes, DType dtype);
std::vector<double> DecodeAll(DType dtype, const std::vector<uint8_t>& bytes);

// values stored as dtype (rounded to nearest even).
std::string EncodeValues(const std::vector<double>& values, DType dtype);

// n elements of dtype holding values drawn uniformly from [-1, 1] (one draw each), stored.
std::vector<uint8_t> RandomStored(DType dtype, size_t n, std::mt19937_64& rng);

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_DTYPE_CODEC_H_
