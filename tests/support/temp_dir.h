// Test-only, shared by every layer's tests. TempDir: a fresh directory under $TMPDIR (or
// /tmp), removed with everything in it when it goes out of scope.
//
// Thread-compatible.
#ifndef KVARENA_TESTS_SUPPORT_TEMP_DIR_H_
#define KVARENA_TESTS_SUPPORT_TEMP_DIR_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace kvarena {

class TempDir {
 public:
  // path() is "" when no directory could be made.
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/kvarena_test.XXXXXX";
    path_ = mkdtemp(templ.data()) != nullptr ? templ : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kvarena

#endif  // KVARENA_TESTS_SUPPORT_TEMP_DIR_H_
