// InprocTransport: the "inproc:" address — a KvStore with the host backend inside this
// process, one session opened at connect. The pools are in this address space, so
// MapPool returns real pointers: handles give key_cache/value_cache views and run the
// local path (Reserve / attention_local / Commit) exactly as over a mapped daemon pool.
#include <utility>

#include "absl/strings/str_cat.h"
#include "arena/region.h"
#include "base/status_macros.h"
#include "client/transport.h"
#include "core/kv_store.h"

namespace kvarena::client_internal {
namespace {

class InprocTransport final : public Transport {
 public:
  InprocTransport(std::unique_ptr<KvStore> store, std::string session, const ClientOptions& options)
      : Transport(options), store_(std::move(store)), session_(std::move(session)) {}

  const std::string& address() const override { return address_; }
  std::string session_id() const override { return session_; }
  bool is_inproc() const override { return true; }
  std::string device() override { return store_->Medium(); }

  absl::StatusOr<CacheInfo> Allocate(const CacheSpec& spec, const std::string& cache_id,
                                     const AllocateOptions& options) override {
    return store_->Allocate(session_, spec, cache_id, options);
  }
  absl::StatusOr<CacheInfo> SetTokens(const SetTokensArgs& args) override {
    return store_->SetTokens(session_, args);
  }
  absl::StatusOr<CacheInfo> Fork(const std::string& cache_id,
                                 const std::string& new_cache_id) override {
    return store_->Fork(session_, cache_id, new_cache_id);
  }
  absl::StatusOr<AppendResult> Append(const std::string& cache_id, int layer, int64_t pos,
                                      const TensorArg& k, const TensorArg& v) override {
    return store_->Append(session_, cache_id, layer, pos, k, v);
  }
  absl::StatusOr<AttendResult> Attend(const AttendArgs& args, TensorOut* out) override {
    out->dtype = args.q.dtype;
    out->shape = args.q.shape;
    out->data.resize(args.q.bytes);
    return store_->Attend(session_, args, out->data.data(), out->data.size());
  }
  absl::StatusOr<PopnResult> Popn(const std::string& cache_id, int64_t n) override {
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("popn: n=", n, " is negative"));
    return store_->Popn(session_, cache_id, uint64_t(n));
  }
  absl::StatusOr<CacheInfo> Reset(const std::string& cache_id, bool keep_pages) override {
    return store_->Reset(session_, cache_id, keep_pages);
  }
  absl::Status Release(const std::string& cache_id) override {
    return store_->Release(session_, cache_id);
  }
  absl::StatusOr<GetKvResult> GetKv(const std::string& cache_id, int layer,
                                    const GetKvRange& range) override {
    return store_->GetKv(session_, cache_id, layer, range);
  }
  absl::StatusOr<CacheDescription> Describe(const std::string& cache_id) override {
    ++counters().describe;
    return store_->Describe(session_, cache_id);
  }
  absl::StatusOr<std::vector<ReserveResult>> Reserve(
      const std::vector<CacheTokens>& items) override {
    ++counters().reserve;
    return store_->Reserve(session_, items);
  }
  absl::StatusOr<std::vector<CacheInfo>> Commit(const std::vector<CacheTokens>& items) override {
    ++counters().commit;
    return store_->Commit(session_, items);
  }
  absl::StatusOr<ArenaStats> Stats() override { return store_->Stats(); }
  absl::StatusOr<PageStats> CacheStats(const std::string& cache_id) override {
    return store_->CacheStats(cache_id);
  }
  absl::StatusOr<std::vector<CacheInfo>> ListCaches() override { return store_->ListCaches(); }
  absl::StatusOr<ServingStatus> Health(const std::string&) override {
    return ServingStatus::kServing;
  }
  absl::Status Ping() override { return absl::OkStatus(); }

  absl::StatusOr<MappedPool> MapPool(uint64_t pool_id) override {
    KVARENA_ASSIGN_OR_RETURN(uint8_t * base, store_->PoolBase(pool_id));
    return MappedPool{base, RegionKind::kHostMemfd, -1};  // the store's backend is NewHostBackend()
  }

  int TEST_QuarantinedLanes() const override { return 0; }  // tensors never leave the process

 protected:
  bool Connected() const override { return true; }
  absl::Status LostStatus() const override { return absl::OkStatus(); }

 private:
  const std::string address_ = kInprocAddress;
  std::unique_ptr<KvStore> store_;
  const std::string session_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Transport>> NewInprocTransport(const ClientOptions& options) {
  StoreOptions so;
  so.arena_bytes = options.arena_bytes;
  so.default_page_size = options.page_size;
  so.num_threads = options.num_threads;
  so.max_reply_bytes = options.max_message_bytes;  // as a daemon with --max_message_bytes
  auto store = KvStore::Create(so, NewHostBackend());
  KVARENA_RETURN_IF_ERROR(store.status());
  std::string session;
  if (options.attach) {
    KVARENA_ASSIGN_OR_RETURN(std::string s, (*store)->OpenSession(options.client_name));
    session = std::move(s);
  }
  return std::shared_ptr<Transport>(
      new InprocTransport(*std::move(store), std::move(session), options), DeleteTransport);
}

}  // namespace kvarena::client_internal
