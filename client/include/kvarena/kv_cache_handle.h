// GenericKvCacheHandle: a worker's reference to one paged KV cache in the arena
// (DESIGN.md §6). Geometry accessors answer from the handle; num_tokens() and is_valid()
// answer from what the handle knows (no RPC); block_table, views, stats and the
// operations ask the arena. Every accessor returns real values: a view the handle cannot
// give (a client over TCP has no mapping of the pool) is an error, never a fake.
//
// Two data paths (DESIGN.md "Two data paths, one arena"):
//   served: append / attention — the arena writes K/V and attends (an RPC per call);
//   local:  reserve -> append_local / attention_local per layer -> commit — the arena only
//           allocates; this process writes K/V into the reserved pages through its mapping
//           of the pool and runs attention itself. The handle keeps its own block table
//           from Reserve and Commit replies, so a decode step costs one Commit RPC, plus
//           one Reserve RPC per page boundary (per batch, with Client::Reserve/Commit).
// Both paths change the same cache: stats, popn, get_kv and the views see local writes
// once committed. popn and reset discard uncommitted local writes.
//
// Page lifetime. The arena may hand a page to another cache (of any process) as soon as a
// call frees it: popn, reset, release, commit (a sliding window evicts pages as tokens
// advance), append / attention on a cache with a sliding layer (the same eviction), and
// Client::Commit / Client::Release. Pages freed by these calls are not handed to anyone
// else until the local kernels this client ran on them (append_local, attention_local,
// get_kv_local, on any handle of the client) are done: before the RPC, each of these calls
// waits for every local kernel set the client created (KvKernels::Synchronize; at once
// for the synchronous CPU kernels, and when no local kernel ran yet). If that wait fails,
// the call returns its error and sends nothing. A cache with no sliding layer frees
// nothing on commit, append or attention, so those do not wait (a decode step's Commit
// stays one RPC) — unless it has a prefix namespace: then commit, set_tokens and fork wait
// too, since what they make full and known other caches may adopt and read. Kernels the
// caller launched itself over views or block tables from this handle are the caller's to
// finish before these calls.
//
// Handles are references, not owners: dropping one leaves the cache allocated;
// release() frees it (and invalidates every clone); a session's caches are also freed when
// its client goes away. clone_handle() and with_sequence_length() return new references
// to the same cache that share its state with the original.
//
// Tensors are row-major [1, heads, tokens, head_dim] in the cache's dtype: k and v have
// num_kv_heads heads, q (and attention's output) a multiple of it (GQA).
//
// Thread-safety: safe for concurrent use; calls on one cache are serialised by the arena.
// append(layer, k, v) takes its position from the layer length this handle last saw, so
// two threads appending to one layer at once race (the arena rejects the loser). Local
// writes to one layer must not overlap in time (different layers may run in parallel).
// The local table is shared by a handle and its clones; another handle to the same cache
// (OpenCache) has its own and must refresh() after this one changed the cache.
#ifndef KVARENA_CLIENT_INCLUDE_KVARENA_KV_CACHE_HANDLE_H_
#define KVARENA_CLIENT_INCLUDE_KVARENA_KV_CACHE_HANDLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvarena/paged_kv.h"
#include "kvarena/types.h"

