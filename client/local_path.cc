// The local path of GenericKvCacheHandle (reserve, append_local, attention_local, commit)
// and its batched forms on Client. The arena only allocates (Reserve) and advances lengths
// (Commit); K/V are written into the reserved pages through this process's mapping of the
// pool and attention runs here, with the kernels for the pool's memory (client/
// local_kernels.h: the daemon's own kernels, CPU or CUDA) and the same validation
// (core/validate.h) as the served path. get_kv_local reads through the mapping too.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/cache_state.h"
#include "client/transport.h"
#include "core/refusal.h"
#include "core/validate.h"
#include "kernels/raw_kv.h"
#include "kvarena/client.h"
#include "kvarena/kv_cache_handle.h"

namespace kvarena {

using client_internal::CacheState;
using client_internal::Pending;
using client_internal::Transport;

namespace {

using HandleTokens = std::vector<std::pair<GenericKvCacheHandle*, int64_t>>;

// Tokens a Reserve asks for a cache at committed length seq that needs `tokens` more: ahead
// to a page boundary past reserve_ahead, within max_tokens (0: none); never less than tokens.
int64_t AheadOf(int64_t seq, int64_t tokens, int64_t reserve_ahead, int page_size,
                int64_t max_tokens) {
  int64_t end = RoundUp(seq + std::max(tokens, reserve_ahead), page_size);
  if (max_tokens > 0) end = std::min(end, max_tokens);
  return std::max(end, seq + tokens) - seq;
}

HandleTokens Raw(const CacheTokenList& items) {
  HandleTokens raw;
  for (const auto& [h, n] : items) raw.emplace_back(h.get(), n);
  return raw;
}

}  // namespace

absl::Status GenericKvCacheHandle::CheckLocal(const char* op) const {
  KVARENA_RETURN_IF_ERROR(CheckUsable(op));
  if (limit_ >= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": this handle of cache ", cache_id(),
                     " is a with_sequence_length view; write through the handle it came from"));
  }
  return absl::OkStatus();
}

absl::Status GenericKvCacheHandle::EnsureTable(const char* op) const {
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->table.fresh()) return absl::OkStatus();
  }
  auto d = describe();  // loads the table
  if (!d.ok()) return Annotated(d.status(), absl::StrCat(op, ": "));
  return absl::OkStatus();
}

absl::Status GenericKvCacheHandle::LocalPool(const char* op, uint8_t** base,
                                             KvKernels** kernels) const {
  if (KvKernels* k = state_->kernels.load(std::memory_order_acquire)) {
    *base = state_->pool_base.load(std::memory_order_relaxed);
    *kernels = k;
    return absl::OkStatus();
  }
  auto pool = transport_->MapPool(info_.pool_id);
  if (!pool.ok()) {
    return Annotated(pool.status(), absl::StrCat(op, ": "));
  }
  auto k = transport_->LocalKernelsFor(*pool);
  if (!k.ok()) return Annotated(k.status(), absl::StrCat(op, ": "));
  state_->pool_base.store(pool->base, std::memory_order_relaxed);
  state_->kernels.store(*k, std::memory_order_release);
  *base = pool->base;
  *kernels = *k;
  return absl::OkStatus();
}

int64_t GenericKvCacheHandle::reserve_ahead() const {
  absl::MutexLock lock(&state_->mu);
  return state_->reserve_ahead;
}

void GenericKvCacheHandle::set_reserve_ahead(int64_t tokens) {
  absl::MutexLock lock(&state_->mu);
  state_->reserve_ahead = std::max<int64_t>(0, tokens);
}

int64_t GenericKvCacheHandle::reserved_until() const {
  absl::MutexLock lock(&state_->mu);
  return state_->table.fresh() ? state_->table.Capacity() : 0;
}

absl::Status GenericKvCacheHandle::reserve(int64_t tokens) { return ReserveAll({{this, tokens}}); }

absl::Status GenericKvCacheHandle::commit(int64_t tokens) { return CommitAll({{this, tokens}}); }

