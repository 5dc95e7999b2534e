// DecodeBatch (kvarena/decode_batch.h): a decode step of many caches, one kernel call per
// layer: Create's checks, Plan, Run / Append and Commit. The batch's own block tables are
// decode_batch_tables.cc's.
#include "kvarena/decode_batch.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "client/cache_state.h"
#include "client/decode_batch_impl.h"
#include "core/validate.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

using client_internal::CacheState;
using client_internal::Pending;

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeBatch>> DecodeBatch::Create(
    std::vector<std::shared_ptr<GenericKvCacheHandle>> caches, const DecodeBatchOptions& options) {
  const char* op = "DecodeBatch::Create";
  if (caches.empty()) return absl::InvalidArgumentError(absl::StrCat(op, ": no caches"));
  if (caches.size() > size_t{1} << 20) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", caches.size(), " caches; a batch takes at most ", size_t{1} << 20));
  }
  if (options.max_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": options.max_blocks=", options.max_blocks, " < 0"));
  }
  auto impl = std::make_unique<Impl>();
  std::set<std::string> ids;
  for (size_t b = 0; b < caches.size(); ++b) {
    const GenericKvCacheHandle* h = caches[b].get();
    if (h == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(op, ": caches[", b, "] is null"));
    KVARENA_RETURN_IF_ERROR(h->CheckLocal(op));
    const GenericKvCacheHandle& first = *caches[0];
    if (h->transport_ != first.transport_) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": cache ", h->cache_id(),
                                                     " comes from another Client than cache ",
                                                     first.cache_id()));
    }
    if (!ids.insert(h->cache_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": cache ", h->cache_id(), " is listed twice"));
    }
    if (h->pool_id() != first.pool_id()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": cache ", h->cache_id(), " lives in pool ", h->pool_id(), ", cache ",
                       first.cache_id(), " in pool ", first.pool_id(),
                       "; a batch is caches of one pool (one geometry)"));
    }
    const CacheSpec& a = h->info_.spec;
    const CacheSpec& s0 = first.info_.spec;
    if (a.num_layers != s0.num_layers || a.layer_windows != s0.layer_windows) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": cache ", h->cache_id(), " has ", a.num_layers, " layers with windows ",
          ShapeString({a.layer_windows.begin(), a.layer_windows.end()}), ", cache ",
          first.cache_id(), " ", s0.num_layers, " with ",
          ShapeString({s0.layer_windows.begin(), s0.layer_windows.end()}),
          "; a batch runs one layer of every cache at once"));
    }
  }
  GenericKvCacheHandle& first = *caches[0];
  KVARENA_RETURN_IF_ERROR(first.LocalPool(op, &impl->base, &impl->kernels));
  const KernelLimits reach = impl->kernels->limits();
  impl->limits = LimitsFor(reach, reach.max_positions);
  if (options.tokens_per_step < 1 || options.tokens_per_step > impl->limits.max_request_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": options.tokens_per_step=", options.tokens_per_step, " outside [1, ",
                     impl->limits.max_request_tokens, "]"));
  }
  impl->caches = std::move(caches);
  for (const auto& h : impl->caches) impl->items.emplace_back(h.get(), options.tokens_per_step);
  impl->options = options;
  impl->spec = first.info_.spec;
  impl->layout = first.layout();
  const int batch = impl->batch();
  impl->layers.resize(size_t(impl->spec.num_layers));
  for (Impl::Layer& l : impl->layers) {
    l.first_block.assign(size_t(batch), -1);
    l.num_blocks.assign(size_t(batch), 0);
    l.pos.assign(size_t(batch), 0);
    l.views.assign(size_t(batch), PagedKvView{});
  }
  impl->snapshot.resize(size_t(batch) * impl->layers.size());
  impl->snapshot_first.resize(impl->snapshot.size());
  impl->snapshot_len.resize(impl->snapshot.size());
  impl->Resize(options.max_blocks);
  return std::unique_ptr<DecodeBatch>(new DecodeBatch(std::move(impl)));
}

DecodeBatch::DecodeBatch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DecodeBatch::~DecodeBatch() = default;