namespace kvarena {

class KvKernels;
class DecodeBatch;

namespace client_internal {
class Transport;
struct CacheState;
struct PageTableAccess;
}  // namespace client_internal

struct AttentionOptions {
  double scale = 0;     // 0: 1/sqrt(head_dim)
  uint32_t window = 0;  // 0: the layer's own window; w: also mask keys older than (p-w, p]
};

// A view of one layer's pages in the mapped pool: no copy. Token t (absolute position,
// first_pos <= t < len) of page_ids[t / page_size - first_pos / page_size], slot
// t % page_size, holds K then V as [2][page_size][num_kv_heads][head_dim] per page.
// page_ids/first_pos/len are a snapshot taken at the call: fetch a new ref after appends,
// popn or window evictions. pool_base stays valid while any handle of the client lives.
// On a CUDA pool (device() "cuda:N") pool_base is a device address, for kernels on that
// device: TokenPtr then gives device pointers too; read through get_kv_local on the host.
struct KvCacheRef {
  enum class Part : uint8_t { kKeyValue, kKey, kValue };
  Part part = Part::kKeyValue;
  uint8_t* pool_base = nullptr;  // [num_pool_pages][2][page_size][num_kv_heads][head_dim]
  PageLayout layout;
  std::vector<int32_t> page_ids;  // the layer's block table
  int64_t first_pos = 0;          // absolute position of slot 0 of page_ids[0]
  int64_t len = 0;                // tokens written (absolute); readable: [first_pos, len)
  // fp8_e4m3 (static scales): this layer's K and V scales, [num_kv_heads] each (a stored
  // value times its head's scale is the value); empty for other formats.
  std::vector<float> k_scales;
  std::vector<float> v_scales;

  // K (kv = 0) or V (kv = 1) of token t, all heads: [num_kv_heads][head_dim].
  // REQUIRES: first_pos <= t < len.
  uint8_t* TokenPtr(int kv, int64_t t) const;
  // The part this ref names (kKey or kValue; kKeyValue reads K).
  uint8_t* TokenPtr(int64_t t) const;
  // The kernels' view (borrows page_ids: keep this ref alive while it is used).
  PagedKvView view() const;
};

// One layer's block table as this handle knows it (local_table): what Reserve and Commit
// replies and this process's local writes made it, no RPC (kvarena/types.h: LayerPages).
using LocalLayerTable = LayerPages;

// How a kernel addresses the mapped pool (pool_view): one array
//   [num_pool_pages][2][page_size][num_kv_heads][head_dim]   (NHD, K then V in each page)
// — FlashInfer's single-tensor NHD paged_kv_cache (max_num_pages, 2, page_size,
// num_kv_heads, head_dim). Split into a K and a V cache, each is a strided
// [num_pool_pages][page_size][num_kv_heads][head_dim] array with the strides below, as
// FlashInfer's paged_kv_t (stride_page, stride_n, stride_h) and vLLM's NHD kernels
// (reshape_and_cache_flash, flash-attention with a block table: key_cache.stride(0..2))
// take them. Not vLLM's legacy paged_attention_v1/v2 layout (keys split in x-wide chunks).
// On a CUDA pool base is a device address on CUDA device `device`.
struct KvPoolView {
  uint8_t* base = nullptr;  // [num_pool_pages][2][page_size][num_kv_heads][head_dim]
  PageLayout layout;
  int device = -1;  // the CUDA ordinal for a device pool; -1: host memory

  uint8_t* k_cache() const { return base; }
  uint8_t* v_cache() const { return base + size_t(layout.page_size) * layout.TokenBytes(); }
  // Strides in stored elements, the same for K and V (times layout.ElemBytes() for bytes).
  // A token's row is num_kv_heads * head_dim values, plus its scales in a format that has
  // them per token (kvarena/paged_kv.h), which token_stride counts in.
  int64_t page_stride() const { return 2 * int64_t(layout.page_size) * token_stride(); }
  int64_t token_stride() const { return int64_t(layout.TokenBytes() / layout.ElemBytes()); }
  int64_t head_stride() const { return layout.head_dim; }
  // K (kv = 0) or V (kv = 1) of a slot (page_id * page_size + offset, what slot_mapping
  // holds): [num_kv_heads][head_dim]. REQUIRES: slot >= 0.
  uint8_t* SlotPtr(int kv, int64_t slot) const {
    const int64_t page = slot / layout.page_size, offset = slot % layout.page_size;
    return (kv == 0 ? k_cache() : v_cache()) +
           size_t(page * page_stride() + offset * token_stride()) * layout.ElemBytes();
  }
  // A format with per-token scales (int8): the slot's float32 scales, [num_kv_heads], after
  // its values in the same row (4-byte aligned when num_kv_heads * head_dim is a multiple
  // of 4). nullptr for a format without them.
  uint8_t* ScalePtr(int kv, int64_t slot) const {
    return layout.ScaleBytes() == 0 ? nullptr : SlotPtr(kv, slot) + layout.ValueBytes();
  }
};

class GenericKvCacheHandle {
 public:
  ~GenericKvCacheHandle();
  GenericKvCacheHandle(const GenericKvCacheHandle&) = delete;
  GenericKvCacheHandle& operator=(const GenericKvCacheHandle&) = delete;

