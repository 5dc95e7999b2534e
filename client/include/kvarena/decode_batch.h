// DecodeBatch: a decode step of many caches on the local path, one kernel call per layer.
//
// The plan/run split of FlashInfer's batch wrappers: Plan() once per step makes room for
// the step's tokens (one Reserve RPC for the batch, only at page boundaries) and brings the
// batch's block tables up to date; Run(layer, ...) then appends every sequence's new K/V
// and attends the whole batch in one call per layer; Commit() advances every cache (one
// Commit RPC). A decode step of B caches and L layers costs L kernel calls, not B * L, and
// the CPU kernels spread the batch's work over their threads.
//
//   auto batch = DecodeBatch::Create(handles);          // caches of one Client and one pool
//   for (each step) {
//     batch->Plan();                                    // positions() is where tokens land
//     for (int l = 0; l < layers; ++l) batch->Run(l, q[l], k[l], v[l], out[l]);
//     batch->Commit();
//   }
//
// Tensors are [batch, heads, tokens_per_step, head_dim] row-major in the caches' dtype:
// sequence b is row b, in the order the handles were given. k and v have num_kv_heads
// heads, q and out a multiple of it (GQA). Out is the caller's memory (no allocation per
// call); it is written only when Run succeeds.
//
// Block tables. The batch keeps, per layer, a table of [batch][max_blocks()] page ids
// (vLLM's block_tables, pad -1): row b holds the pages of sequence b's positions
// [first_block * page_size, position(b) + tokens_per_step). Plan updates it in place from
// the handles' own tables (kv_cache_handle.h local_table): only page ids that changed are
// written (stats()), so a step that crosses no page boundary writes none. The table's address stays
// the same from step to step unless a sequence outgrows max_blocks(): set options.max_blocks to fix
// it.
//
// Rules, each checked (FAILED_PRECONDITION naming the cache and the numbers):
//   - Run and Append only between Plan and Commit, each layer at most once per step;
//     Commit only once every layer ran;
//   - no other writes to these caches between Plan and Commit (append_local, served
//     writes, popn, reset, release through any handle): Run refuses a cache that changed
//     since Plan, and Plan refuses one with uncommitted local writes.
// A failed Run writes nothing. To abandon a step after some layers ran, drop the caches'
// uncommitted writes as for append_local (handle->popn, reset), then Plan again.
//
// Memory: on a host pool the CPU kernels run the batch (PagedAttentionBatch). On a CUDA
// pool the tensors are host tensors and each sequence is staged and run on its own, as
// attention_local does (the single-launch device-tensor path has not been built yet).
//
// Thread-safety: not thread-safe (one DecodeBatch per decode loop thread); the handles stay
// usable by other threads for other caches.
#ifndef KVARENA_CLIENT_INCLUDE_KVARENA_DECODE_BATCH_H_
#define KVARENA_CLIENT_INCLUDE_KVARENA_DECODE_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvarena/kv_cache_handle.h"

namespace kvarena {

struct DecodeBatchOptions {
  // Tokens every sequence appends per step: 1 for decode, more to verify speculated tokens.
  int64_t tokens_per_step = 1;
  // Width of the per-layer block tables. 0: grows (doubling) as sequences need; a fixed
  // width keeps every table's address for the batch's lifetime (RESOURCE_EXHAUSTED from
  // Plan when a sequence would need more pages).
  int64_t max_blocks = 0;
};

// Where Run writes attention's output: exactly q.bytes of writable caller memory. The
// client checks the size and refuses null (INVALID_ARGUMENT); a raw pointer does not say
// whether its pages are writable, so read-only memory (a PROT_READ mapping) faults in the
// kernel, after k and v were appended. The Python binding refuses read-only buffers.
struct TensorBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

struct DecodeBatchStats {
  int64_t steps = 0;              // Plans that succeeded
  int64_t ids_written = 0;        // page ids Plan wrote into the block tables, all layers
  int64_t sequences_rebuilt = 0;  // (sequence, layer) tables rewritten from their start: the
                                  // first Plan, a window eviction, a reload after popn / reset
  int64_t tables_moved = 0;       // times the tables were reallocated (max_blocks grew)
};

class DecodeBatch {
 public:
  // Caches of one Client and one pool (same dtype, page_size, heads, head_dim), the same
  // num_layers and layer_windows, each listed once, none a with_sequence_length view.
  // INVALID_ARGUMENT otherwise, naming the cache and the field. Maps the pool (the local
  // path needs it: inproc:, or a unix: client).
  static absl::StatusOr<std::unique_ptr<DecodeBatch>> Create(
      std::vector<std::shared_ptr<GenericKvCacheHandle>> caches,
      const DecodeBatchOptions& options = {});
  ~DecodeBatch();
  DecodeBatch(const DecodeBatch&) = delete;
  DecodeBatch& operator=(const DecodeBatch&) = delete;

  int batch_size() const;
  int64_t tokens_per_step() const;

  // Starts a step: reserves tokens_per_step() more positions on every cache (an RPC only
  // when some cache crosses a page boundary; RESOURCE_EXHAUSTED when they do not fit, and
  // then no table changed) and updates the block tables.
  absl::Status Plan();
  // Where sequence b's first new token lands this step (its length at Plan). REQUIRES: a
  // Plan succeeded, 0 <= b < batch_size().
  int64_t position(int b) const;

  // Writes k, v of every sequence at its position on `layer` and attends q over each
  // sequence's past and new tokens, causally, into out.
  absl::Status Run(int layer, const TensorArg& q, const TensorArg& k, const TensorArg& v,
                   const TensorBuffer& out, const AttentionOptions& opts = {});
  // Run without attention (a layer whose attention the caller runs itself, over
  // block_tables()).
  absl::Status Append(int layer, const TensorArg& k, const TensorArg& v);
  // Ends the step: commits tokens_per_step() on every cache in one Commit RPC.
  absl::Status Commit();

  // The layer's block tables as of the last Plan: [batch_size()][max_blocks()] page ids,
  // row b's entry i holding positions [(first_block(l, b) + i) * page_size, + page_size)
  // of sequence b; unused entries -1. Valid until the next Plan moves them.
  const int32_t* block_tables(int layer) const;
  int64_t max_blocks() const;
  int64_t first_block(int layer, int b) const;

  DecodeBatchStats stats() const;

 private:
  struct Impl;
  explicit DecodeBatch(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvarena

#endif  // KVARENA_CLIENT_INCLUDE_KVARENA_DECODE_BATCH_H_