absl::Status GenericKvCacheHandle::ReserveAll(const HandleTokens& items) {
  if (items.empty()) return absl::OkStatus();
  Transport* transport = items.front().first->transport_.get();
  std::vector<CacheTokens> ask, exact;
  std::vector<GenericKvCacheHandle*> asked;
  std::vector<std::pair<GenericKvCacheHandle*, int64_t>> covered;  // room for now, maybe not ahead
  for (const auto& [h, tokens] : items) {
    if (h == nullptr || h->transport_.get() != transport) {
      return absl::InvalidArgumentError("reserve: every handle must come from the same Client");
    }
    KVARENA_RETURN_IF_ERROR(h->CheckLocal("reserve"));
    if (tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("reserve: cache ", h->cache_id(), " tokens=", tokens, " < 0"));
    }
    KVARENA_RETURN_IF_ERROR(h->EnsureTable("reserve"));
    absl::MutexLock lock(&h->state_->mu);
    const int64_t seq = h->state_->table.SeqLen();
    const bool within_max = h->max_tokens() == 0 || seq + tokens <= h->max_tokens();
    if (within_max && seq + tokens <= h->state_->table.Capacity()) {  // no RPC for this one
      covered.emplace_back(h, tokens);
      continue;
    }
    ask.push_back({h->cache_id(), AheadOf(seq, tokens, h->state_->reserve_ahead, h->page_size(),
                                          h->max_tokens())});
    exact.push_back({h->cache_id(), tokens});
    asked.push_back(h);
  }
  if (ask.empty()) return absl::OkStatus();
  // The RPC is made anyway: it also tops up the caches that would need one within their
  // reserve_ahead, so a batch whose caches cross page boundaries at different steps makes
  // about one Reserve per page, not one per cache per page.
  const size_t needed = ask.size();
  for (const auto& [h, tokens] : covered) {
    absl::MutexLock lock(&h->state_->mu);
    const int64_t seq = h->state_->table.SeqLen();
    const int64_t ahead = std::max(tokens, h->state_->reserve_ahead);
    const int64_t end = h->max_tokens() > 0 ? std::min(seq + ahead, h->max_tokens()) : seq + ahead;
    if (end <= h->state_->table.Capacity()) continue;
    ask.push_back({h->cache_id(), AheadOf(seq, tokens, h->state_->reserve_ahead, h->page_size(),
                                          h->max_tokens())});
    asked.push_back(h);
  }
  auto reserved = transport->Reserve(ask);
  if (absl::IsResourceExhausted(reserved.status())) {
    bool ahead = ask.size() > needed;
    for (size_t i = 0; i < needed; ++i) ahead |= ask[i].tokens != exact[i].tokens;
    if (ahead) {  // room for what was asked, at least
      asked.resize(needed);
      reserved = transport->Reserve(exact);
    }
  }
  if (!reserved.ok()) {
    return asked.size() == 1 ? asked.front()->Observe(reserved.status()) : reserved.status();
  }
  for (size_t i = 0; i < asked.size(); ++i) {
    GenericKvCacheHandle* h = asked[i];
    auto it = std::find_if(reserved->begin(), reserved->end(),
                           [h](const ReserveResult& r) { return r.cache_id == h->cache_id(); });
    bool merged = false;
    {
      absl::MutexLock lock(&h->state_->mu);
      merged = it != reserved->end() && h->state_->table.MergeReserve(*it).ok();
      if (!merged) h->state_->table.MarkStale();
    }
    // The cache changed behind the table (another handle, served writes): read it whole.
    if (!merged) {
      KVARENA_RETURN_IF_ERROR(h->EnsureTable("reserve"));
    }
  }
  return absl::OkStatus();
}

absl::Status GenericKvCacheHandle::CommitAll(const HandleTokens& items) {
  if (items.empty()) return absl::OkStatus();
  Transport* transport = items.front().first->transport_.get();
  std::vector<CacheTokens> commit;
  for (const auto& [h, tokens] : items) {
    if (h == nullptr || h->transport_.get() != transport) {
      return absl::InvalidArgumentError("commit: every handle must come from the same Client");
    }
    KVARENA_RETURN_IF_ERROR(h->CheckLocal("commit"));
    if (tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("commit: cache ", h->cache_id(), " tokens=", tokens, " < 0"));
    }
    // Layers written here must all have written exactly `tokens`: committing a layer that
    // was not written would publish whatever its pages held.
    client_internal::CacheState* state = h->state_.get();
    absl::MutexLock lock(&state->mu);
    bool any = false;
    for (int l = 0; l < state->table.num_layers(); ++l) any |= Pending(state->table.layer(l)) != 0;
    for (int l = 0; any && l < state->table.num_layers(); ++l) {
      const int64_t pending = Pending(state->table.layer(l));
      if (pending != tokens) {
        return absl::FailedPreconditionError(
            absl::StrCat("commit: cache ", h->cache_id(), " tokens=", tokens, " but layer ", l,
                         " wrote ", pending, " tokens locally since the last commit"));
      }
    }
    commit.push_back({h->cache_id(), tokens});
  }
  // A sliding window evicts pages as the commit advances the lengths ("Page lifetime").
  const bool evicts = std::any_of(items.begin(), items.end(), [](const auto& item) {
    // ...and with a prefix namespace, other caches may adopt what
    // it commits: the local writes must have landed.
    return item.first->HasSlidingLayer() || item.first->PublishesPages();
  });
  if (evicts) {
    KVARENA_RETURN_IF_ERROR(items.front().first->FinishLocalKernels("commit"));
  }
  auto infos = transport->Commit(commit);
  if (!infos.ok()) {
    return items.size() == 1 ? items.front().first->Observe(infos.status()) : infos.status();
  }
  for (size_t i = 0; i < items.size() && i < infos->size(); ++i) {
    items[i].first->state_->Committed((*infos)[i], items[i].second);
  }
  return absl::OkStatus();
}

