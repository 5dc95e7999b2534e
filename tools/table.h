// A plain-text table for the CLI: left-aligned columns padded to their widest cell, two
// spaces apart, every cell escaped for the terminal (ForTerminal). Not thread-safe.
#ifndef KVARENA_TOOLS_TABLE_H_
#define KVARENA_TOOLS_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvarena {

class Table {
 public:
  Table() = default;
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// Text as a terminal may show it: every byte outside printable ASCII (control
// characters, escape sequences, other encodings) as \xNN, and a backslash as \\, so
// strings callers chose (cache ids, refusal messages) cannot drive the operator's
// terminal and the escaping stays unambiguous.
std::string ForTerminal(absl::string_view text);

// 1536 -> "1.5 KiB", 0 -> "0 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace kvarena

#endif  // KVARENA_TOOLS_TABLE_H_
