// DecodeBatch::Impl (kvarena/decode_batch.h): the state of a batch, shared by
// decode_batch.cc (Create, Plan, Run, Commit) and decode_batch_tables.cc (the batch's own
// block tables, kept in step with the handles' local tables). Internal to the client;
// guarded as DecodeBatch is (one thread at a time).
#ifndef KVARENA_CLIENT_DECODE_BATCH_IMPL_H_
#define KVARENA_CLIENT_DECODE_BATCH_IMPL_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/cache_state.h"
#include "core/validate.h"
#include "kernels/kv_kernels.h"
#include "kvarena/decode_batch.h"

namespace kvarena {

struct DecodeBatch::Impl {
  // The batch's view of one layer this step.
  struct Layer {
    std::vector<int32_t> tables;       // [batch][width]
    std::vector<int64_t> first_block;  // per sequence; -1: row not written yet
    std::vector<int64_t> num_blocks;   // per sequence: entries of its row in use
    std::vector<int64_t> pos;          // per sequence: first new position this step
    std::vector<PagedKvView> views;    // per sequence, this step
    bool ran = false;
  };

  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
  std::vector<std::pair<GenericKvCacheHandle*, int64_t>> items;  // (cache, tokens_per_step)
  DecodeBatchOptions options;
  CacheSpec spec;  // of every cache
  PageLayout layout;
  uint8_t* base = nullptr;
  KvKernels* kernels = nullptr;
  RequestLimits limits;
  int64_t width = 0;  // block table entries per sequence
  std::vector<Layer> layers;
  std::vector<std::vector<int32_t>> snapshot;  // [batch * layers] page ids, reused
  std::vector<int64_t> snapshot_first;         // [batch * layers] first block
  std::vector<int64_t> snapshot_len;           // [batch * layers] committed length
  bool planned = false;
  DecodeBatchStats stats;

  int batch() const { return int(caches.size()); }
  client_internal::CacheState& state(int b) const { return *caches[size_t(b)]->state_; }

  absl::Status CheckNoPending(const char* op) const;
  absl::Status Snapshot(const char* op);
  void Resize(int64_t new_width);
  void UpdateTables();
  absl::Status CheckTensor(const char* op, const char* name, const TensorArg& t, int heads_lo,
                           int heads_hi) const;
  absl::Status CheckUnchanged(const char* op, int layer) const;
  absl::Status Write(const char* op, int layer, const TensorArg* q, const TensorArg& k,
                     const TensorArg& v, const TensorBuffer* out, const AttentionOptions& opts);
};

}  // namespace kvarena

#endif  // KVARENA_CLIENT_DECODE_BATCH_IMPL_H_
