#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/checked.h"
#include "base/clock.h"
#include "base/little_endian.h"
#include "base/small_file.h"
#include "base/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"

namespace kvarena {
namespace {

using ::kvarena::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CheckedTest, AddAndMulReportOverflow) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(CheckedAdd<int64_t>(2, 3), 5);
  EXPECT_EQ(CheckedAdd<int64_t>(kMax, 1), std::nullopt);
  EXPECT_EQ(CheckedMul<int64_t>(kMax / 2, 2), kMax - 1);
  EXPECT_EQ(CheckedMul<int64_t>(kMax / 2 + 1, 2), std::nullopt);
  EXPECT_EQ(SaturatingAdd<uint32_t>(0xffffffffu, 1), 0xffffffffu);
}

TEST(CheckedTest, QuotedEscapesAndShortensLongStrings) {
  EXPECT_EQ(Quoted("abc"), "'abc'");
  EXPECT_EQ(Quoted(std::string("a\nb")), "'a\\nb'");
  EXPECT_EQ(Quoted(std::string(8192, 'x')), "'" + std::string(48, 'x') + "...' (8192 bytes)");
}

TEST(LittleEndianTest, RoundTripsLowByteFirst) {
  std::string out;
  PutU32(&out, 0x04030201u);
  PutU64(&out, 0x0807060504030201ull);
  ASSERT_EQ(out.size(), 12u);
  EXPECT_EQ(out[0], 0x01);
  EXPECT_EQ(out[3], 0x04);
  EXPECT_EQ(LoadU32(out.data()), 0x04030201u);
  EXPECT_EQ(LoadU64(out.data() + 4), 0x0807060504030201ull);
}

TEST(ClockTest, FakeClockMovesOnlyWhenAdvanced) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  EXPECT_GT(start, absl::UnixEpoch());
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(5));
  EXPECT_GT(RealClock()->Now(), absl::UnixEpoch());
}

class SmallFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  TempDir dir_;
};

TEST_F(SmallFileTest, ReadsAFileUpToMaxBytes) {
  const std::string path = Write("cert", "hello");
  EXPECT_EQ(ReadSmallFile(path, 5).value(), "hello");
}

TEST_F(SmallFileTest, RefusesAFilePastMaxBytes) {
  const std::string path = Write("big", std::string(10000, 'x'));
  EXPECT_THAT(ReadSmallFile(path, 4096).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("larger than 4096 bytes")));
}

TEST_F(SmallFileTest, AMissingFileIsNotFoundNamingThePath) {
  const std::string path = dir_.path() + "/absent";
  EXPECT_THAT(ReadSmallFile(path, 16).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

absl::StatusOr<int> Half(int v) {
  if (v % 2 != 0) return absl::InvalidArgumentError("odd");
  return v / 2;
}

absl::StatusOr<int> Quarter(int v) {
  KVARENA_ASSIGN_OR_RETURN(const int half, Half(v));
  KVARENA_ASSIGN_OR_RETURN(int quarter, Half(half));
  KVARENA_RETURN_IF_ERROR(absl::OkStatus());
  return quarter;
}

TEST(StatusMacrosTest, ReturnTheFirstError) {
  EXPECT_EQ(Quarter(8).value(), 2);
  EXPECT_THAT(Quarter(6).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvarena
