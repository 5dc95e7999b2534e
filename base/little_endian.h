// Little-endian encodings of fixed-width integers, for the byte formats core hashes and
// stores (the prefix hash's input, core/prefix_hash.h; the tier chunk, core/tier_chunk.h).
// Pure functions; thread-safe.
#ifndef KVARENA_BASE_LITTLE_ENDIAN_H_
#define KVARENA_BASE_LITTLE_ENDIAN_H_

#include <cstdint>
#include <string>

namespace kvarena {

inline void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(char((v >> (8 * i)) & 0xff));
}
inline void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(char((v >> (8 * i)) & 0xff));
}

// REQUIRES: p points at 4 (8) readable bytes.
inline uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(p[i])) << (8 * i);
  return v;
}
inline uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}

}  // namespace kvarena

#endif  // KVARENA_BASE_LITTLE_ENDIAN_H_
