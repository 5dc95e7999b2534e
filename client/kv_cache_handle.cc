#include "kvarena/kv_cache_handle.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/cache_state.h"
#include "client/transport.h"
#include "core/refusal.h"

namespace kvarena {

using client_internal::CacheState;
using client_internal::Transport;

uint8_t* KvCacheRef::TokenPtr(int kv, int64_t t) const {
  const int64_t block = t / layout.page_size - first_pos / layout.page_size;
  const int64_t slot = t % layout.page_size;
  return pool_base + size_t(page_ids[block]) * layout.PageBytes() +
         (size_t(kv) * layout.page_size + size_t(slot)) * layout.TokenBytes();
}

uint8_t* KvCacheRef::TokenPtr(int64_t t) const { return TokenPtr(part == Part::kValue ? 1 : 0, t); }

PagedKvView KvCacheRef::view() const {
  PagedKvView v;
  v.layout = layout;
  v.pool_base = pool_base;
  v.block_table = page_ids.data();
  v.first_block = first_pos / layout.page_size;
  v.num_blocks = int64_t(page_ids.size());
  v.len = len;
  v.k_scales = k_scales.empty() ? nullptr : k_scales.data();
  v.v_scales = v_scales.empty() ? nullptr : v_scales.data();
  return v;
}

GenericKvCacheHandle::GenericKvCacheHandle(std::shared_ptr<Transport> transport, CacheInfo info,
                                           std::shared_ptr<CacheState> state, int64_t limit)
    : transport_(std::move(transport)),
      info_(std::move(info)),
      state_(std::move(state)),
      limit_(limit) {}

GenericKvCacheHandle::~GenericKvCacheHandle() = default;

PageLayout GenericKvCacheHandle::layout() const { return LayoutOf(info_.spec); }

std::string GenericKvCacheHandle::device() const { return transport_->device(); }

int64_t GenericKvCacheHandle::num_tokens() const {
  const int64_t n = state_->SeqLen();
  return limit_ >= 0 ? std::min(n, limit_) : n;
}

int64_t GenericKvCacheHandle::layer_len(int layer) const {
  if (layer < 0 || layer >= num_layers()) return -1;
  const int64_t n = state_->LayerLen(layer);
  return limit_ >= 0 ? std::min(n, limit_) : n;
}

bool GenericKvCacheHandle::is_valid() const {
  return !state_->released.load() && !state_->gone.load() && transport_->connected();
}

absl::Status GenericKvCacheHandle::CheckUsable(const char* op) const {
  if (state_->released.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": cache ", cache_id(), " was released (through this handle or a clone)"));
  }
  if (!transport_->connected()) return transport_->DisconnectedStatus();
  return absl::OkStatus();
}

absl::Status GenericKvCacheHandle::CheckLayer(const char* op, int layer) const {
  if (layer >= 0 && layer < num_layers()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": layer=", layer, " but cache ", cache_id(),
                                                 " has ", num_layers(), " layers"));
}

absl::Status GenericKvCacheHandle::Observe(const absl::Status& s) const {
  if (s.code() == absl::StatusCode::kNotFound) state_->gone.store(true);
  return s;
}

absl::Status GenericKvCacheHandle::FinishLocalKernels(const char* op) const {
  absl::Status s = transport_->SynchronizeLocalKernels();
  if (s.ok()) return s;
  return Annotated(s, absl::StrCat(op, ": cache ", cache_id(), ": "));
}

bool GenericKvCacheHandle::HasSlidingLayer() const {
  const std::vector<int>& w = info_.spec.layer_windows;
  return std::any_of(w.begin(), w.end(), [](int window) { return window > 0; });
}

absl::Status GenericKvCacheHandle::refresh() {
  auto d = describe();
  return d.ok() ? absl::OkStatus() : d.status();
}

absl::StatusOr<CacheDescription> GenericKvCacheHandle::describe() const {
  KVARENA_RETURN_IF_ERROR(CheckUsable("describe"));
  auto d = transport_->Describe(cache_id());
  if (!d.ok()) return Observe(d.status());
  state_->Load(*d);
  return d;
}

absl::StatusOr<LayerPages> GenericKvCacheHandle::Pages(const char* op, int layer) const {
  KVARENA_RETURN_IF_ERROR(CheckUsable(op));
  KVARENA_RETURN_IF_ERROR(CheckLayer(op, layer));
  KVARENA_ASSIGN_OR_RETURN(auto d, describe());
  if (int(d.layers.size()) <= layer) {
    return absl::InternalError(absl::StrCat(op, ": Describe of cache ", cache_id(), " returned ",
                                            d.layers.size(), " layers, wanted layer ", layer));
  }
  LayerPages lp = std::move(d.layers[layer]);
  if (limit_ >= 0 && lp.len > limit_) {
    lp.len = std::max(limit_, lp.first_pos);
    const int64_t ps = page_size();
    const int64_t blocks = PagesCovering(lp.first_pos, lp.len, ps);
    if (int64_t(lp.page_ids.size()) > blocks) lp.page_ids.resize(blocks);
  }
  return lp;
}