int DecodeBatch::batch_size() const { return impl_->batch(); }
int64_t DecodeBatch::tokens_per_step() const { return impl_->options.tokens_per_step; }
int64_t DecodeBatch::max_blocks() const { return impl_->width; }
DecodeBatchStats DecodeBatch::stats() const { return impl_->stats; }
int64_t DecodeBatch::position(int b) const { return impl_->layers[0].pos[size_t(b)]; }
const int32_t* DecodeBatch::block_tables(int layer) const {
  return impl_->layers[size_t(layer)].tables.data();
}
int64_t DecodeBatch::first_block(int layer, int b) const {
  return std::max<int64_t>(0, impl_->layers[size_t(layer)].first_block[size_t(b)]);
}

absl::Status DecodeBatch::Impl::CheckNoPending(const char* op) const {
  for (int b = 0; b < batch(); ++b) {
    CacheState& st = state(b);
    absl::MutexLock lock(&st.mu);
    for (int l = 0; l < st.table.num_layers(); ++l) {
      if (Pending(st.table.layer(l)) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat(op, ": cache ", caches[size_t(b)]->cache_id(), " layer ", l, " holds ",
                         Pending(st.table.layer(l)),
                         " uncommitted local tokens (a step is under way); Commit it, or "
                         "drop them with popn / reset first"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeBatch::Plan() {
  const char* op = "DecodeBatch::Plan";
  Impl& m = *impl_;
  m.planned = false;
  KVARENA_RETURN_IF_ERROR(m.CheckNoPending(op));
  KVARENA_RETURN_IF_ERROR(GenericKvCacheHandle::ReserveAll(m.items));
  KVARENA_RETURN_IF_ERROR(m.Snapshot(op));
  m.UpdateTables();
  m.planned = true;
  ++m.stats.steps;
  return absl::OkStatus();
}

absl::Status DecodeBatch::Impl::CheckTensor(const char* op, const char* name, const TensorArg& t,
                                            int heads_lo, int heads_hi) const {
  const int64_t n = options.tokens_per_step;
  if (t.dtype != spec.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, ": dtype ", DTypeName(t.dtype),
                                                   " but the caches hold ", DTypeName(spec.dtype)));
  }
  const std::vector<int64_t>& s = t.shape;
  if (s.size() != 4 || s[0] != batch() || s[2] != n || s[3] != spec.head_dim || s[1] < heads_lo ||
      s[1] > heads_hi || s[1] % heads_lo != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, ": shape ", ShapeString(s), " but want [batch=", batch(), ", heads=",
        heads_lo == heads_hi ? absl::StrCat(heads_lo)
                             : absl::StrCat("a multiple of ", heads_lo, " up to ", heads_hi),
        ", tokens_per_step=", n, ", head_dim=", spec.head_dim, "]"));
  }
  // [heads, batch * tokens, head_dim]: the same element count; batch * n fits (both <= 2^20).
  const std::optional<uint64_t> bytes = TensorBytes(spec.dtype, s[1], s[0] * n, s[3]);
  if (!bytes || *bytes != t.bytes || t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, ": ", t.bytes, " bytes at ", t.data == nullptr ? "null" : "a buffer",
        " but shape ", ShapeString(s), " of ", DTypeName(spec.dtype), " needs ",
        bytes ? absl::StrCat(*bytes) : std::string("more than 2^63")));
  }
  return absl::OkStatus();
}

