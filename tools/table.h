// A plain-text table for the CLI: left-aligned columns padded to their widest cell, two
// spaces apart. Not thread-safe.
#ifndef KVARENA_TOOLS_TABLE_H_
#define KVARENA_TOOLS_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

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

// 1536 -> "1.5 KiB", 0 -> "0 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace kvarena

#endif  // KVARENA_TOOLS_TABLE_H_