  // --- geometry (fixed at Allocate) ---
  const std::string& cache_id() const { return info_.cache_id; }
  int num_layers() const { return info_.spec.num_layers; }
  int num_heads() const { return info_.spec.num_kv_heads; }  // kv heads
  int num_kv_heads() const { return info_.spec.num_kv_heads; }
  int head_dim() const { return info_.spec.head_dim; }
  DType dtype() const { return info_.spec.dtype; }
  int page_size() const { return info_.spec.page_size; }
  const std::vector<int>& layer_windows() const { return info_.spec.layer_windows; }
  int64_t max_tokens() const { return info_.spec.max_tokens; }
  // fp8_e4m3's static scales, [num_layers][num_kv_heads] float32 each (empty otherwise):
  // what vLLM's and FlashInfer's fp8 kernels take beside the pool (value = code x scale).
  const std::vector<float>& k_scales() const { return info_.spec.k_scales; }
  const std::vector<float>& v_scales() const { return info_.spec.v_scales; }
  uint64_t pool_id() const { return info_.pool_id; }
  PageLayout layout() const;
  // Where the pages live: "cpu" for the host backend, "cuda:0" for the CUDA backend.
  std::string device() const;

  // --- state ---
  // Tokens in the cache as this handle last saw them (narrowed by with_sequence_length).
  int64_t num_tokens() const;
  int64_t seq_len() const { return num_tokens(); }
  // Length of one layer as last seen (-1 for a bad layer).
  int64_t layer_len(int layer) const;
  // False once released (through any clone), once the arena reported the cache gone, or
  // once the client is disconnected. No RPC.
  bool is_valid() const;
  // Re-reads the lengths from the arena (Describe).
  absl::Status refresh();

  // --- pages ---
  absl::StatusOr<std::vector<int32_t>> block_table(int layer) const;
  absl::StatusOr<CacheDescription> describe() const;
  // Views into the mapped pool (inproc:, and remote clients over a unix: address; over TCP
  // FAILED_PRECONDITION, naming get_kv as the way to read).
  absl::StatusOr<KvCacheRef> key_cache(int layer) const;
  absl::StatusOr<KvCacheRef> value_cache(int layer) const;
  absl::StatusOr<KvCacheRef> kv_cache(int layer) const;
  absl::StatusOr<PageStats> stats() const;
  absl::StatusOr<PageStats> page_stats() const { return stats(); }
  absl::StatusOr<int64_t> pages_used() const;

  // --- kernel-ready metadata (kvarena/page_tables.h builds batch arrays from these) ---
  // The layer's block table as this handle knows it, with this process's uncommitted local
  // writes: no RPC while the table is current (Allocate, reserve, commit and every Describe
  // keep it so); one Describe reloads it first after popn, reset, served-path writes, or on
  // a handle that never loaded it (a fork). Needs no mapping (any transport). On a
  // with_sequence_length view: narrowed to its n tokens (len and written at most n, pages
  // past n left out).
  absl::StatusOr<LocalLayerTable> local_table(int layer) const;
  // The pool as mapped in this process, for the caller's own kernels (inproc:, or a unix:
  // client; over TCP FAILED_PRECONDITION). No RPC once the pool is mapped.
  absl::StatusOr<KvPoolView> pool_view() const;

  // --- references ---
  std::shared_ptr<GenericKvCacheHandle> clone_handle() const;
  // A clone whose num_tokens() is n and whose views stop at n. INVALID_ARGUMENT if
  // n < 0 or n > num_tokens().
  absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> with_sequence_length(int64_t n) const;

