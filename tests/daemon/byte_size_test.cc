#include "daemon/byte_size.h"

#include "gtest/gtest.h"

namespace kvarena {
namespace {

TEST(ByteSizeTest, ParsesCountsAndUnits) {
  const struct {
    const char* text;
    uint64_t bytes;
  } kCases[] = {
      {"1073741824", 1073741824},
      {"0", 0},
      {"1Gi", 1ull << 30},
      {"512Mi", 512ull << 20},
      {"64KiB", 64 << 10},
      {"4G", 4'000'000'000},
      {"3M", 3'000'000},
      {"2K", 2000},
      {"2k", 2000},
      {"1Ti", 1ull << 40},
      {" 8Mi ", 8 << 20},
      {"100B", 100},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.text);
    ByteSize size;
    std::string error;
    ASSERT_TRUE(AbslParseFlag(c.text, &size, &error)) << error;
    EXPECT_EQ(size.bytes, c.bytes);
  }
}

TEST(ByteSizeTest, RejectsWhatIsNotACount) {
  for (const char* text : {"", "abc", "-1", "1.5G", "12Q", "Gi", "1 Gi x", "99999999999999Ti"}) {
    SCOPED_TRACE(text);
    ByteSize size;
    std::string error;
    EXPECT_FALSE(AbslParseFlag(text, &size, &error));
    EXPECT_FALSE(error.empty());
  }
}

TEST(ByteSizeTest, UnparsesToTheLargestExactBinaryUnit) {
  EXPECT_EQ(AbslUnparseFlag(ByteSize{1ull << 30}), "1Gi");
  EXPECT_EQ(AbslUnparseFlag(ByteSize{3ull << 20}), "3Mi");
  EXPECT_EQ(AbslUnparseFlag(ByteSize{1536}), "1536");
  EXPECT_EQ(AbslUnparseFlag(ByteSize{2048}), "2Ki");
  EXPECT_EQ(AbslUnparseFlag(ByteSize{1000}), "1000");
  EXPECT_EQ(AbslUnparseFlag(ByteSize{0}), "0");
}

}  // namespace
}  // namespace kvarena
