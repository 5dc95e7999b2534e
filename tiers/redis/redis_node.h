// RedisNode: one Redis server of a cluster — a single hiredis connection (connected on
// first use, AUTHenticated, with connect and read/write timeouts) and the node's circuit
// breaker. A transport failure (refused connect, failed AUTH, I/O error, a reply hiredis
// cannot parse, a timeout) closes the connection and opens the breaker: for breaker_period
// (doubling with each failed probe, up to 8x) every command to the node fails at once with
// UNAVAILABLE; then the next command is the probe, and its success closes the breaker.
// The breaker's period is measured on options.clock; socket timeouts and deadlines are
// real time (a fake clock cannot make a socket time out).
//
// Thread-safety: safe for concurrent use. The connection is used by one caller at a time
// (a `busy_` flag claimed under mu_, waited for until the caller's deadline); no mutex is
// held across a network call.
#ifndef KVARENA_TIERS_REDIS_REDIS_NODE_H_
#define KVARENA_TIERS_REDIS_REDIS_NODE_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "tiers/redis/redis_reply.h"
#include "tiers/redis/redis_slot.h"

struct redisContext;

namespace kvarena {

struct RedisConnectOptions {
  std::string user;      // ACL user; empty: AUTH with the password alone
  std::string password;  // empty: no AUTH
  absl::Duration connect_timeout = absl::Milliseconds(200);
  absl::Duration command_timeout = absl::Milliseconds(500);  // each read and write
  absl::Duration breaker_period = absl::Seconds(1);
  // Where the breaker reads the time: when it opened and when its period is over. Not
  // for the timeouts above nor for deadlines, which stay on the system clock because they
  // bound real socket waits. Outlives the node; tests pass a FakeClock.
  Clock* clock = RealClock();
};

class RedisNode {
 public:
  // `counters` outlives the node.
  RedisNode(RedisAddress address, const RedisConnectOptions& options, RedisCounters* counters);
  ~RedisNode();
  RedisNode(const RedisNode&) = delete;
  RedisNode& operator=(const RedisNode&) = delete;

  const RedisAddress& address() const { return address_; }
  // Sends `commands` in one pipeline and returns their replies in order (an error reply is
  // a reply of type kError, not a failed status). UNAVAILABLE at once while the breaker is
  // open; DEADLINE_EXCEEDED when the deadline passes first; UNAVAILABLE (or
  // UNAUTHENTICATED for a refused AUTH) on a transport failure, naming the node.
  absl::StatusOr<std::vector<RedisReply>> Run(const std::vector<RedisArgv>& commands,
                                              absl::Time deadline);
  // Whether commands are being refused at `now`, a time of options.clock (the breaker is
  // open and its period not over).
  bool BreakerOpen(absl::Time now) const;
  // False from a transport failure until the next success.
  bool healthy() const;
  std::string last_error() const;

 private:
  absl::Status Connect(absl::Time deadline);  // REQUIRES: busy_ claimed
  absl::StatusOr<std::vector<RedisReply>> Exchange(const std::vector<RedisArgv>& commands,
                                                   absl::Time deadline);  // REQUIRES: busy_
  absl::Status TransportError(absl::string_view what, int saved_errno);   // closes ctx_
  void Close();
  absl::Status BreakerStatus(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RedisAddress address_;
  const RedisConnectOptions options_;
  RedisCounters* const counters_;

  mutable absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  int failures_ ABSL_GUARDED_BY(mu_) = 0;  // consecutive transport failures
  absl::Time open_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  // Used only by the caller holding busy_:
  redisContext* ctx_ = nullptr;
  bool transport_failed_ = false;  // the last Exchange closed the connection
};

}  // namespace kvarena

#endif  // KVARENA_TIERS_REDIS_REDIS_NODE_H_
