// ByteSize: a byte count for flags such as --arena_bytes. Parses a plain count ("1048576")
// or a number with a unit: decimal K, M, G, T (powers of 1000) or binary Ki, Mi, Gi, Ti
// (powers of 1024); a trailing "B" and lower-case k are accepted ("64KiB", "512k").
// Unparses to the largest binary unit that divides the count exactly ("1Gi"), else bytes.
// A plain value type; thread-compatible.
#ifndef KVARENA_DAEMON_BYTE_SIZE_H_
#define KVARENA_DAEMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kvarena {

struct ByteSize {
  uint64_t bytes = 0;
};

bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_BYTE_SIZE_H_
