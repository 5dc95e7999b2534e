// ConnectToDaemon: a gRPC channel to a kvarenad a benchmark just started (ChildDaemon),
// once the daemon answers Ping. Header-only; thread-compatible.
#ifndef KVARENA_BENCH_DAEMON_CHANNEL_H_
#define KVARENA_BENCH_DAEMON_CHANNEL_H_

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "kvarena/v1/kvarena.grpc.pb.h"

namespace kvarena {

// Waits (up to 10 s) until Ping answers; each try on a fresh channel (a failed connect
// backs off). Returns the channel Ping answered on, with no limit on replies; null if
// none did.
inline std::shared_ptr<grpc::Channel> ConnectToDaemon(const std::string& address) {
  for (int attempt = 0; attempt < 500; ++attempt) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetInt("kvarena.bench.attempt", attempt);
    auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    grpc::ClientContext ctx;
    v1::PingResponse resp;
    if (v1::KvCacheService::NewStub(channel)->Ping(&ctx, v1::PingRequest(), &resp).ok()) {
      return channel;
    }
    usleep(20'000);
  }
  return nullptr;
}

}  // namespace kvarena

#endif  // KVARENA_BENCH_DAEMON_CHANNEL_H_
