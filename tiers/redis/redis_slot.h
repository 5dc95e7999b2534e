// Redis Cluster key slots: CRC16 (the XMODEM variant the Redis Cluster specification names:
// polynomial 0x1021, initial value 0, no reflection) of the key, or of its hash tag, modulo
// 16384. A hash tag is the text between the first '{' and the first '}' after it, when
// that text is not empty: "kva:{abc}" and "x{abc}y" share a slot.
//
// Pure functions; thread-safe.
#ifndef KVARENA_TIERS_REDIS_REDIS_SLOT_H_
#define KVARENA_TIERS_REDIS_REDIS_SLOT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvarena {

inline constexpr int kRedisSlots = 16384;

// CRC16/XMODEM of data ("123456789" gives 0x31C3).
uint16_t RedisCrc16(absl::string_view data);
// The slot of key, in [0, kRedisSlots).
int RedisKeySlot(absl::string_view key);

// A node address "host:port" ("[v6]:port" for IPv6 literals).
struct RedisAddress {
  std::string host;
  int port = 0;
  std::string ToString() const;
};
// Parses "host:port"; INVALID_ARGUMENT naming `field` and the text when it is not one.
absl::StatusOr<RedisAddress> ParseRedisAddress(absl::string_view text, absl::string_view field);

}  // namespace kvarena

#endif  // KVARENA_TIERS_REDIS_REDIS_SLOT_H_
