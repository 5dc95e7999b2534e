// Transport: the internal seam between the public client API (Client,
// GenericKvCacheHandle) and where the KV arena lives — a kvarenad daemon reached over gRPC
// (RemoteTransport) or a KvStore inside this process (InprocTransport, address "inproc:").
// The methods mirror KvStore's operations minus the session argument: a transport carries
// its own session.
//
// Thread-safety: every method may be called concurrently.
#ifndef KVARENA_CLIENT_TRANSPORT_H_
#define KVARENA_CLIENT_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/types.h"
#include "kernels/kv_kernels.h"
#include "kvarena/client.h"

namespace kvarena::client_internal {

// How often a transport asked the arena for the local path's state (Reserve, Commit) and
// for whole descriptions (Describe): what a decode loop pays beyond its kernels.
struct CallCounters {
  std::atomic<int64_t> reserve{0};
  std::atomic<int64_t> commit{0};
  std::atomic<int64_t> describe{0};
};

class Transport {
 public:
  // num_threads: the local path's CPU kernel threads (-1: one per core).
  explicit Transport(int num_threads) : num_threads_(num_threads) {}
  virtual ~Transport() = default;

  virtual const std::string& address() const = 0;
  virtual std::string session_id() const = 0;
  virtual bool is_inproc() const = 0;
  // Where the arena's pages live: "cpu" for the host backend, "cuda:0" for a GPU.
  virtual std::string device() = 0;
  // False once the daemon is gone (the Attach stream broke); never flips back.
  virtual bool connected() const = 0;
  // Why connected() is false: an UNAVAILABLE status naming the address; OK while connected.
  virtual absl::Status DisconnectedStatus() const = 0;

  virtual absl::StatusOr<CacheInfo> Allocate(const CacheSpec& spec,
                                             const std::string& cache_id) = 0;
  virtual absl::StatusOr<AppendResult> Append(const std::string& cache_id, int layer,
                                              int64_t pos, const TensorArg& k,
                                              const TensorArg& v) = 0;
  // On success *out holds the attention output (q's shape and dtype).
  virtual absl::StatusOr<AttendResult> Attend(const AttendArgs& args, TensorOut* out) = 0;
  virtual absl::StatusOr<PopnResult> Popn(const std::string& cache_id, int64_t n) = 0;
  virtual absl::StatusOr<CacheInfo> Reset(const std::string& cache_id, bool keep_pages) = 0;
  virtual absl::Status Release(const std::string& cache_id) = 0;
  virtual absl::StatusOr<GetKvResult> GetKv(const std::string& cache_id, int layer) = 0;
  virtual absl::StatusOr<CacheDescription> Describe(const std::string& cache_id) = 0;
  // The local path: pages for the next tokens of every listed cache (all or nothing), and
  // the commit of tokens written through the mapping.
  virtual absl::StatusOr<std::vector<ReserveResult>> Reserve(
      const std::vector<CacheTokens>& items) = 0;
  virtual absl::StatusOr<std::vector<CacheInfo>> Commit(const std::vector<CacheTokens>& items) = 0;
  virtual absl::StatusOr<ArenaStats> Stats() = 0;
  virtual absl::StatusOr<PageStats> CacheStats(const std::string& cache_id) = 0;
  virtual absl::StatusOr<std::vector<CacheInfo>> ListCaches() = 0;
  virtual absl::StatusOr<ServingStatus> Health(const std::string& service) = 0;
  virtual absl::Status Ping() = 0;

  // Base of pool `pool_id` as mapped into this process: [num_pool_pages][2][page_size]
  // [num_kv_heads][head_dim]. FAILED_PRECONDITION where the pool is not mapped here.
  virtual absl::StatusOr<uint8_t*> PoolBase(uint64_t pool_id) = 0;

  // The kernels the local path runs in this process over the mapped pool (the CPU kernels
  // with num_threads threads, created on first use).
  KvKernels* LocalKernels() {
    absl::call_once(kernels_once_, [this] { kernels_ = NewCpuKvKernels(num_threads_); });
    return kernels_.get();
  }
  CallCounters& counters() { return counters_; }

 private:
  const int num_threads_;
  absl::once_flag kernels_once_;
  std::unique_ptr<KvKernels> kernels_;
  CallCounters counters_;
};

// "inproc:": a KvStore with the host backend, owned by the transport.
absl::StatusOr<std::shared_ptr<Transport>> NewInprocTransport(const ClientOptions& options);
// "unix:PATH" or "HOST:PORT": a channel to kvarenad plus, with options.attach, a session
// held open by an Attach stream.
absl::StatusOr<std::shared_ptr<Transport>> NewRemoteTransport(const std::string& address,
                                                              const ClientOptions& options);

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_TRANSPORT_H_
