// Transport: the internal seam between the public client API (Client,
// GenericKvCacheHandle) and where the KV arena lives — a kvarenad daemon reached over gRPC
// (RemoteTransport) or a KvStore inside this process (InprocTransport, address "inproc:").
// The methods mirror KvStore's operations minus the session argument: a transport carries
// its own session.
//
// Thread-safety: every method may be called concurrently.
#ifndef KVARENA_CLIENT_TRANSPORT_H_
#define KVARENA_CLIENT_TRANSPORT_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "arena/region.h"
#include "base/status_macros.h"
#include "client/fork_guard.h"
#include "client/local_kernels.h"
#include "core/types.h"
#include "kernels/kv_kernels.h"
#include "kvarena/client.h"

namespace kvarena::client_internal {

// A pool as mapped into this process: [num_pool_pages][2][page_size][num_kv_heads]
// [head_dim] at base, an address on CUDA device `device` (-1: host memory).
struct MappedPool {
  uint8_t* base = nullptr;
  RegionKind kind = RegionKind::kHostMemfd;
  int device = -1;
};

// How often a transport asked the arena for the local path's state (Reserve, Commit) and
// for whole descriptions (Describe): what a decode loop pays beyond its kernels.
struct CallCounters {
  std::atomic<int64_t> reserve{0};
  std::atomic<int64_t> commit{0};
  std::atomic<int64_t> describe{0};
};

// The most K+V bytes one GetKv asks for when get_kv pages a layer: far below any
// sensible --max_message_bytes, and large enough that the RPCs cost little per byte.
inline constexpr size_t kGetKvChunkBytes = size_t{4} << 20;

class Transport {
 public:
  // options.num_threads: the local path's CPU kernel threads (-1: one per core);
  // options.max_message_bytes bounds get_kv_chunk_bytes().
  explicit Transport(const ClientOptions& options)
      : local_kernels_(options.num_threads),
        get_kv_chunk_bytes_(std::min(kGetKvChunkBytes, options.max_message_bytes / 2)) {}
  virtual ~Transport() = default;

  virtual const std::string& address() const = 0;
  virtual std::string session_id() const = 0;
  virtual bool is_inproc() const = 0;
  // Where the arena's pages live: "cpu" for the host backend, "cuda:0" for a GPU.
  virtual std::string device() = 0;
  // False once the daemon is gone (the Attach stream broke; never flips back), and in a
  // fork() child of the process that connected (client/fork_guard.h).
  bool connected() const { return !fork_guard_.forked() && Connected(); }
  // Why connected() is false: FAILED_PRECONDITION in a fork() child, else an UNAVAILABLE
  // status naming the address; OK while connected.
  absl::Status DisconnectedStatus() const {
    return fork_guard_.forked() ? fork_guard_.ForkedStatus() : LostStatus();
  }
  // True in a fork() child of the process that made this transport: nothing of it may be
  // used or torn down there (DeleteTransport).
  bool forked() const { return fork_guard_.forked(); }
  // Times the session was resumed after its Attach stream broke (remote only).
  virtual int64_t resumes() const { return 0; }

  virtual absl::StatusOr<CacheInfo> Allocate(const CacheSpec& spec, const std::string& cache_id,
                                             const AllocateOptions& options) = 0;
  virtual absl::StatusOr<CacheInfo> SetTokens(const SetTokensArgs& args) = 0;
  virtual absl::StatusOr<CacheInfo> Fork(const std::string& cache_id,
                                         const std::string& new_cache_id) = 0;
  virtual absl::StatusOr<AppendResult> Append(const std::string& cache_id, int layer, int64_t pos,
                                              const TensorArg& k, const TensorArg& v) = 0;
  // On success *out holds the attention output (q's shape and dtype).
  virtual absl::StatusOr<AttendResult> Attend(const AttendArgs& args, TensorOut* out) = 0;
  virtual absl::StatusOr<PopnResult> Popn(const std::string& cache_id, int64_t n) = 0;
  virtual absl::StatusOr<CacheInfo> Reset(const std::string& cache_id, bool keep_pages) = 0;
  virtual absl::Status Release(const std::string& cache_id) = 0;
  // The range of the layer (core/types.h GetKvRange); RESOURCE_EXHAUSTED when its reply
  // would pass the arena's limit (a daemon's --max_message_bytes).
  virtual absl::StatusOr<GetKvResult> GetKv(const std::string& cache_id, int layer,
                                            const GetKvRange& range) = 0;
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

  // Pool `pool_id` as mapped into this process. Its pages stay mapped as the arena grows
  // the pool: a Reserve or Describe answer only names pages this process can reach.
  // FAILED_PRECONDITION where the pool is not mapped here.
  virtual absl::StatusOr<MappedPool> MapPool(uint64_t pool_id) = 0;
  absl::StatusOr<uint8_t*> PoolBase(uint64_t pool_id) {
    KVARENA_ASSIGN_OR_RETURN(MappedPool pool, MapPool(pool_id));
    return pool.base;
  }

  // The kernels the local path runs in this process over `pool` (client/local_kernels.h:
  // CPU kernels with num_threads threads for host memory, CUDA kernels for a device pool).
  absl::StatusOr<KvKernels*> LocalKernelsFor(const MappedPool& pool) {
    return local_kernels_.For(pool.kind, pool.device);
  }
  // Waits for every local kernel this client started (LocalKernels::SynchronizeAll).
  absl::Status SynchronizeLocalKernels() { return local_kernels_.SynchronizeAll(); }
  void TEST_WrapLocalKernels(LocalKernels::Wrapper wrap) {
    local_kernels_.TEST_Wrap(std::move(wrap));
  }
  CallCounters& counters() { return counters_; }
  // The K+V bytes one GetKv of get_kv's asks for at most: kGetKvChunkBytes, or half of
  // options.max_message_bytes when that is less (so every reply fits the channel).
  size_t get_kv_chunk_bytes() const { return get_kv_chunk_bytes_; }
  // Scratch lanes quarantined after calls that did not provably finish (scratch_lanes.h).
  virtual int TEST_QuarantinedLanes() const = 0;

 protected:
  // The arena is still reachable (never true again once false).
  virtual bool Connected() const = 0;
  // Why Connected() is false: UNAVAILABLE naming the address; OK while connected.
  virtual absl::Status LostStatus() const = 0;

 private:
  const ForkGuard fork_guard_;
  LocalKernels local_kernels_;
  CallCounters counters_;
  const size_t get_kv_chunk_bytes_;
};

// The deleter of every Transport's shared_ptr: deletes t, except in a fork() child of the
// process that made it, where t is leaked on purpose — its threads (the Attach stream's,
// the local kernels', an inproc store's) do not exist there to be joined, and closing its
// gRPC channel would shut down the connection the parent still uses.
inline void DeleteTransport(Transport* t) {
  if (t != nullptr && !t->forked()) delete t;
}

// "inproc:": a KvStore with the host backend, owned by the transport.
absl::StatusOr<std::shared_ptr<Transport>> NewInprocTransport(const ClientOptions& options);
// "unix:PATH" or "HOST:PORT": a channel to kvarenad plus, with options.attach, a session
// held open by an Attach stream.
absl::StatusOr<std::shared_ptr<Transport>> NewRemoteTransport(const std::string& address,
                                                              const ClientOptions& options);

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_TRANSPORT_H_
