// A strict reader of the Prometheus text exposition format 0.0.4, for tests: it checks
// what a scraper relies on and returns the samples by family.
//   - `# HELP name text` (escapes \\ and \n) at most once per family; `# TYPE name type`
//     (counter, gauge, histogram, summary, untyped) at most once, before its samples;
//   - sample lines `name{label="value",...} value [timestamp]`: metric and label names
//     as the format defines them, label values with the escapes \\ \" \n only, no label
//     twice, values as Go's ParseFloat reads them (and +Inf, -Inf, NaN);
//   - a family's samples are contiguous, no series appears twice, and every sample
//     belongs to a family with a TYPE line (histogram samples are name_bucket with le,
//     name_sum and name_count; counter samples are non-negative);
//   - every histogram series has a _sum, a _count and buckets whose le values rise to
//     +Inf, with cumulative counts that never fall and a +Inf count equal to _count.
//
// Thread-compatible: plain values.
#ifndef KVARENA_TESTS_DAEMON_PROMETHEUS_TEXT_H_
#define KVARENA_TESTS_DAEMON_PROMETHEUS_TEXT_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvarena::testing {

using PromLabels = std::map<std::string, std::string>;

struct PromSample {
  std::string name;  // with the _bucket / _sum / _count suffix of a histogram sample
  PromLabels labels;
  double value = 0;
};

struct PromFamily {
  std::string name;
  std::string help;  // unescaped
  std::string type;
  std::vector<PromSample> samples;
};

struct Exposition {
  std::vector<PromFamily> families;  // in the order they came

  const PromFamily* Family(const std::string& name) const;
  // The sample `name` with exactly `labels`; nullopt when there is none.
  std::optional<double> Value(const std::string& name, const PromLabels& labels = {}) const;
  // The sample's value, 0 when there is none (what a counter not yet seen stands for).
  double ValueOr0(const std::string& name, const PromLabels& labels = {}) const;
  // Every sample named `name`, by its labels.
  std::map<PromLabels, double> Series(const std::string& name) const;
};

// INVALID_ARGUMENT naming the line (1-based) and what is wrong with it.
absl::StatusOr<Exposition> ParseExposition(absl::string_view text);

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_DAEMON_PROMETHEUS_TEXT_H_
