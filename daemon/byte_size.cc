#include "daemon/byte_size.h"

#include <array>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvarena {
namespace {

struct Unit {
  absl::string_view name;
  uint64_t factor;
};

// Longest names first so "Ki" wins over "K" when matching a suffix.
constexpr std::array<Unit, 10> kUnits = {{
    {"Ti", uint64_t{1} << 40},
    {"Gi", uint64_t{1} << 30},
    {"Mi", uint64_t{1} << 20},
    {"Ki", uint64_t{1} << 10},
    {"T", 1000'000'000'000},
    {"G", 1000'000'000},
    {"M", 1000'000},
    {"K", 1000},
    {"k", 1000},
    {"", 1},
}};

}  // namespace

bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  if (!s.empty() && s.back() == 'B') s.remove_suffix(1);  // "64KiB", "512B"
  for (const Unit& unit : kUnits) {
    if (!absl::ConsumeSuffix(&s, unit.name)) continue;
    uint64_t count = 0;
    if (s.empty() || !absl::SimpleAtoi(s, &count) || s.front() == '-' || s.front() == '+') {
      *error = absl::StrCat("'", text, "' is not a byte count (e.g. 1073741824, 512Mi, 4G)");
      return false;
    }
    if (count > std::numeric_limits<uint64_t>::max() / unit.factor) {
      *error = absl::StrCat("'", text, "' overflows 64 bits");
      return false;
    }
    out->bytes = count * unit.factor;
    return true;
  }
  return false;  // unreachable: the last unit matches every string
}

std::string AbslUnparseFlag(ByteSize size) {
  for (const Unit& unit : kUnits) {
    if (unit.name.empty() || unit.name.back() != 'i') continue;
    if (size.bytes != 0 && size.bytes % unit.factor == 0) {
      return absl::StrCat(size.bytes / unit.factor, unit.name);
    }
  }
  return absl::StrCat(size.bytes);
}

}  // namespace kvarena
