// Kernel-ready page tables for a decode batch: the arrays FlashInfer's and vLLM's paged
// attention kernels take, built from the handles' own block tables (local_table) with no
// RPC, so a worker can run those kernels (or its own) over the mapped NHD pool
// (KvPoolView in kv_cache_handle.h says how K and V are addressed).
//
// A batch is a CacheTokenList — the same list Client::Reserve / Client::Commit take: for
// each sequence b a handle and n_b, the tokens the caller is about to write past what the
// handle wrote (its committed length plus its local writes). A step reads:
//   client->Reserve(batch);                               // pages for the n_b new tokens
//   auto fi = *BuildFlashInferPageTable(batch, layer);    // or BuildVllmBlockTables
//   ... write the new K/V (at vllm.slot_mapping), run attention over the tables ...
//   client->Commit(batch);
// Each sequence's table covers positions [first_pos_b, end_b) with end_b = written + n_b:
// the K/V written so far and the new tokens. Every handle of a batch must come from one
// Client and one pool (same geometry: page ids index that pool) and have the layer.
//
// Sliding windows. On a layer whose window evicted pages, first_pos_b > 0: the tables
// start at the first page the layer still holds (first_pos_b is a multiple of page_size),
// so a kernel sees end_b - first_pos_b keys and the last query of sequence b at relative
// position end_b - 1 - first_pos_b; add first_pos_b for absolute positions (RoPE). The
// retained pages may hold keys older than the window, so pass the window to the kernel:
// a kvarena window w (keys in (p - w, p]) is FlashInfer's window_left = w - 1 and
// flash-attention's window_size = (w - 1, 0). Masking is relative, so it is unaffected.
//
// The arrays name pages, they do not hold them: kernels the caller runs over them are the
// caller's to finish before any call that may free pages (popn, reset, release, a commit
// on a sliding layer: kv_cache_handle.h "Page lifetime").
//
// Errors: INVALID_ARGUMENT for an empty batch, a null handle, n_b < 0, a layer a handle
// lacks, handles of different clients or pools, a sequence longer than max_blocks or
// arrays past int32; FAILED_PRECONDITION when a sequence's new tokens have no pages (call
// reserve first), n_b > 0 on a with_sequence_length view, or a released handle; a
// Describe's error when a table had to be reloaded.
//
// Thread-safety: the builders are safe to call concurrently; each handle's table is read
// once, under its lock. Other threads writing the same caches meanwhile make the arrays
// stale, as any snapshot.
#ifndef KVARENA_CLIENT_INCLUDE_KVARENA_PAGE_TABLES_H_
#define KVARENA_CLIENT_INCLUDE_KVARENA_PAGE_TABLES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvarena/client.h"

struct CUstream_st;  // what cudaStream_t points to, without the CUDA headers

namespace kvarena {

// FlashInfer's paged-KV CSR arrays (BatchDecodeWithPagedKVCacheWrapper.plan's
// paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len; also the prefill wrapper's).
// Sequence b's pages are indices[indptr[b] .. indptr[b + 1]), and it holds
//   kv_len_b = (indptr[b + 1] - indptr[b] - 1) * page_size + last_page_len[b]
//            = end_b - first_pos[b] tokens.
struct FlashInferPageTable {
  std::vector<int32_t> indptr;         // [batch + 1], indptr[0] = 0
  std::vector<int32_t> indices;        // [indptr[batch]] pool page ids
  std::vector<int32_t> last_page_len;  // [batch], 1..page_size (0 for an empty sequence)
  std::vector<int64_t> first_pos;      // [batch] absolute position of each sequence's first key
};

// vLLM's block tables (paged_attention / flash-attention's block_table, reshape_and_cache's
// slot_mapping). Row b of block_tables holds the pages covering [first_pos[b], end_b), then
// `pad`; kernels read only the first ceil(seq_lens[b] / page_size) entries of a row.
struct VllmBlockTables {
  int64_t max_blocks = 0;
  std::vector<int32_t> block_tables;  // [batch][max_blocks] row-major pool page ids, then pad
  std::vector<int32_t> seq_lens;      // [batch] keys the row covers: end_b - first_pos[b]
  std::vector<int64_t> first_pos;     // [batch] absolute position of each row's first key
  // The n_b new tokens, sequence after sequence: slot_mapping[query_start_loc[b] + i] is the
  // slot of position written_b + i, slot = page_id * page_size + position % page_size
  // (int64, as vLLM takes it; KvPoolView::SlotPtr addresses it).
  std::vector<int32_t> query_start_loc;  // [batch + 1], prefix sums of n_b
  std::vector<int64_t> slot_mapping;     // [query_start_loc[batch]]
};

// The default filler of block_tables past a row's pages: not a page id, so a kernel that
// wrongly reads past seq_lens computes an address outside the pool instead of silently
// reading page 0 (pass pad = 0 to a kernel that prefetches whole rows).
inline constexpr int32_t kPadBlockId = -1;

// FlashInfer arrays for `layer` of every sequence of the batch.
absl::StatusOr<FlashInferPageTable> BuildFlashInferPageTable(const CacheTokenList& batch,
                                                             int layer);

// vLLM arrays for `layer`. max_blocks: the row width; 0 takes the longest row's (give a
// fixed width, e.g. ceil(max_tokens / page_size), to keep the shape stable across steps).
absl::StatusOr<VllmBlockTables> BuildVllmBlockTables(const CacheTokenList& batch, int layer,
                                                     int64_t max_blocks = 0,
                                                     int32_t pad = kPadBlockId);

// --- device copies ---
// A caller-owned device buffer of `capacity` elements (cudaMalloc'd on the pool's device,
// kept at a fixed address so a captured CUDA graph may read it).
template <typename T>
struct DeviceBuffer {
  T* data = nullptr;
  int64_t capacity = 0;
};

struct FlashInferDeviceTable {
  DeviceBuffer<int32_t> indptr, indices, last_page_len;
};
struct VllmDeviceTables {
  DeviceBuffer<int32_t> block_tables, seq_lens, query_start_loc;
  DeviceBuffer<int64_t> slot_mapping;
};

// Copies the arrays into the caller's device buffers, enqueued on `stream` (nullptr: the
// legacy default stream): kernels queued on it after this see them. A buffer with null
// data is skipped (first_pos is never copied). The host table may be destroyed on
// return: CUDA stages pageable memory before cudaMemcpyAsync returns. INVALID_ARGUMENT
// when a buffer is too small or not device memory (nothing copied); FAILED_PRECONDITION
// in a client built without CUDA or with no CUDA device; INTERNAL for a CUDA error,
// naming the array.
absl::Status CopyToDevice(const FlashInferPageTable& table, const FlashInferDeviceTable& dst,
                          CUstream_st* stream);
absl::Status CopyToDevice(const VllmBlockTables& tables, const VllmDeviceTables& dst,
                          CUstream_st* stream);

}  // namespace kvarena

#endif  // KVARENA_CLIENT_INCLUDE_KVARENA_PAGE_TABLES_H_
