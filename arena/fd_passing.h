// Passing file descriptors between processes over a connected Unix stream socket
// (SCM_RIGHTS), the way region fds reach attached workers: gRPC cannot carry them.
//
// Each Send is one message: its bytes and its fds arrive together in one Recv. Messages
// are length-prefixed, so a Recv returns exactly one Send's bytes. Thread-compatible: one
// thread per socket at a time.
#ifndef KVARENA_ARENA_FD_PASSING_H_
#define KVARENA_ARENA_FD_PASSING_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kvarena {

inline constexpr size_t kMaxFdsPerMessage = 250;  // below the kernel's SCM_MAX_FD (253)
inline constexpr size_t kMaxMessageBytes = 1 << 20;

// Sends bytes and (duplicates of) fds; the caller keeps its fds. With a finite deadline
// the send never blocks past it: DEADLINE_EXCEEDED once it passes with bytes unsent (the
// stream is then mid-message: close it).
absl::Status SendMessage(int sock, absl::string_view bytes, absl::Span<const int> fds = {},
                         absl::Time deadline = absl::InfiniteFuture());

struct Message {
  std::string bytes;
  std::vector<int> fds;  // owned by the receiver: close them
};
// Receives one message. UNAVAILABLE when the peer closed the socket; INVALID_ARGUMENT
// when it is too large or more than kMaxFdsPerMessage fds came with it (none are kept);
// DEADLINE_EXCEEDED when a finite deadline passes before the whole message arrived, however
// the peer paced its bytes (the stream is then mid-message: close it).
absl::StatusOr<Message> RecvMessage(int sock, absl::Time deadline = absl::InfiniteFuture());

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCred> PeerCredentials(int sock);

// Connects a Unix stream socket to path (close-on-exec).
absl::StatusOr<int> ConnectUnix(const std::string& path);

}  // namespace kvarena

#endif  // KVARENA_ARENA_FD_PASSING_H_