absl::Status GenericKvCacheHandle::append_local(int layer, const TensorArg& k, const TensorArg& v) {
  return WriteLocal("append_local", layer, nullptr, k, v, {}, nullptr);
}

absl::StatusOr<TensorOut> GenericKvCacheHandle::attention_local(int layer, const TensorArg& q,
                                                                const TensorArg& k,
                                                                const TensorArg& v,
                                                                const AttentionOptions& opts) {
  TensorOut out;
  KVARENA_RETURN_IF_ERROR(WriteLocal("attention_local", layer, &q, k, v, opts, &out));
  return out;
}

absl::Status GenericKvCacheHandle::WriteLocal(const char* op, int layer, const TensorArg* q,
                                              const TensorArg& k, const TensorArg& v,
                                              const AttentionOptions& opts, TensorOut* out) {
  KVARENA_RETURN_IF_ERROR(CheckLocal(op));
  KVARENA_RETURN_IF_ERROR(CheckLayer(op, layer));
  const CacheSpec& spec = info_.spec;
  uint8_t* base = nullptr;
  KvKernels* kernels = nullptr;
  KVARENA_RETURN_IF_ERROR(LocalPool(op, &base, &kernels));
  // The same checks as the served path, within what these kernels index.
  const KernelLimits reach = kernels->limits();
  const RequestLimits limits = LimitsFor(reach, reach.max_positions);
  int64_t nq = 0;
  if (q != nullptr) {
    out->data.resize(q->bytes);
    KVARENA_ASSIGN_OR_RETURN(
        auto n, CheckQuery(op, spec, *q, out->data.data(), out->data.size(), opts.scale, limits));
    nq = n;
  }
  KVARENA_ASSIGN_OR_RETURN(
      auto nk, CheckTensor(op, "k", k, spec.dtype, spec.num_kv_heads, spec.head_dim, limits));
  KVARENA_ASSIGN_OR_RETURN(
      auto nv, CheckTensor(op, "v", v, spec.dtype, spec.num_kv_heads, spec.head_dim, limits));
  if (nk != nv || (q != nullptr && nq != nk)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": k has ", nk, " tokens, v ", nv,
                                                   q != nullptr ? absl::StrCat(", q ", nq) : ""));
  }
  const int64_t n = nk;
  KVARENA_RETURN_IF_ERROR(EnsureTable(op));

  std::vector<int32_t> blocks;  // a snapshot: a concurrent reserve may grow the table
  int64_t first_pos = 0, pos = 0;
  {
    absl::MutexLock lock(&state_->mu);
    const LayerPages& l = state_->table.layer(layer);
    pos = l.written;
    if (auto s = CheckGrowth(op, absl::StrCat("layer ", layer, " length"), pos, n, limits);
        !s.ok()) {
      return s;
    }
    if (pos + n > l.end(page_size())) {
      return absl::FailedPreconditionError(
          absl::StrCat(op, ": cache ", cache_id(), " layer ", layer, " needs pages up to position ",
                       pos + n, " but holds pages up to ", l.end(page_size()), "; call reserve(",
                       pos + n - l.len, ") first"));
    }
    // Pages come whole, so they may reach past max_tokens; the tokens may not (as append).
    if (max_tokens() > 0 && pos + n > max_tokens()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          op, ": layer ", layer, " would hold ", pos + n, " tokens but max_tokens=", max_tokens()));
    }
    blocks = l.page_ids;
    first_pos = l.first_pos;
  }
  PagedKvView view;
  view.layout = layout();
  view.pool_base = base;
  view.block_table = blocks.data();
  view.first_block = first_pos / page_size();
  view.num_blocks = int64_t(blocks.size());
  view.len = pos + n;
  SetStaticScales(info_.spec, layer, &view);
  if (auto s = kernels->AppendKv(view, pos, n, k.data, v.data); !s.ok()) {
    return absl::InternalError(absl::StrCat(op, ": layer ", layer, ": ", s.message()));
  }
  {
    absl::MutexLock lock(&state_->mu);
    state_->table.layer(layer).written += n;
  }
  if (q == nullptr) return absl::OkStatus();
  AttentionParams p;
  p.num_q_heads = int(q->shape[1]);
  p.q_pos = pos;
  p.n = n;
  p.scale = AttentionScale(opts.scale, head_dim());
  p.window = EffectiveWindow(spec.layer_windows[size_t(layer)], opts.window);
  if (auto s = kernels->PagedAttention(view, p, q->data, out->data.data()); !s.ok()) {
    return absl::InternalError(absl::StrCat(op, ": layer ", layer, ": ", s.message()));
  }
  out->dtype = q->dtype;
  out->shape = q->shape;
  return absl::OkStatus();
}