absl::StatusOr<std::vector<int32_t>> GenericKvCacheHandle::block_table(int layer) const {
  KVARENA_ASSIGN_OR_RETURN(auto lp, Pages("block_table", layer));
  return std::move(lp.page_ids);
}

absl::StatusOr<KvCacheRef> GenericKvCacheHandle::View(KvCacheRef::Part part, int layer) const {
  static constexpr const char* kOps[] = {"kv_cache", "key_cache", "value_cache"};
  const char* op = kOps[int(part)];
  KVARENA_RETURN_IF_ERROR(CheckUsable(op));
  auto base = transport_->PoolBase(info_.pool_id);
  if (!base.ok()) {
    return Annotated(base.status(), absl::StrCat(op, ": "));
  }
  KVARENA_ASSIGN_OR_RETURN(auto lp, Pages(op, layer));
  KvCacheRef ref;
  ref.part = part;
  ref.pool_base = *base;
  ref.layout = layout();
  ref.first_pos = lp.first_pos;
  ref.len = lp.len;
  PagedKvView scales;
  SetStaticScales(info_.spec, layer, &scales);
  for (auto [from, to] :
       {std::pair{scales.k_scales, &ref.k_scales}, std::pair{scales.v_scales, &ref.v_scales}}) {
    if (from != nullptr) to->assign(from, from + num_kv_heads());
  }
  // Only the blocks holding tokens: a layer may keep more in reserve past len.
  const int64_t ps = ref.layout.page_size;
  const int64_t blocks = PagesCovering(ref.first_pos, ref.len, ps);
  if (int64_t(lp.page_ids.size()) > blocks) lp.page_ids.resize(size_t(blocks));
  ref.page_ids = std::move(lp.page_ids);
  return ref;
}

absl::StatusOr<KvCacheRef> GenericKvCacheHandle::key_cache(int layer) const {
  return View(KvCacheRef::Part::kKey, layer);
}
absl::StatusOr<KvCacheRef> GenericKvCacheHandle::value_cache(int layer) const {
  return View(KvCacheRef::Part::kValue, layer);
}
absl::StatusOr<KvCacheRef> GenericKvCacheHandle::kv_cache(int layer) const {
  return View(KvCacheRef::Part::kKeyValue, layer);
}

absl::StatusOr<PageStats> GenericKvCacheHandle::stats() const {
  KVARENA_RETURN_IF_ERROR(CheckUsable("stats"));
  auto st = transport_->CacheStats(cache_id());
  if (!st.ok()) return Observe(st.status());
  return st;
}

absl::StatusOr<int64_t> GenericKvCacheHandle::pages_used() const {
  KVARENA_ASSIGN_OR_RETURN(auto st, stats());
  return st.pages_used;
}

std::shared_ptr<GenericKvCacheHandle> GenericKvCacheHandle::clone_handle() const {
  return std::shared_ptr<GenericKvCacheHandle>(
      new GenericKvCacheHandle(transport_, info_, state_, limit_));
}

absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> GenericKvCacheHandle::with_sequence_length(
    int64_t n) const {
  const int64_t have = num_tokens();
  if (n < 0 || n > have) {
    return absl::InvalidArgumentError(absl::StrCat("with_sequence_length: n=", n, " but cache ",
                                                   cache_id(), " holds ", have, " tokens"));
  }
  return std::shared_ptr<GenericKvCacheHandle>(
      new GenericKvCacheHandle(transport_, info_, state_, n));
}

absl::StatusOr<AppendResult> GenericKvCacheHandle::append(int layer, const TensorArg& k,
                                                          const TensorArg& v) {
  KVARENA_RETURN_IF_ERROR(CheckLayer("append", layer));
  return append(layer, state_->LayerLen(layer), k, v);
}

absl::StatusOr<AppendResult> GenericKvCacheHandle::append(int layer, int64_t pos,
                                                          const TensorArg& k, const TensorArg& v) {
  KVARENA_RETURN_IF_ERROR(CheckUsable("append"));
  KVARENA_RETURN_IF_ERROR(CheckLayer("append", layer));
  if (HasSlidingLayer()) {  // the window may evict pages
    KVARENA_RETURN_IF_ERROR(FinishLocalKernels("append"));
  }
  auto r = transport_->Append(cache_id(), layer, pos, k, v);
  if (!r.ok()) return Observe(r.status());
  state_->UpdateLayer(layer, r->layer_len, r->seq_len);
  state_->TableStale(/*drop_pending=*/false);
  return r;
}

absl::StatusOr<TensorOut> GenericKvCacheHandle::attention(int layer, const TensorArg& q,
                                                          const TensorArg& k, const TensorArg& v,
                                                          double scale) {
  AttentionOptions opts;
  opts.scale = scale;
  return attention_opts(layer, q, k, v, opts);
}

