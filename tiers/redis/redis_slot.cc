#include "tiers/redis/redis_slot.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvarena {

uint16_t RedisCrc16(absl::string_view data) {
  uint16_t crc = 0;
  for (const char c : data) {
    crc ^= uint16_t(uint8_t(c)) << 8;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? uint16_t((crc << 1) ^ 0x1021) : uint16_t(crc << 1);
    }
  }
  return crc;
}

int RedisKeySlot(absl::string_view key) {
  const size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return RedisCrc16(key) % kRedisSlots;
}

std::string RedisAddress::ToString() const {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

absl::StatusOr<RedisAddress> ParseRedisAddress(absl::string_view text, absl::string_view field) {
  const size_t colon = text.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? "" : text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (host.empty() || !absl::SimpleAtoi(text.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, "=\"", text, "\": expected HOST:PORT with a port in [1, 65535]"));
  }
  return RedisAddress{std::string(host), port};
}

}  // namespace kvarena
