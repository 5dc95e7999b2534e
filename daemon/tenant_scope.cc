#include "daemon/tenant_scope.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "base/checked.h"

namespace kvarena {
namespace {

bool IsOperator(const Tenant* t) { return t != nullptr && t->operator_role; }

}  // namespace

bool SeesAllNames(const Caller& caller) {
  return caller.tenant != nullptr || (caller.session.empty() && caller.unix_socket);
}

TenantScope::TenantScope(const Tenant* tenant)
    : tenant_(tenant),
      prefix_(tenant == nullptr || tenant->operator_role
                  ? std::string()
                  : absl::StrCat(tenant->name, std::string(1, kTenantSeparator))) {}

const std::string& TenantScope::owner() const {
  static const std::string* const kNone = new std::string();
  return tenant_ == nullptr ? *kNone : tenant_->name;
}

absl::Status TenantScope::CheckWrite(absl::string_view rpc) const {
  if (!IsOperator(tenant_)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(rpc, ": tenant '", tenant_->name,
                   "' has role=operator, which only reads (Describe, "
                   "Stats, ListCaches, WatchEvents, Ping)"));
}

std::string TenantScope::CacheIn(absl::string_view id) const {
  if (tenant_ == nullptr) return std::string(id);
  std::string out(id);
  if (!IsOperator(tenant_)) {
    out = absl::StrCat(prefix_, id);
  } else if (const size_t slash = out.find('/'); slash != std::string::npos) {
    out[slash] = kTenantSeparator;
  }
  quoted_.emplace_back(Quoted(out), Quoted(id));
  return out;
}

std::string TenantScope::NamespaceIn(absl::string_view ns) const {
  return ns.empty() ? std::string() : CacheIn(ns);
}

bool TenantScope::Sees(absl::string_view core_name) const {
  return sees_all() || absl::StartsWith(core_name, prefix_);
}

std::string TenantScope::Out(absl::string_view core_name) const {
  if (IsOperator(tenant_)) {
    return absl::StrReplaceAll(core_name, {{std::string(1, kTenantSeparator), "/"}});
  }
  absl::ConsumePrefix(&core_name, prefix_);
  return std::string(core_name);
}

void TenantScope::Out(CacheInfo* info) const {
  info->cache_id = Out(info->cache_id);
  info->spec.prefix_namespace = Out(info->spec.prefix_namespace);
}

absl::Status TenantScope::Out(const absl::Status& status) const {
  if (status.ok() || tenant_ == nullptr) return status;
  std::string message(status.message());
  for (const auto& [core, caller] : quoted_) absl::StrReplaceAll({{core, caller}}, &message);
  // Any other core name the message holds unquoted.
  message = IsOperator(tenant_) ? Out(message) : absl::StrReplaceAll(message, {{prefix_, ""}});
  absl::Status out(status.code(), message);
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace kvarena
