#include "daemon/tenants.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/small_file.h"
#include "base/status_macros.h"
#include "core/refusal.h"
#include "daemon/bearer_token.h"
#include "daemon/byte_size.h"

namespace kvarena {
namespace {

constexpr size_t kMaxNameBytes = 64;
constexpr size_t kMaxTenantsFileBytes = size_t{1} << 20;

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

// One option of a line into *tenant; false when it is not one.
bool ApplyOption(absl::string_view option, Tenant* tenant) {
  if (option == "role=operator") {
    tenant->operator_role = true;
    return true;
  }
  for (auto [name, value] : {std::pair("max_sessions=", &tenant->max_sessions),
                             std::pair("max_caches=", &tenant->max_caches),
                             std::pair("max_pages=", &tenant->max_pages)}) {
    if (absl::ConsumePrefix(&option, name)) return absl::SimpleAtoi(option, value) && *value > 0;
  }
  if (absl::ConsumePrefix(&option, "max_metadata_bytes=")) {
    ByteSize size;
    std::string error;
    if (!AbslParseFlag(option, &size, &error) || size.bytes == 0) return false;
    tenant->max_metadata_bytes = size.bytes;
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<Tenants> Tenants::Parse(absl::string_view file, absl::string_view text,
                                       const TokenReader& read_token) {
  Tenants out;
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_set<std::string> tokens;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const std::string where = absl::StrCat("--tenants_file=", file, " line ", line_no);
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos)
      line = line.substr(0, hash);
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    if (words.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": expected 'NAME TOKEN_FILE [role=operator] [max_sessions=N] "
                       "[max_caches=N] [max_pages=N] [max_metadata_bytes=BYTES]'"));
    }
    Tenant tenant;
    tenant.name = std::string(words[0]);
    if (!ValidName(tenant.name)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tenant name '",
                                                     absl::CHexEscape(words[0]), "' is not 1-",
                                                     kMaxNameBytes, " bytes of [A-Za-z0-9_.-]"));
    }
    for (size_t i = 2; i < words.size(); ++i) {
      if (!ApplyOption(words[i], &tenant)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown option '", absl::CHexEscape(words[i]),
                         "' (role=operator; max_sessions=N, max_caches=N, max_pages=N, "
                         "max_metadata_bytes=BYTES with N, BYTES > 0)"));
      }
    }
    KVARENA_ASSIGN_OR_RETURN(
        std::string token, read_token(absl::StrCat(where, ": token file"), std::string(words[1])));
    tenant.token = std::move(token);
    if (!names.insert(tenant.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tenant '", tenant.name, "' is listed twice"));
    }
    if (!tokens.insert(tenant.token).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tenant '", tenant.name, "' has the token of an earlier line"));
    }
    out.tenants_.push_back(std::move(tenant));
  }
  if (out.tenants_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--tenants_file=", file, " lists no tenant"));
  }
  return out;
}

absl::StatusOr<Tenants> Tenants::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxTenantsFileBytes);
  if (!text.ok()) {
    return Annotated(text.status(), "--tenants_file=");
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  return Parse(path, *text, [&dir](absl::string_view what, const std::string& token_path) {
    return ReadBearerTokenFile(what,
                               absl::StartsWith(token_path, "/") ? token_path : dir + token_path);
  });
}

absl::StatusOr<const Tenant*> Tenants::Authenticate(
    std::optional<absl::string_view> authorization) const {
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "kvarenad: calls need 'authorization: Bearer <token>' metadata with a tenant's token "
        "(--tenants_file)");
  }
  // Every tenant's token is compared, whichever matches: the time depends on the tokens'
  // lengths only.
  const Tenant* found = nullptr;
  for (const Tenant& t : tenants_) {
    const bool match = ConstantTimeEquals(*authorization, absl::StrCat("Bearer ", t.token));
    if (match) found = &t;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError("kvarenad: the bearer token is no tenant's (--tenants_file)");
  }
  return found;
}

}  // namespace kvarena
