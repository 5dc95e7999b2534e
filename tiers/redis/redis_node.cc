#include "tiers/redis/redis_node.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvarena {
namespace {

// hiredis 0.14 writes with write(2): a peer that closed the socket would raise SIGPIPE and
// kill the process. The signal is blocked around each exchange and a pending one dropped.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      const timespec zero{};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

timeval TimeoutOf(absl::Duration d) {
  d = std::max(d, absl::Milliseconds(1));
  return absl::ToTimeval(d);
}

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};

// A deep copy; INTERNAL for a reply type this client does not know.
absl::StatusOr<RedisReply> CopyReply(const redisReply* r, int depth) {
  if (r == nullptr || depth > 8) return absl::InternalError("malformed reply");
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_NIL:
      out.type = RedisReply::Type::kNil;
      return out;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      return out;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      out.type = r->type == REDIS_REPLY_STRING   ? RedisReply::Type::kString
                 : r->type == REDIS_REPLY_STATUS ? RedisReply::Type::kStatus
                                                 : RedisReply::Type::kError;
      if (r->len > 0 && r->str == nullptr) {
        return absl::InternalError("malformed string reply");
      }
      out.str.assign(r->str, size_t(r->len));
      return out;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      if (r->elements > 0 && r->element == nullptr) {
        return absl::InternalError("malformed array reply");
      }
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) {
        KVARENA_ASSIGN_OR_RETURN(RedisReply e, CopyReply(r->element[i], depth + 1));
        out.elements.push_back(std::move(e));
      }
      return out;
    default:
      return absl::InternalError(absl::StrCat("reply of unknown type ", r->type));
  }
}

}  // namespace

RedisNode::RedisNode(RedisAddress address, const RedisConnectOptions& options,
                     RedisCounters* counters)
    : address_(std::move(address)), options_(options), counters_(counters) {}

RedisNode::~RedisNode() { Close(); }

void RedisNode::Close() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

absl::Status RedisNode::BreakerStatus(absl::Time now) const {
  if (failures_ == 0 || now >= open_until_) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("redis node ", address_.ToString(), ": circuit breaker open for another ",
                   absl::FormatDuration(absl::Trunc(open_until_ - now, absl::Milliseconds(1))),
                   " after: ", last_error_));
}

bool RedisNode::BreakerOpen(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return !BreakerStatus(now).ok();
}

bool RedisNode::healthy() const {
  absl::MutexLock lock(&mu_);
  return failures_ == 0;
}

std::string RedisNode::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

absl::StatusOr<std::vector<RedisReply>> RedisNode::Run(const std::vector<RedisArgv>& commands,
                                                       absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    // The breaker's time is options_.clock's; the deadline is the system clock's.
    absl::Status breaker = BreakerStatus(options_.clock->Now());
    const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; };
    if (breaker.ok() && !mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("redis node ", address_.ToString(),
                                                      ": connection still busy at the deadline"));
    }
    if (breaker.ok()) breaker = BreakerStatus(options_.clock->Now());  // failed while we waited
    if (!breaker.ok()) {
      RedisCounters::Add(counters_->breaker_skips);
      return breaker;
    }
    busy_ = true;
  }
  transport_failed_ = false;
  absl::StatusOr<std::vector<RedisReply>> replies = Exchange(commands, deadline);
  absl::MutexLock lock(&mu_);
  busy_ = false;
  if (replies.ok()) {
    failures_ = 0;
  } else if (transport_failed_) {
    failures_ = std::min(failures_ + 1, 4);
    open_until_ = options_.clock->Now() + options_.breaker_period * (1 << (failures_ - 1));
    last_error_ = std::string(replies.status().message());
    RedisCounters::Add(counters_->breaker_opens);
  }
  return replies;
}

absl::Status RedisNode::TransportError(absl::string_view what, int saved_errno) {
  const std::string detail = ctx_ == nullptr  ? "out of memory"
                             : ctx_->err != 0 ? ctx_->errstr
                                              : "connection closed";
  Close();
  transport_failed_ = true;
  const bool timeout = saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
                       saved_errno == ETIMEDOUT || absl::StrContains(detail, "timed out") ||
                       absl::StrContains(detail, "temporarily unavailable");
  RedisCounters::Add(counters_->errors);
  if (timeout) RedisCounters::Add(counters_->timeouts);
  const std::string message =
      absl::StrCat("redis node ", address_.ToString(), ": ", what, ": ", detail);
  return timeout ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
}

// Connect and Exchange bound socket waits: real time (absl::Now), never options_.clock.
absl::Status RedisNode::Connect(absl::Time deadline) {
  const timeval tv = TimeoutOf(std::min(options_.connect_timeout, deadline - absl::Now()));
  ctx_ = redisConnectWithTimeout(address_.host.c_str(), address_.port, tv);
  if (ctx_ == nullptr || ctx_->err != 0) return TransportError("connect", errno);
  if (options_.password.empty()) return absl::OkStatus();
  RedisArgv auth = {"AUTH"};
  if (!options_.user.empty()) auth.push_back(options_.user);
  auth.push_back(options_.password);
  const std::vector<RedisArgv> commands = {std::move(auth)};
  KVARENA_ASSIGN_OR_RETURN(std::vector<RedisReply> reply, Exchange(commands, deadline));
  if (reply[0].type != RedisReply::Type::kStatus || reply[0].str != "OK") {
    Close();
    transport_failed_ = true;
    RedisCounters::Add(counters_->errors);
    return absl::UnauthenticatedError(
        absl::StrCat("redis node ", address_.ToString(), ": AUTH",
                     options_.user.empty() ? "" : absl::StrCat(" as user \"", options_.user, "\""),
                     " refused: ", reply[0].str));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RedisReply>> RedisNode::Exchange(const std::vector<RedisArgv>& commands,
                                                            absl::Time deadline) {
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("redis node ", address_.ToString(), ": deadline passed before sending"));
  }
  if (ctx_ == nullptr) KVARENA_RETURN_IF_ERROR(Connect(deadline));
  ScopedSigpipeBlock no_sigpipe;
  const timeval tv = TimeoutOf(std::min(options_.command_timeout, deadline - absl::Now()));
  if (redisSetTimeout(ctx_, tv) != REDIS_OK) return TransportError("set timeout", errno);
  for (const RedisArgv& argv : commands) {
    std::vector<const char*> args;
    std::vector<size_t> lengths;
    for (const std::string& a : argv) {
      args.push_back(a.data());
      lengths.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx_, int(args.size()), args.data(), lengths.data()) != REDIS_OK) {
      return TransportError("write", errno);
    }
  }
  std::vector<RedisReply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    errno = 0;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      return TransportError("read", errno);
    }
    std::unique_ptr<redisReply, ReplyFree> reply(static_cast<redisReply*>(raw));
    absl::StatusOr<RedisReply> copy = CopyReply(reply.get(), 0);
    if (!copy.ok()) return TransportError(copy.status().message(), 0);
    replies.push_back(*std::move(copy));
  }
  return replies;
}

}  // namespace kvarena
