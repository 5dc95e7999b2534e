// The block tables of a DecodeBatch (kvarena/decode_batch.h): one [batch][width] table per
// layer, brought up to the handles' local tables each Plan by writing only the entries
// that changed, and grown (moved) only when a sequence outgrows the width.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cache_state.h"
#include "client/decode_batch_impl.h"
#include "core/validate.h"

namespace kvarena {

using client_internal::CacheState;

// Copies every (sequence, layer) table and position out of the handles, checking the step
// can be taken: equal layer lengths, within the kernels' reach, within max_blocks.
absl::Status DecodeBatch::Impl::Snapshot(const char* op) {
  const int64_t n = options.tokens_per_step;
  const size_t num_layers = layers.size();
  for (int b = 0; b < batch(); ++b) {
    const std::string& id = caches[size_t(b)]->cache_id();
    CacheState& st = state(b);
    absl::MutexLock lock(&st.mu);
    if (!st.table.fresh()) {
      return absl::AbortedError(
          absl::StrCat(op, ": cache ", id, " changed while planning; Plan again"));
    }
    const int64_t len = st.table.layer(0).len;
    for (size_t l = 0; l < num_layers; ++l) {
      const LayerPages& ll = st.table.layer(int(l));
      if (ll.len != len) {
        return absl::FailedPreconditionError(absl::StrCat(
            op, ": cache ", id, " layer ", l, " holds ", ll.len, " tokens but layer 0 holds ", len,
            "; a batch step writes every layer at one position"));
      }
      if (len > limits.max_positions - n) {
        return CheckGrowth(op, absl::StrCat("cache ", id, " length"), len, n, limits);
      }
      if (len + n > ll.end(spec.page_size)) {  // Reserve said it made room
        return absl::InternalError(absl::StrCat(op, ": cache ", id, " layer ", l,
                                                " holds pages to ", ll.end(spec.page_size),
                                                " after reserving to ", len + n));
      }
      // The pages this step reads and writes (Reserve may have taken more, ahead).
      const int64_t blocks =
          CeilDiv(len + n, int64_t(spec.page_size)) - ll.first_pos / spec.page_size;
      if (options.max_blocks > 0 && blocks > options.max_blocks) {
        return absl::ResourceExhaustedError(absl::StrCat(
            op, ": cache ", id, " layer ", l, " needs ", blocks, " pages for positions [",
            ll.first_pos, ", ", len + n, ") but options.max_blocks=", options.max_blocks));
      }
      std::vector<int32_t>& snap = snapshot[size_t(b) * num_layers + l];
      snap.assign(ll.page_ids.begin(), ll.page_ids.begin() + blocks);
      snapshot_first[size_t(b) * num_layers + l] = ll.first_pos / spec.page_size;
      snapshot_len[size_t(b) * num_layers + l] = len;
    }
  }
  return absl::OkStatus();
}

// Reallocates every layer's tables [batch][new_width]; rows are rewritten by the next update.
void DecodeBatch::Impl::Resize(int64_t new_width) {
  width = new_width;
  for (Layer& l : layers) {
    l.tables.assign(size_t(batch()) * size_t(width), -1);
    std::fill(l.first_block.begin(), l.first_block.end(), -1);
    std::fill(l.num_blocks.begin(), l.num_blocks.end(), 0);
  }
}

// Brings every row up to its snapshot, writing only entries that differ (a row whose first
// block moved is rewritten whole), and sets this step's positions and views.
void DecodeBatch::Impl::UpdateTables() {
  const size_t num_layers = layers.size();
  int64_t need = 0;
  for (const auto& snap : snapshot) need = std::max<int64_t>(need, int64_t(snap.size()));
  if (need > width) {
    Resize(std::max(need, 2 * width));
    ++stats.tables_moved;
  }
  const int64_t n = options.tokens_per_step;
  for (size_t li = 0; li < num_layers; ++li) {
    Layer& l = layers[li];
    for (int b = 0; b < batch(); ++b) {
      const std::vector<int32_t>& snap = snapshot[size_t(b) * num_layers + li];
      const int64_t first = snapshot_first[size_t(b) * num_layers + li];
      int32_t* row = l.tables.data() + size_t(b) * size_t(width);
      const int64_t count = int64_t(snap.size());
      int64_t from = 0;
      if (l.first_block[size_t(b)] != first) {
        ++stats.sequences_rebuilt;
      } else {
        const int64_t common = std::min(count, l.num_blocks[size_t(b)]);
        while (from < common && row[from] == snap[size_t(from)]) ++from;
      }
      std::copy(snap.begin() + from, snap.end(), row + from);
      stats.ids_written += count - from;
      std::fill(row + count, row + std::max(count, l.num_blocks[size_t(b)]), -1);
      l.first_block[size_t(b)] = first;
      l.num_blocks[size_t(b)] = count;
      const int64_t pos = snapshot_len[size_t(b) * num_layers + li];
      l.pos[size_t(b)] = pos;
      PagedKvView& view = l.views[size_t(b)];
      view.layout = layout;
      view.pool_base = base;
      view.block_table = row;
      view.first_block = first;
      view.num_blocks = count;
      view.len = pos + n;
      SetStaticScales(caches[size_t(b)]->info_.spec, int(li), &view);
    }
    l.ran = false;
  }
}

}  // namespace kvarena