absl::StatusOr<GetKvResult> GenericKvCacheHandle::get_kv_local(int layer, bool raw) const {
  const char* op = "get_kv_local";
  KVARENA_RETURN_IF_ERROR(CheckUsable(op));
  KVARENA_RETURN_IF_ERROR(CheckLayer(op, layer));
  uint8_t* base = nullptr;
  KvKernels* kernels = nullptr;
  KVARENA_RETURN_IF_ERROR(LocalPool(op, &base, &kernels));
  auto lp = Pages(op, layer);  // fresh from the arena, narrowed by with_sequence_length
  KVARENA_RETURN_IF_ERROR(lp.status());
  const int64_t n = std::max<int64_t>(0, lp->len - lp->first_pos);
  PagedKvView view;
  view.layout = layout();
  view.pool_base = base;
  view.block_table = lp->page_ids.data();
  view.first_block = lp->first_pos / page_size();
  view.num_blocks = int64_t(lp->page_ids.size());
  view.len = lp->len;
  SetStaticScales(info_.spec, layer, &view);
  GetKvResult r;
  r.first_pos = lp->first_pos;
  r.layer_len = lp->len;
  absl::Status s;
  if (raw && view.layout.format() != NativeKvFormat(dtype())) {
    s = ReadRawKv(*kernels, view, lp->first_pos, n, &r);
  } else {
    r.kv_format = NativeKvFormat(dtype());
    const size_t bytes = size_t(*TensorBytes(dtype(), num_kv_heads(), n, head_dim()));  // n is held
    for (TensorOut* o : {&r.k, &r.v}) {
      o->dtype = dtype();
      o->shape = {1, num_kv_heads(), n, head_dim()};
      o->data.resize(bytes);
    }
    if (n > 0) s = kernels->GatherKv(view, lp->first_pos, n, r.k.data.data(), r.v.data.data());
  }
  if (!s.ok()) return absl::InternalError(absl::StrCat(op, ": layer ", layer, ": ", s.message()));
  return r;
}

absl::Status Client::Reserve(const CacheTokenList& items) {
  if (!connected()) return transport_->DisconnectedStatus();
  for (const auto& [h, n] : items) {
    if (h == nullptr || h->transport_ != transport_) {
      return absl::InvalidArgumentError("reserve: a handle of another Client (or null)");
    }
  }
  return GenericKvCacheHandle::ReserveAll(Raw(items));
}

absl::Status Client::Commit(const CacheTokenList& items) {
  if (!connected()) return transport_->DisconnectedStatus();
  for (const auto& [h, n] : items) {
    if (h == nullptr || h->transport_ != transport_) {
      return absl::InvalidArgumentError("commit: a handle of another Client (or null)");
    }
  }
  return GenericKvCacheHandle::CommitAll(Raw(items));
}

CallCounts Client::call_counts() const {
  const client_internal::CallCounters& c = transport_->counters();
  return CallCounts{c.reserve.load(), c.commit.load(), c.describe.load()};
}

}  // namespace kvarena
