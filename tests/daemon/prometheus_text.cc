#include "tests/daemon/prometheus_text.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvarena::testing {
namespace {

bool IsNameStart(char c, bool colon) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' || (colon && c == ':');
}
bool IsNameChar(char c, bool colon) {
  return IsNameStart(c, colon) || absl::ascii_isdigit(static_cast<unsigned char>(c));
}

// Consumes a metric name (colon true) or a label name from the front of *s.
std::optional<std::string> TakeName(absl::string_view* s, bool colon) {
  size_t n = 0;
  if (s->empty() || !IsNameStart((*s)[0], colon)) return std::nullopt;
  while (n < s->size() && IsNameChar((*s)[n], colon)) ++n;
  std::string name(s->substr(0, n));
  s->remove_prefix(n);
  return name;
}

// A float as the format writes one: Go's ParseFloat syntax, here what strtod reads in
// full (decimal, exponent, Inf, NaN).
std::optional<double> ParseValue(absl::string_view token) {
  if (token.empty()) return std::nullopt;
  const std::string s(token);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || (errno == ERANGE && !std::isinf(v))) return std::nullopt;
  return v;
}

// Unescapes a HELP text: \\ and \n only.
std::optional<std::string> UnescapeHelp(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out.push_back(s[i]);
      continue;
    }
    if (++i == s.size()) return std::nullopt;
    if (s[i] == '\\') {
      out.push_back('\\');
    } else if (s[i] == 'n') {
      out.push_back('\n');
    } else {
      return std::nullopt;
    }
  }
  return out;
}

// Consumes {name="value",...} from the front of *s into *labels; an error names the fault.
std::optional<std::string> TakeLabels(absl::string_view* s, PromLabels* labels) {
  s->remove_prefix(1);  // '{'
  while (true) {
    if (absl::ConsumePrefix(s, "}")) return std::nullopt;
    std::optional<std::string> name = TakeName(s, /*colon=*/false);
    if (!name) return "a label name";
    if (!absl::ConsumePrefix(s, "=\"")) return absl::StrCat("=\" after label ", *name);
    std::string value;
    bool closed = false;
    while (!s->empty() && !closed) {
      const char c = (*s)[0];
      s->remove_prefix(1);
      if (c == '"') {
        closed = true;
      } else if (c == '\\') {
        if (s->empty()) break;
        const char e = (*s)[0];
        s->remove_prefix(1);
        if (e == '\\' || e == '"') {
          value.push_back(e);
        } else if (e == 'n') {
          value.push_back('\n');
        } else {
          return absl::StrCat("the escape \\", std::string(1, e), " in label ", *name);
        }
      } else if (c == '\n') {
        return absl::StrCat("a raw line feed in label ", *name);
      } else {
        value.push_back(c);
      }
    }
    if (!closed) return absl::StrCat("the closing quote of label ", *name);
    if (!labels->emplace(*name, std::move(value)).second)
      return absl::StrCat("label ", *name, " twice");
    if (absl::ConsumePrefix(s, ",")) continue;
    if (absl::ConsumePrefix(s, "}")) return std::nullopt;
    return absl::StrCat(", or } after label ", *name);
  }
}

bool KnownType(absl::string_view t) {
  return t == "counter" || t == "gauge" || t == "histogram" || t == "summary" || t == "untyped";
}

// What the histogram rules say about one family, or "" when it keeps them.
std::string CheckHistogram(const PromFamily& f) {
  struct Series {
    std::vector<std::pair<double, double>> buckets;  // le, cumulative count, in order
    std::optional<double> sum, count;
  };
  std::map<PromLabels, Series> series;
  for (const PromSample& s : f.samples) {
    PromLabels key = s.labels;
    if (s.name == f.name + "_bucket") {
      const auto le = key.find("le");
      std::optional<double> bound = le == key.end() ? std::nullopt : ParseValue(le->second);
      if (!bound) return absl::StrCat(s.name, ": a bucket without a numeric le");
      key.erase("le");
      series[key].buckets.emplace_back(*bound, s.value);
    } else if (s.name == f.name + "_sum") {
      series[key].sum = s.value;
    } else if (s.name == f.name + "_count") {
      series[key].count = s.value;
    }
  }
  for (const auto& [labels, h] : series) {
    std::string where = f.name;
    for (const auto& [k, v] : labels) absl::StrAppend(&where, " ", k, "=", v);
    if (!h.sum || !h.count) return absl::StrCat(where, ": no _sum or no _count");
    if (h.buckets.empty() || !std::isinf(h.buckets.back().first) || h.buckets.back().first < 0) {
      return absl::StrCat(where, ": the last bucket is not le=\"+Inf\"");
    }
    for (size_t i = 1; i < h.buckets.size(); ++i) {
      const auto& [le, count] = h.buckets[i];
      if (!(le > h.buckets[i - 1].first)) return absl::StrCat(where, ": le values do not rise");
      if (count < h.buckets[i - 1].second) return absl::StrCat(where, ": a bucket count falls");
    }
    if (h.buckets.back().second != *h.count) return absl::StrCat(where, ": +Inf bucket != _count");
  }
  return "";
}

}  // namespace

