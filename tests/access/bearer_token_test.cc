// BearerTokenProcessor and ConstantTimeEquals, without a server.
#include "daemon/bearer_token.h"

#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using Processor = grpc::AuthMetadataProcessor;

grpc::Status Process(const std::vector<std::pair<std::string, std::string>>& metadata,
                     Processor::OutputMetadata* consumed) {
  Processor::InputMetadata in;
  for (const auto& [k, v] : metadata) in.emplace(grpc::string_ref(k), grpc::string_ref(v));
  Processor::OutputMetadata response;
  return BearerTokenProcessor("s3cret-token-0123456789").Process(in, nullptr, consumed, &response);
}

TEST(ConstantTimeEqualsTest, EqualOnlyWhenEveryByteAndTheLengthMatch) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("ab\0", 3), "ab"));
}

TEST(BearerTokenProcessorTest, AdmitsTheTokenAndConsumesIt) {
  Processor::OutputMetadata consumed;
  EXPECT_TRUE(Process({{"authorization", "Bearer s3cret-token-0123456789"}}, &consumed).ok());
  ASSERT_EQ(consumed.size(), 1u);
  EXPECT_EQ(consumed.begin()->first, "authorization");
}

TEST(BearerTokenProcessorTest, RefusesAMissingOrWrongToken) {
  Processor::OutputMetadata consumed;
  EXPECT_THAT(Process({}, &consumed), StatusIs(grpc::StatusCode::UNAUTHENTICATED, "requires"));
  EXPECT_THAT(Process({{"x-other", "Bearer s3cret-token-0123456789"}}, &consumed),
              StatusIs(grpc::StatusCode::UNAUTHENTICATED));
  for (const char* wrong : {"Bearer s3cret-token-012345678", "Bearer s3cret-token-0123456780",
                            "s3cret-token-0123456789", "bearer s3cret-token-0123456789"}) {
    SCOPED_TRACE(wrong);
    const grpc::Status s = Process({{"authorization", wrong}}, &consumed);
    EXPECT_THAT(s, StatusIs(grpc::StatusCode::UNAUTHENTICATED, "does not match"));
    EXPECT_EQ(s.error_message().find("s3cret"), std::string::npos);  // the token is not echoed
  }
}

}  // namespace
}  // namespace kvarena
