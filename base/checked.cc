#include "base/checked.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvarena {
namespace {
constexpr size_t kQuotedBytes = 48;
}  // namespace

std::string Quoted(absl::string_view s) {
  if (s.size() <= kQuotedBytes) return absl::StrCat("'", absl::CHexEscape(s), "'");
  return absl::StrCat("'", absl::CHexEscape(s.substr(0, kQuotedBytes)), "...' (", s.size(),
                      " bytes)");
}

}  // namespace kvarena