const PromFamily* Exposition::Family(const std::string& name) const {
  for (const PromFamily& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::optional<double> Exposition::Value(const std::string& name, const PromLabels& labels) const {
  for (const PromFamily& f : families) {
    for (const PromSample& s : f.samples) {
      if (s.name == name && s.labels == labels) return s.value;
    }
  }
  return std::nullopt;
}

double Exposition::ValueOr0(const std::string& name, const PromLabels& labels) const {
  return Value(name, labels).value_or(0);
}

std::map<PromLabels, double> Exposition::Series(const std::string& name) const {
  std::map<PromLabels, double> out;
  for (const PromFamily& f : families) {
    for (const PromSample& s : f.samples) {
      if (s.name == name) out[s.labels] = s.value;
    }
  }
  return out;
}

absl::StatusOr<Exposition> ParseExposition(absl::string_view text) {
  if (!text.empty() && text.back() != '\n') {
    return absl::InvalidArgumentError("the text does not end with a line feed");
  }
  Exposition out;
  std::map<std::string, size_t> index;  // family name -> out.families
  std::set<std::pair<std::string, PromLabels>> seen;
  std::optional<size_t> current;  // the family the last sample belonged to
  auto family = [&](const std::string& name) -> PromFamily& {
    auto [it, added] = index.emplace(name, out.families.size());
    if (added) out.families.push_back(PromFamily{name, "", "", {}});
    return out.families[it->second];
  };
  int line_no = 0;
  const absl::string_view lines = text.substr(0, text.empty() ? 0 : text.size() - 1);
  for (absl::string_view line : absl::StrSplit(lines, '\n')) {
    ++line_no;
    auto error = [line_no, line](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, " \"", line, "\": ", what));
    };
    if (line.empty()) continue;
    if (line[0] == '#') {
      absl::string_view rest = line;
      const bool help = absl::ConsumePrefix(&rest, "# HELP ");
      if (!help && !absl::ConsumePrefix(&rest, "# TYPE ")) continue;  // a comment
      std::optional<std::string> name = TakeName(&rest, /*colon=*/true);
      if (!name || !(rest.empty() || absl::ConsumePrefix(&rest, " ")))
        return error("a metric name");
      PromFamily& f = family(*name);
      if (!f.samples.empty()) return error("HELP or TYPE after the family's samples");
      if (help) {
        std::optional<std::string> doc = UnescapeHelp(rest);
        if (!doc) return error("an escape other than \\\\ or \\n");
        if (!f.help.empty()) return error("a second HELP");
        f.help = *doc;
      } else {
        if (!KnownType(rest)) return error("an unknown type");
        if (!f.type.empty()) return error("a second TYPE");
        f.type = std::string(rest);
      }
      continue;
    }
    absl::string_view rest = line;
    std::optional<std::string> name = TakeName(&rest, /*colon=*/true);
    if (!name) return error("a metric name");
    PromSample sample{*name, {}, 0};
    if (!rest.empty() && rest[0] == '{') {
      if (std::optional<std::string> fault = TakeLabels(&rest, &sample.labels))
        return error(*fault);
    }
    if (!absl::ConsumePrefix(&rest, " ")) return error("a space before the value");
    std::vector<absl::string_view> fields = absl::StrSplit(rest, ' ', absl::SkipEmpty());
    if (fields.empty() || fields.size() > 2) return error("a value and at most a timestamp");
    std::optional<double> value = ParseValue(fields[0]);
    int64_t timestamp = 0;
    if (!value) return error("a numeric value");
    if (fields.size() == 2 && !absl::SimpleAtoi(fields[1], &timestamp))
      return error("an integer timestamp");
    sample.value = *value;

    // The family: the name itself, or a histogram's / summary's suffixed sample.
    std::string base = *name;
    auto it = index.find(base);
    if (it == index.end() || out.families[it->second].type.empty()) {
      for (absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
        if (absl::EndsWith(*name, suffix)) {
          base = name->substr(0, name->size() - suffix.size());
          it = index.find(base);
          break;
        }
      }
    }
    if (it == index.end() || out.families[it->second].type.empty())
      return error("no TYPE line before it");
    PromFamily& f = out.families[it->second];
    const bool suffixed = base != *name;
    if (f.type == "histogram" ? !suffixed : (suffixed && f.type != "summary")) {
      return error(absl::StrCat("a sample name that does not fit its ", f.type, " family"));
    }
    if (absl::EndsWith(*name, "_bucket") && f.type == "histogram" &&
        !sample.labels.contains("le")) {
      return error("a bucket without le");
    }
    if (f.type == "counter" && !(sample.value >= 0)) return error("a counter below 0");
    if (current != it->second && !f.samples.empty())
      return error("the family's samples are not together");
    if (!seen.emplace(sample.name, sample.labels).second) return error("a series seen before");
    current = it->second;
    f.samples.push_back(std::move(sample));
  }
  for (const PromFamily& f : out.families) {
    if (f.type.empty())
      return absl::InvalidArgumentError(absl::StrCat(f.name, ": HELP but no TYPE"));
    if (f.type != "histogram") continue;
    if (std::string fault = CheckHistogram(f); !fault.empty())
      return absl::InvalidArgumentError(fault);
  }
  return out;
}

}  // namespace kvarena::testing
