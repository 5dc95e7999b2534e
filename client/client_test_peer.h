// ClientTestPeer: a Client's test hooks, kept out of the public API (kvarena/client.h) and
// reached by this repository's tests only (leveldb keeps such hooks as TEST_ methods; here
// a peer holds them so that a worker's header shows none). Thread-safety as the Client's;
// the Client outlives the peer.
#ifndef KVARENA_CLIENT_CLIENT_TEST_PEER_H_
#define KVARENA_CLIENT_CLIENT_TEST_PEER_H_

#include <memory>
#include <utility>

#include "client/local_kernels.h"
#include "client/transport.h"
#include "kvarena/client.h"

namespace kvarena::client_internal {

class ClientTestPeer {
 public:
  explicit ClientTestPeer(Client& client) : client_(client) {}

  // Every local kernel set the client creates from now on (one per kind of pool memory,
  // on first use) is wrap(the real one). REQUIRES: no local-path call made yet.
  void WrapLocalKernels(LocalKernels::Wrapper wrap) {
    client_.transport_->TEST_WrapLocalKernels(std::move(wrap));
  }
  // Scratch lanes quarantined so far (a remote client with zero-copy; else 0).
  int QuarantinedLanes() const { return client_.transport_->TEST_QuarantinedLanes(); }

 private:
  Client& client_;
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_CLIENT_TEST_PEER_H_
