// libFuzzer target: the fd socket's server side on arbitrary bytes. The input is written to
// one end of a Unix socket pair; the other end is read exactly as FdServer reads a
// connection (arena/fd_passing: length-prefixed frames) and every frame goes to
// HandleFdRequest (daemon/fd_requests.h), which parses it and lists or exports regions of
// a store with two live sessions and a pool. The fuzzer cannot guess a session id, so a
// request naming "s0" or "s1" is given that session's real id (the raw bytes are parsed
// too). Every fd a reply carries is closed; none may leak, nothing may crash.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "arena/fd_passing.h"
#include "core/kv_store.h"
#include "daemon/fd_requests.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {
namespace {

struct World {
  World() {
    StoreOptions o;
    o.arena_bytes = size_t{16} << 20;
    o.num_threads = 0;
    o.scratch_bytes = size_t{2} << 20;
    store = *KvStore::Create(o, NewHostBackend());
    for (const char* name : {"s0", "s1"}) sessions.push_back(*store->OpenSession(name));
    (void)store->Allocate(sessions[0], CacheSpec{1, 2, 8, DType::kFloat32, 4, {}, 0, ""}, "a");
  }
  std::unique_ptr<KvStore> store;
  std::vector<std::string> sessions;
};

// The bytes with a placeholder session id replaced by the real one, when they parse.
std::string WithRealSession(const World& w, const std::string& bytes) {
  v1::FdRequest req;
  if (!req.ParseFromString(bytes)) return bytes;
  if (req.session_id() == "s0") req.set_session_id(w.sessions[0]);
  if (req.session_id() == "s1") req.set_session_id(w.sessions[1]);
  return req.SerializeAsString();
}

void Serve(const World& w, const std::string& frame, bool allowed) {
  std::vector<SharedPiece> pieces;
  const absl::Status access =
      allowed ? absl::OkStatus() : absl::PermissionDeniedError("fd socket: peer uid 65534 refused");
  const v1::FdReply reply = HandleFdRequest(*w.store, frame, access, &pieces);
  if (size_t(reply.pieces_size()) != pieces.size()) {
    std::fprintf(stderr, "fd_fuzzer: %d pieces in the reply but %zu fds\n", reply.pieces_size(),
                 pieces.size());
    std::abort();
  }
  for (const SharedPiece& p : pieces) close(p.fd);
}

}  // namespace
}  // namespace kvarena

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvarena::World* world = new kvarena::World();  // one store for every input
  if (size == 0 || size > (1 << 16)) return 0;
  const bool allowed = (data[0] & 1) == 0;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  // Below the socket buffer (>= 64 KiB after the bump), so one write never blocks.
  const int buffer = 1 << 18;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  size_t sent = 0;
  while (sent < size - 1) {
    const ssize_t n = write(sv[1], data + 1 + sent, size - 1 - sent);
    if (n <= 0) break;
    sent += size_t(n);
  }
  close(sv[1]);
  for (;;) {
    absl::StatusOr<kvarena::Message> m = kvarena::RecvMessage(sv[0]);
    if (!m.ok()) break;
    for (int fd : m->fds) close(fd);
    kvarena::Serve(*world, kvarena::WithRealSession(*world, m->bytes), allowed);
    kvarena::Serve(*world, m->bytes, allowed);
  }
  close(sv[0]);
  return 0;
}