absl::StatusOr<TensorOut> GenericKvCacheHandle::attention_opts(int layer, const TensorArg& q,
                                                               const TensorArg& k,
                                                               const TensorArg& v,
                                                               const AttentionOptions& opts) {
  KVARENA_RETURN_IF_ERROR(CheckLayer("attention", layer));
  return Attend(layer, state_->LayerLen(layer), q, &k, &v, opts);
}

absl::StatusOr<TensorOut> GenericKvCacheHandle::attention(int layer, int64_t pos,
                                                          const TensorArg& q,
                                                          const AttentionOptions& opts) {
  return Attend(layer, pos, q, nullptr, nullptr, opts);
}

absl::StatusOr<TensorOut> GenericKvCacheHandle::Attend(int layer, int64_t pos, const TensorArg& q,
                                                       const TensorArg* k, const TensorArg* v,
                                                       const AttentionOptions& opts) {
  KVARENA_RETURN_IF_ERROR(CheckUsable("attention"));
  KVARENA_RETURN_IF_ERROR(CheckLayer("attention", layer));
  if (k != nullptr && HasSlidingLayer()) {  // appending: the window may evict pages
    KVARENA_RETURN_IF_ERROR(FinishLocalKernels("attention"));
  }
  AttendArgs args;
  args.cache_id = cache_id();
  args.layer = layer;
  args.pos = pos;
  args.q = q;
  if (k != nullptr) args.k = *k;
  if (v != nullptr) args.v = *v;
  args.scale = opts.scale;
  args.window = opts.window;
  TensorOut out;
  auto r = transport_->Attend(args, &out);
  if (!r.ok()) return Observe(r.status());
  if (k != nullptr && k->shape.size() == 4) {
    state_->UpdateLayer(layer, pos + k->shape[2], r->seq_len);
    state_->TableStale(/*drop_pending=*/false);
  }
  return out;
}

int64_t GenericKvCacheHandle::cached_tokens() const {
  absl::MutexLock lock(&state_->mu);
  return state_->cached_tokens;
}

int64_t GenericKvCacheHandle::tier_loaded_tokens() const {
  absl::MutexLock lock(&state_->mu);
  return state_->tier_loaded_tokens;
}

absl::Status GenericKvCacheHandle::set_tokens(int64_t first_pos,
                                              const std::vector<int32_t>& token_ids) {
  KVARENA_RETURN_IF_ERROR(CheckUsable("set_tokens"));
  // Pages this declaration completes become readable by other caches (as at commit).
  if (PublishesPages()) {
    KVARENA_RETURN_IF_ERROR(FinishLocalKernels("set_tokens"));
  }
  auto info = transport_->SetTokens(SetTokensArgs{cache_id(), first_pos, token_ids});
  if (!info.ok()) return Observe(info.status());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> GenericKvCacheHandle::fork(
    const std::string& new_cache_id) const {
  KVARENA_RETURN_IF_ERROR(CheckUsable("fork"));
  KVARENA_RETURN_IF_ERROR(FinishLocalKernels("fork"));  // it copies the partial pages
  auto info = transport_->Fork(cache_id(), new_cache_id);
  if (!info.ok()) return Observe(info.status());
  auto state =
      std::make_shared<client_internal::CacheState>(*info);  // its table loads with Describe
  return std::shared_ptr<GenericKvCacheHandle>(
      new GenericKvCacheHandle(transport_, *std::move(info), std::move(state), -1));
}

absl::StatusOr<PopnResult> GenericKvCacheHandle::popn(int64_t n) {
  KVARENA_RETURN_IF_ERROR(CheckUsable("popn"));
  KVARENA_RETURN_IF_ERROR(FinishLocalKernels("popn"));
  auto r = transport_->Popn(cache_id(), n);
  if (!r.ok()) return Observe(r.status());
  if (r->popped > 0) {
    state_->TableStale(/*drop_pending=*/true);  // refresh() reloads it
    if (!refresh().ok()) state_->Popped(r->popped, r->seq_len);
  } else if (r->refusal.empty()) {
    state_->DropPending();  // popn(0): no token goes, uncommitted local writes do
  }
  return r;
}

absl::Status GenericKvCacheHandle::reset(bool keep_pages) {
  KVARENA_RETURN_IF_ERROR(CheckUsable("reset"));
  KVARENA_RETURN_IF_ERROR(FinishLocalKernels("reset"));
  auto info = transport_->Reset(cache_id(), keep_pages);
  if (!info.ok()) return Observe(info.status());
  state_->Update(*info);
  state_->TableStale(/*drop_pending=*/true);
  return absl::OkStatus();
}

absl::Status GenericKvCacheHandle::release() {
  KVARENA_RETURN_IF_ERROR(CheckUsable("release"));
  KVARENA_RETURN_IF_ERROR(FinishLocalKernels("release"));
  if (auto s = transport_->Release(cache_id()); !s.ok()) return Observe(s);
  state_->released.store(true);
  return absl::OkStatus();
}

}  // namespace kvarena