// The caches must be as Plan left them: no release, popn, reset or other write since.
absl::Status DecodeBatch::Impl::CheckUnchanged(const char* op, int layer) const {
  const Layer& l = layers[size_t(layer)];
  for (int b = 0; b < batch(); ++b) {
    const GenericKvCacheHandle& h = *caches[size_t(b)];
    KVARENA_RETURN_IF_ERROR(h.CheckUsable(op));
    CacheState& st = state(b);
    absl::MutexLock lock(&st.mu);
    const LayerPages& ll = st.table.layer(layer);
    if (!st.table.fresh() || ll.len != l.pos[size_t(b)] || Pending(ll) != 0 ||
        ll.first_pos != l.first_block[size_t(b)] * spec.page_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          op, ": cache ", h.cache_id(), " layer ", layer, " changed since Plan (length ", ll.len,
          " + ", Pending(ll), " uncommitted, planned at ", l.pos[size_t(b)],
          st.table.fresh() ? "" : ", table reloaded", "); Plan again"));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeBatch::Impl::Write(const char* op, int layer, const TensorArg* q,
                                      const TensorArg& k, const TensorArg& v,
                                      const TensorBuffer* out, const AttentionOptions& opts) {
  if (!planned) {
    return absl::FailedPreconditionError(absl::StrCat(op, ": no step planned; call Plan first"));
  }
  if (layer < 0 || layer >= spec.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": layer=", layer, " but the caches have ", spec.num_layers, " layers"));
  }
  Layer& l = layers[size_t(layer)];
  if (l.ran) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": layer ", layer, " already ran this step (at position ", l.pos[0],
                     " of sequence 0); Commit ends the step"));
  }
  const int kv = spec.num_kv_heads;
  KVARENA_RETURN_IF_ERROR(CheckTensor(op, "k", k, kv, kv));
  KVARENA_RETURN_IF_ERROR(CheckTensor(op, "v", v, kv, kv));
  if (q != nullptr) {
    KVARENA_RETURN_IF_ERROR(CheckTensor(op, "q", *q, kv, kv * limits.max_group));
    if (out->data == nullptr || out->bytes != q->bytes) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": out: ", out->bytes, " bytes at ",
                                                     out->data == nullptr ? "null" : "a buffer",
                                                     " but q is ", q->bytes, " bytes"));
    }
    if (!std::isfinite(opts.scale) || opts.scale < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": scale=", opts.scale, " must be finite and >= 0"));
    }
  }
  KVARENA_RETURN_IF_ERROR(CheckUnchanged(op, layer));

  const int64_t n = options.tokens_per_step;
  if (auto s = kernels->AppendKvBatch(l.views.data(), l.pos.data(), batch(), n, k.data, v.data);
      !s.ok()) {
    return absl::InternalError(absl::StrCat(op, ": layer ", layer, ": ", s.message()));
  }
  for (int b = 0; b < batch(); ++b) {
    CacheState& st = state(b);
    absl::MutexLock lock(&st.mu);
    st.table.layer(layer).written += n;
  }
  l.ran = true;
  if (q == nullptr) return absl::OkStatus();
  AttentionParams p;
  p.num_q_heads = int(q->shape[1]);
  p.n = n;
  p.scale = AttentionScale(opts.scale, spec.head_dim);
  p.window = EffectiveWindow(spec.layer_windows[size_t(layer)], opts.window);
  if (auto s = kernels->PagedAttentionBatch(l.views.data(), l.pos.data(), batch(), p, q->data,
                                            out->data);
      !s.ok()) {
    return absl::InternalError(absl::StrCat(op, ": layer ", layer, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status DecodeBatch::Run(int layer, const TensorArg& q, const TensorArg& k, const TensorArg& v,
                              const TensorBuffer& out, const AttentionOptions& opts) {
  return impl_->Write("DecodeBatch::Run", layer, &q, k, v, &out, opts);
}

absl::Status DecodeBatch::Append(int layer, const TensorArg& k, const TensorArg& v) {
  return impl_->Write("DecodeBatch::Append", layer, nullptr, k, v, nullptr, {});
}

absl::Status DecodeBatch::Commit() {
  const char* op = "DecodeBatch::Commit";
  Impl& m = *impl_;
  if (!m.planned) {
    return absl::FailedPreconditionError(absl::StrCat(op, ": no step planned; call Plan first"));
  }
  for (size_t l = 0; l < m.layers.size(); ++l) {
    if (!m.layers[l].ran) {
      return absl::FailedPreconditionError(absl::StrCat(
          op, ": layer ", l, " has not run this step; Run or Append every layer first"));
    }
  }
  KVARENA_RETURN_IF_ERROR(GenericKvCacheHandle::CommitAll(m.items));
  m.planned = false;
  return absl::OkStatus();
}

}  // namespace kvarena
