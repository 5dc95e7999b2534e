#include "core/checked.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvarena {
namespace {
constexpr size_t kQuotedBytes = 48;
}  // namespace

std::optional<uint64_t> TensorBytes(DType dtype, int64_t heads, int64_t tokens, int64_t head_dim) {
  const int64_t elem = int64_t(DTypeSize(dtype));
  if (heads < 0 || tokens < 0 || head_dim < 0 || elem == 0) return std::nullopt;
  std::optional<int64_t> n = CheckedMul(heads, tokens);
  if (n) n = CheckedMul(*n, head_dim);
  if (n) n = CheckedMul(*n, elem);
  if (!n) return std::nullopt;
  return uint64_t(*n);
}

std::string Quoted(absl::string_view s) {
  if (s.size() <= kQuotedBytes) return absl::StrCat("'", absl::CHexEscape(s), "'");
  return absl::StrCat("'", absl::CHexEscape(s.substr(0, kQuotedBytes)), "...' (", s.size(),
                      " bytes)");
}

}  // namespace kvarena