  // --- operations ---
  // Dense append of k, v ([1, kv_heads, n, head_dim]) at the layer's end / at pos.
  absl::StatusOr<AppendResult> append(int layer, const TensorArg& k, const TensorArg& v);
  absl::StatusOr<AppendResult> append(int layer, int64_t pos, const TensorArg& k,
                                      const TensorArg& v);
  // Appends k, v at the layer's end, then attends q (same n tokens) over past + new,
  // causally. Returns the output, q's shape and dtype.
  absl::StatusOr<TensorOut> attention(int layer, const TensorArg& q, const TensorArg& k,
                                      const TensorArg& v, double scale = 0);
  absl::StatusOr<TensorOut> attention_opts(int layer, const TensorArg& q, const TensorArg& k,
                                           const TensorArg& v, const AttentionOptions& opts);
  // Attends q at positions [pos, pos + n) over what is cached (pos + n <= layer length).
  absl::StatusOr<TensorOut> attention(int layer, int64_t pos, const TensorArg& q,
                                      const AttentionOptions& opts = {});
  // Rolls back the last n tokens on every layer, all or nothing: popped is n or 0 (then
  // refusal says why and nothing changed).
  absl::StatusOr<PopnResult> popn(int64_t n);
  // Drops every token; keep_pages keeps the pages reserved for this cache.
  absl::Status reset(bool keep_pages = false);
  // Frees the cache; this handle and every clone become invalid.
  absl::Status release();
  // The layer's K/V as contiguous [1, kv_heads, tokens, head_dim] from first_pos, to the
  // layer's length when the call began. Paged: one GetKv per chunk of at most
  // min(4 MiB, max_message_bytes / 2) of K+V (at least one token), concatenated per head,
  // so a layer of any size passes the daemon's --max_message_bytes. ABORTED when the
  // layer lost tokens between chunks (popn, reset, window eviction by another thread);
  // a rewrite that leaves the lengths as they were (popn then append) goes unseen, so
  // serialise get_kv with such writers. raw: a quantized cache's codes and scales as its
  // pages store them (GetKvResult; chunks count their bytes), values otherwise.
  absl::StatusOr<GetKvResult> get_kv(int layer, bool raw = false) const;
  // get_kv read through this process's mapping of the pool with the local kernels
  // (the K/V bytes never cross the RPC; one Describe for the pages). Needs the pool
  // mapped, like the local path; sees committed tokens, as get_kv does.
  absl::StatusOr<GetKvResult> get_kv_local(int layer, bool raw = false) const;

  // --- prefix reuse (docs/prefix-reuse.md; needs spec.prefix_namespace to share) ---
  // Leading positions filled from other caches' pages (CacheInfo.cached_tokens): the
  // prefix adopted at Allocate, every position for a fork; as this handle last saw.
  int64_t cached_tokens() const;
  // Of cached_tokens, those loaded from the tiers below the arena (docs/tiers.md).
  int64_t tier_loaded_tokens() const;
  // Declares the token ids of positions [first_pos, first_pos + token_ids.size()) — the
  // tokens a worker generated — so that a later prompt containing them finds their pages
  // (SetTokens). first_pos at most what the arena knows (tokens_known); ids of written
  // positions cannot change (FAILED_PRECONDITION).
  absl::Status set_tokens(int64_t first_pos, const std::vector<int32_t>& token_ids);
  // A new cache (new_cache_id "" lets the arena pick) that shares every full page of this
  // one and holds a copy of each layer's partial last page (Fork): a beam or a branch.
  // The two diverge independently; a popn into a shared page copies it first.
  absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> fork(
      const std::string& new_cache_id = "") const;

