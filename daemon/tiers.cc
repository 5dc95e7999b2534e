#include "daemon/tiers.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "tiers/disk_store.h"
#include "tiers/host_store.h"

namespace kvarena {

absl::StatusOr<std::shared_ptr<TierSet>> MakeTiers(const TierFlags& flags, TierLatency* latency) {
  if (flags.chunk_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tier_chunk_pages=", flags.chunk_pages, " but it is 0 (the default) or more"));
  }
  if (flags.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--tier_timeout=", absl::FormatDuration(flags.timeout),
                                                   " but a lookup needs some time: give more than 0"));
  }
  if (!flags.disk_dir.empty() && flags.disk_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tier_disk_dir=", flags.disk_dir,
                                                   " needs --tier_disk_bytes (how much of the disk it may fill)"));
  }
  if (flags.disk_dir.empty() && flags.disk_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tier_disk_bytes=", flags.disk_bytes, " needs --tier_disk_dir (where the chunks go)"));
  }
  std::vector<TierEntry> stores;
  if (flags.host_bytes > 0) {
    stores.push_back(TierEntry{NewHostStore(flags.host_bytes), flags.write_through});
  }
  if (!flags.disk_dir.empty()) {
    KVARENA_ASSIGN_OR_RETURN(std::unique_ptr<TierStore> disk, OpenDiskStore(flags.disk_dir, flags.disk_bytes));
    stores.push_back(TierEntry{std::move(disk), flags.write_through});
  }
  if (stores.empty()) return std::shared_ptr<TierSet>();
  TierOptions options;
  options.chunk_pages = flags.chunk_pages;
  options.write_through = flags.write_through;
  options.write_queue_bytes = flags.write_queue_bytes;
  options.timeout = flags.timeout;
  if (latency != nullptr) {
    options.on_latency = [latency](const std::string& medium, bool write, absl::Duration took) {
      latency->Record(medium, write, took);
    };
  }
  return std::make_shared<TierSet>(std::move(stores), std::move(options));
}

std::string DescribeTiers(const TierFlags& flags) {
  std::vector<std::string> parts;
  if (flags.host_bytes > 0) parts.push_back(absl::StrCat("host:", flags.host_bytes));
  if (!flags.disk_dir.empty()) parts.push_back(absl::StrCat("disk:", flags.disk_dir, ":", flags.disk_bytes));
  if (parts.empty()) return "";
  return absl::StrCat(" tiers=", absl::StrJoin(parts, ","), flags.write_through ? " write_through" : "");
}

}  // namespace kvarena
