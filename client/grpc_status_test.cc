#include "client/grpc_status.h"

#include "gtest/gtest.h"

namespace kvarena {
namespace {

TEST(FromGrpcStatusTest, OkIsOk) { EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok()); }

TEST(FromGrpcStatusTest, EveryCodeMapsOneToOneAndKeepsTheMessage) {
  for (int code = 1; code <= 16; ++code) {
    SCOPED_TRACE(code);
    const absl::Status s =
        FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(code), "append: pos=12"));
    EXPECT_EQ(static_cast<int>(s.code()), code);
    if (code != grpc::StatusCode::UNAVAILABLE) {
      EXPECT_EQ(s.message(), "append: pos=12");
    }
  }
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "x")).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "x")).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "x")).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(FromGrpcStatusTest, UnavailableSaysTheDaemonIsUnavailable) {
  const absl::Status s =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "kvarena daemon unavailable: failed to connect");
  // Not prefixed twice.
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(s.message())))
                .message(),
            s.message());
}

}  // namespace
}  // namespace kvarena