  // --- local path (needs the pool mapped: inproc:, or a unix: client) ---
  // Makes sure every layer has pages for positions [num_tokens(), num_tokens() + tokens).
  // No RPC while the pages this handle holds cover them; else one Reserve RPC for at least
  // reserve_ahead() tokens, up to the next page boundary (and max_tokens). RESOURCE_EXHAUSTED
  // when even `tokens` do not fit.
  absl::Status reserve(int64_t tokens);
  // Tokens a Reserve RPC asks for at least (default page_size(): one RPC per page).
  int64_t reserve_ahead() const;
  void set_reserve_ahead(int64_t tokens);
  // Positions below this have a page on every layer, as this handle last saw.
  int64_t reserved_until() const;
  // Writes k, v ([1, kv_heads, n, head_dim]) at the layer's next local position (its
  // committed length plus what was written locally since) into reserved pages.
  // FAILED_PRECONDITION when the pages are not reserved (call reserve first).
  absl::Status append_local(int layer, const TensorArg& k, const TensorArg& v);
  // append_local, then attends q (same n tokens) over past + new, causally, with this
  // process's kernels over the mapped pool: the CPU kernels for a host pool, the CUDA
  // kernels for a device pool (k/v/q/out stay host tensors: they are staged to the device
  // per call). Validates like attention(); same output as the daemon's kernels give.
  absl::StatusOr<TensorOut> attention_local(int layer, const TensorArg& q, const TensorArg& k,
                                            const TensorArg& v, const AttentionOptions& opts = {});
  // Advances the cache by `tokens` on every layer (one Commit RPC): they must have been
  // written — by append_local/attention_local on every layer (checked), or by the caller's
  // own kernel into the reserved pages. Pages a sliding window evicts leave the table.
  absl::Status commit(int64_t tokens);

 private:
  friend class Client;
  friend class DecodeBatch;                        // the batched local path (decode_batch.cc)
  friend struct client_internal::PageTableAccess;  // the batch builders (page_tables.cc)
  GenericKvCacheHandle(std::shared_ptr<client_internal::Transport> transport, CacheInfo info,
                       std::shared_ptr<client_internal::CacheState> state, int64_t limit);

  // OK when the handle may call the arena; else why not.
  absl::Status CheckUsable(const char* op) const;
  absl::Status CheckLayer(const char* op, int layer) const;
  // Notes NOT_FOUND (the cache is gone) and passes the status through.
  absl::Status Observe(const absl::Status& s) const;
  // Waits for the client's local kernels before a call that may free pages ("Page
  // lifetime"); the error names op and the cache.
  absl::Status FinishLocalKernels(const char* op) const;
  // Whether some layer has a window: its writes and commits may evict pages.
  bool HasSlidingLayer() const;
  // Whether the cache has a prefix namespace: its committed full pages become readable by
  // other processes' caches, so local writes must have landed before a commit.
  bool PublishesPages() const { return !info_.spec.prefix_namespace.empty(); }
  // The layer's pages from Describe, narrowed to limit_.
  absl::StatusOr<LayerPages> Pages(const char* op, int layer) const;
  absl::StatusOr<KvCacheRef> View(KvCacheRef::Part part, int layer) const;
  absl::StatusOr<TensorOut> Attend(int layer, int64_t pos, const TensorArg& q, const TensorArg* k,
                                   const TensorArg* v, const AttentionOptions& opts);
  // Local path (local_path.cc).
  absl::Status CheckLocal(const char* op) const;
  // Loads the local table with Describe when it is stale.
  absl::Status EnsureTable(const char* op) const;
  // The pool as mapped here and the kernels that run over it (cached in state_).
  absl::Status LocalPool(const char* op, uint8_t** base, KvKernels** kernels) const;
  // Writes k/v (and attends q into *out when q is given) at the layer's next position.
  absl::Status WriteLocal(const char* op, int layer, const TensorArg* q, const TensorArg& k,
                          const TensorArg& v, const AttentionOptions& opts, TensorOut* out);
  static absl::Status ReserveAll(
      const std::vector<std::pair<GenericKvCacheHandle*, int64_t>>& items);
  static absl::Status CommitAll(
      const std::vector<std::pair<GenericKvCacheHandle*, int64_t>>& items);

  std::shared_ptr<client_internal::Transport> transport_;
  CacheInfo info_;  // as allocated; lengths live in state_
  std::shared_ptr<client_internal::CacheState> state_;
  int64_t limit_;  // with_sequence_length's n; -1: none
};

}  // namespace kvarena

#endif  // KVARENA_CLIENT_INCLUDE_KVARENA_KV_CACHE_HANDLE_H_
