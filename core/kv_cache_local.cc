// KvCache's side of the local path: Describe (the block tables a handle maps) and the
// Reserve / Commit steps the store runs under several caches' locks (kv_store_local.cc).
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/checked.h"
#include "base/status_macros.h"
#include "core/kv_cache.h"
#include "core/refusal.h"
#include "core/validate.h"

namespace kvarena {

absl::StatusOr<CacheDescription> KvCache::Describe() {
  absl::MutexLock lock(&mu_);
  KVARENA_RETURN_IF_ERROR(CheckLiveLocked());
  CacheDescription d;
  d.info = InfoLocked();
  d.layers.reserve(layers_.size());
  for (const LayerTable& t : layers_) {
    d.layers.push_back(LayerPages{t.first_pos(spec_.page_size), t.len(),
                                  std::vector<int32_t>(t.blocks(), t.blocks() + t.num_blocks()),
                                  t.len()});
  }
  return d;
}

absl::Status KvCache::CheckGrowLocked(absl::string_view op, int64_t tokens) const {
  KVARENA_RETURN_IF_ERROR(CheckLiveLocked());
  if (tokens < 0 || tokens > limits().max_request_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": cache ", Quoted(id_), " tokens=", tokens,
                                                   " must be in [0, ", limits().max_request_tokens,
                                                   "]"));
  }
  const int64_t seq = SeqLenLocked();
  KVARENA_RETURN_IF_ERROR(
      CheckGrowth(op, absl::StrCat("cache ", Quoted(id_), " seq_len"), seq, tokens, limits()));
  if (spec_.max_tokens > 0 && tokens > spec_.max_tokens - seq) {
    return RefusedError(Refusal::kMaxTokens,
                        absl::StrCat(op, ": cache ", Quoted(id_), " would hold ", seq + tokens,
                                     " tokens but max_tokens=", spec_.max_tokens));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvCache::PagesToReserveLocked(int64_t tokens) const {
  KVARENA_RETURN_IF_ERROR(CheckGrowLocked("reserve", tokens));
  const int64_t seq = SeqLenLocked();
  int64_t pages = 0;
  for (const LayerTable& t : layers_) {
    const std::optional<int64_t> sum =
        CheckedAdd(pages, t.BlocksMissing(seq + tokens, spec_.page_size));
    if (!sum) return absl::InvalidArgumentError("reserve: the page count overflows");
    pages = *sum;
  }
  return pages;
}

ReserveResult KvCache::AddReservedLocked(int64_t tokens, const std::vector<int32_t>& ids,
                                         size_t* next) {
  const int64_t seq = SeqLenLocked();
  const int64_t old_mat = MaterializedLocked();
  const int64_t end = seq + tokens;
  ReserveResult r;
  r.cache_id = id_;
  r.first_pos = seq;
  for (LayerTable& t : layers_) {
    const int64_t missing = t.BlocksMissing(end, spec_.page_size);
    t.AddBlocks(ids.data() + *next, missing);
    *next += size_t(missing);
    pages_held_ += missing;
    const int64_t from = t.len() / spec_.page_size * spec_.page_size;
    r.layers.push_back(
        LayerPages{from, t.len(), t.BlocksCovering(from, end, spec_.page_size), t.len()});
  }
  PublishLocked(seq, old_mat);
  return r;
}

absl::Status KvCache::CheckCommitLocked(int64_t tokens) const {
  KVARENA_RETURN_IF_ERROR(CheckGrowLocked("commit", tokens));
  const int64_t seq = SeqLenLocked();
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerTable& t = layers_[i];
    if (t.len() != seq) {
      return absl::FailedPreconditionError(
          absl::StrCat("commit: cache ", Quoted(id_), " layer ", i, " holds ", t.len(),
                       " tokens but seq_len=", seq, "; the local path keeps layers in step"));
    }
    if (t.BlocksMissing(seq + tokens, spec_.page_size) > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "commit: cache ", Quoted(id_), " layer ", i,
          " has no pages reserved for positions up to ", seq + tokens, "; call Reserve first"));
    }
  }
  return absl::OkStatus();
}

CacheInfo KvCache::CommitLocked(int64_t tokens) {
  const int64_t seq = SeqLenLocked();
  const int64_t old_mat = MaterializedLocked();
  for (LayerTable& t : layers_) t.set_len(seq + tokens);
  RegisterLocked(-1);
  for (int i = 0; i < spec_.num_layers; ++i) EvictLocked(i, seq);
  PublishLocked(seq, old_mat);
  return InfoLocked();
}

}  // namespace kvarena
