// Test-only, shared by every layer's tests. StatusIs(code) and StatusIs(code, message_matcher):
// gmock matchers for absl::Status and absl::StatusOr<T> (Debian's abseil predates absl's own
// status_matchers.h).
#ifndef KVARENA_TESTS_SUPPORT_STATUS_MATCHERS_H_
#define KVARENA_TESTS_SUPPORT_STATUS_MATCHERS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"

namespace kvarena::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER_P(StatusIs, code, absl::StrCat("has status code ", absl::StatusCodeToString(code))) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

// StatusIs(code, message_matcher): the code, and a message that message_matcher accepts
// (HasSubstr("layer=3")).
MATCHER_P2(StatusIs, code, message_matcher,
           absl::StrCat("has status code ", absl::StatusCodeToString(code), " and a message that ",
                        ::testing::DescribeMatcher<std::string>(message_matcher))) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::Matcher<std::string>(message_matcher).Matches(std::string(s.message()));
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.ok();
}

MATCHER_P(IsOkAndHolds, value, absl::StrCat("is OK and holds ", ::testing::PrintToString(value))) {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  *result_listener << "holds " << ::testing::PrintToString(*arg);
  return *arg == value;
}

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_STATUS_MATCHERS_H_
