#include "tests/stress/actor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace kvarena::stress {

using testing::HostTensor;
using testing::KvHistory;

namespace {

// The geometries caches are drawn from: four pools (kv_heads, head_dim, dtype, page_size).
struct Geometry {
  int kv_heads;
  int head_dim;
  DType dtype;
  int page_size;
};
constexpr Geometry kGeometries[] = {{2, 16, DType::kFloat32, 16},
                                    {1, 32, DType::kFloat16, 8},
                                    {2, 32, DType::kBFloat16, 16},
                                    {4, 16, DType::kFloat16, 4}};
constexpr Geometry kFillGeometry = {2, 32, DType::kFloat16, 16};

absl::Status Annotate(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

struct Actor::Tracked {
  std::shared_ptr<GenericKvCacheHandle> h;
  std::vector<KvHistory> layers;
  int q_heads = 0;

  int64_t len(int layer) const { return layers[size_t(layer)].len(); }
  bool ragged() const {
    for (const KvHistory& l : layers) {
      if (l.len() != layers[0].len()) return true;
    }
    return false;
  }
  bool sliding() const {
    for (int w : h->layer_windows()) {
      if (w > 0) return true;
    }
    return false;
  }
  int64_t longest() const {
    int64_t n = 0;
    for (const KvHistory& l : layers) n = std::max(n, l.len());
    return n;
  }
};

const char* OpName(OpKind kind) {
  static constexpr const char* kNames[kNumOpKinds] = {"allocate",      "append", "attend",
                                                      "attend_cached", "popn",   "reset",
                                                      "release",       "local",  "verify"};
  return kNames[int(kind)];
}

void Tally::Add(const Tally& other) {
  for (int i = 0; i < kNumOpKinds; ++i) ops[size_t(i)] += other.ops[size_t(i)];
  for (const auto& [k, n] : other.errors) errors[k] += n;
  popn_refused += other.popn_refused;
}

int64_t Tally::total_ops() const {
  int64_t n = 0;
  for (int64_t c : ops) n += c;
  return n;
}

int64_t Tally::exhausted() const {
  int64_t n = 0;
  for (const auto& [k, c] : errors) {
    if (k.find(":RESOURCE_EXHAUSTED") != std::string::npos) n += c;
  }
  return n;
}

std::string Tally::ToString() const {
  std::string out = absl::StrCat("ops=", total_ops());
  for (int i = 0; i < kNumOpKinds; ++i)
    absl::StrAppend(&out, " ", OpName(OpKind(i)), "=", ops[size_t(i)]);
  int64_t errs = 0;
  for (const auto& [k, n] : errors) errs += n;
  absl::StrAppend(&out, " errors=", errs);
  for (const auto& [k, n] : errors) absl::StrAppend(&out, " ", k, "=", n);
  absl::StrAppend(&out, " popn_refused=", popn_refused);
  return out;
}

Actor::Actor(std::shared_ptr<Client> client, uint64_t seed, ActorOptions options)
    : client_(std::move(client)), rng_(seed), options_(options) {}

Actor::~Actor() = default;

std::vector<std::shared_ptr<GenericKvCacheHandle>> Actor::handles() const {
  std::vector<std::shared_ptr<GenericKvCacheHandle>> out;
  for (const auto& c : caches_) out.push_back(c->h);
  return out;
}

int64_t Actor::Tokens(bool local) {
  std::uniform_int_distribution<int> pct(0, 99);
  if (options_.fill) return std::uniform_int_distribution<int64_t>(16, 64)(rng_);
  if (pct(rng_) < 70) return std::uniform_int_distribution<int64_t>(1, local ? 1 : 3)(rng_);
  return std::uniform_int_distribution<int64_t>(4, local ? 16 : 24)(rng_);
}

HostTensor Actor::Random(const Tracked& c, int heads, int64_t n) {
  return testing::RandomTensor(rng_, c.h->dtype(), heads, n, c.h->head_dim());
}

absl::Status Actor::Step() {
  std::uniform_int_distribution<int> pct(0, 99);
  if (caches_.empty() || (int(caches_.size()) < options_.max_caches && pct(rng_) < 8)) {
    ++tally_.ops[size_t(OpKind::kAllocate)];
    return Allocate();
  }
  const size_t index = std::uniform_int_distribution<size_t>(0, caches_.size() - 1)(rng_);
  Tracked& c = *caches_[index];
  const int r = pct(rng_);
  OpKind op;
  if (c.longest() > options_.max_len) {
    op = r < 50 ? OpKind::kReset : OpKind::kRelease;
  } else if (options_.fill) {
    op = r < 45   ? OpKind::kAppend
         : r < 85 ? OpKind::kLocal
         : r < 90 ? OpKind::kPopn
         : r < 94 ? OpKind::kVerify
         : r < 97 ? OpKind::kReset
                  : OpKind::kRelease;
  } else {
    op = r < 18   ? OpKind::kAppend
         : r < 40 ? OpKind::kAttend
         : r < 48 ? OpKind::kAttendCached
         : r < 60 ? OpKind::kPopn
         : r < 64 ? OpKind::kReset
         : r < 68 ? OpKind::kRelease
         : r < 92 ? OpKind::kLocal
                  : OpKind::kVerify;
  }
  // A ragged cache takes no popn and no local step (both work on whole tokens).
  if (c.ragged() && (op == OpKind::kPopn || op == OpKind::kLocal)) op = OpKind::kAppend;
  ++tally_.ops[size_t(op)];
  switch (op) {
    case OpKind::kAppend:
      return Append(c, /*attend=*/false);
    case OpKind::kAttend:
      return Append(c, /*attend=*/true);
    case OpKind::kAttendCached:
      return AttendCached(c);
    case OpKind::kPopn:
      return Popn(c);
    case OpKind::kReset:
      return Reset(c);
    case OpKind::kRelease:
      return Release(index);
    case OpKind::kLocal:
      return Local(c);
    case OpKind::kVerify:
      return Verify(c);
    case OpKind::kAllocate:
      break;
  }
  return Allocate();
}

absl::Status Actor::Allocate() {
  std::uniform_int_distribution<int> pct(0, 99);
  const Geometry g = options_.fill ? kFillGeometry
                                   : kGeometries[std::uniform_int_distribution<size_t>(0, 3)(rng_)];
  CacheSpec spec;
  spec.num_layers = std::uniform_int_distribution<int>(2, 3)(rng_);
  spec.num_kv_heads = g.kv_heads;
  spec.head_dim = g.head_dim;
  spec.dtype = g.dtype;
  spec.page_size = g.page_size;
  if (pct(rng_) < 35) {  // sliding odd layers
    const int w = pct(rng_) < 50 ? 8 : 20;
    for (int l = 0; l < spec.num_layers; ++l) spec.layer_windows.push_back(l % 2 ? w : 0);
  }
  if (!options_.fill && pct(rng_) < 25) spec.max_tokens = 48;
  auto h = client_->Allocate(spec);
  if (!h.ok()) {
    if (options_.arena_may_fill && h.status().code() == absl::StatusCode::kResourceExhausted) {
      ++tally_.errors["allocate:RESOURCE_EXHAUSTED"];
      return absl::OkStatus();
    }
    return Annotate(h.status(), "allocate");
  }
  auto c = std::make_unique<Tracked>();
  c->h = *h;
  c->q_heads = 2 * g.kv_heads;
  for (int l = 0; l < spec.num_layers; ++l) c->layers.emplace_back(g.kv_heads, g.head_dim);
  caches_.push_back(std::move(c));
  return absl::OkStatus();
}

absl::Status Actor::Judge(OpKind op, const absl::Status& s, const Tracked& c, int64_t len,
                          int64_t n) {
  const int64_t cap = c.h->max_tokens();
  const bool over_cap = cap > 0 && n > cap - len;
  if (s.ok()) {
    if (over_cap) {
      return absl::InternalError(absl::StrCat(OpName(op), " of ", n, " tokens at ", len, " on ",
                                              c.h->cache_id(), " passed max_tokens=", cap));
    }
    return s;
  }
  if (s.code() == absl::StatusCode::kResourceExhausted && (over_cap || options_.arena_may_fill)) {
    ++tally_.errors[absl::StrCat(OpName(op), ":RESOURCE_EXHAUSTED")];
    return absl::OkStatus();
  }
  return Annotate(s,
                  absl::StrCat(OpName(op), " of ", n, " tokens at ", len, " on ", c.h->cache_id()));
}

absl::Status Actor::Append(Tracked& c, bool attend) {
  const OpKind op = attend ? OpKind::kAttend : OpKind::kAppend;
  const int64_t n = Tokens(false);
  for (int layer = 0; layer < c.h->num_layers(); ++layer) {
    const int64_t pos = c.len(layer);
    HostTensor k = Random(c, c.h->num_kv_heads(), n), v = Random(c, c.h->num_kv_heads(), n);
    if (!attend) {
      auto r = c.h->append(layer, k.arg(), v.arg());
      const absl::Status judged = Judge(op, r.status(), c, pos, n);
      if (!judged.ok() || !r.ok()) return judged;  // a refusal stops here: the cache may be ragged
      if (r->layer_len != pos + n) {
        return absl::InternalError(absl::StrCat("append on ", c.h->cache_id(), " layer ", layer,
                                                ": layer_len ", r->layer_len, ", want ", pos + n));
      }
      c.layers[size_t(layer)].Append(k, v);
      continue;
    }
    HostTensor q = Random(c, c.q_heads, n);
    auto out = c.h->attention(layer, q.arg(), k.arg(), v.arg());
    const absl::Status judged = Judge(op, out.status(), c, pos, n);
    if (!judged.ok() || !out.ok()) return judged;
    c.layers[size_t(layer)].Append(k, v);
    const auto ref =
        c.layers[size_t(layer)].Attention(q, pos, 0, c.h->layer_windows()[size_t(layer)]);
    KVARENA_RETURN_IF_ERROR(testing::CompareOutput(
        absl::StrCat("attend on ", c.h->cache_id(), " layer ", layer, " pos ", pos), *out, ref));
  }
  return absl::OkStatus();
}

absl::Status Actor::AttendCached(Tracked& c) {
  const int layer = 0;  // always global (sliding layers are the odd ones)
  const int64_t len = c.len(layer);
  if (len == 0) return absl::OkStatus();
  const int64_t n = std::uniform_int_distribution<int64_t>(1, std::min<int64_t>(4, len))(rng_);
  const int64_t pos = std::uniform_int_distribution<int64_t>(0, len - n)(rng_);
  HostTensor q = Random(c, c.q_heads, n);
  auto out = c.h->attention(layer, pos, q.arg());
  if (!out.ok()) {
    return Annotate(out.status(), absl::StrCat("attend_cached on ", c.h->cache_id(), " pos ", pos));
  }
  return testing::CompareOutput(absl::StrCat("attend_cached on ", c.h->cache_id(), " pos ", pos),
                                *out, c.layers[0].Attention(q, pos, 0, 0));
}

absl::Status Actor::Popn(Tracked& c) {
  const int64_t len = c.len(0);
  std::uniform_int_distribution<int> pct(0, 99);
  // Mostly a draft's rollback (1..6 tokens, at most what is there); sometimes too many.
  const int64_t n =
      len == 0 || pct(rng_) < 10
          ? len + std::uniform_int_distribution<int64_t>(1, 4)(rng_)
          : std::uniform_int_distribution<int64_t>(1, std::min<int64_t>(6, len))(rng_);
  auto r = c.h->popn(n);
  if (!r.ok()) return Annotate(r.status(), absl::StrCat("popn(", n, ") on ", c.h->cache_id()));
  const std::string what = absl::StrCat("popn(", n, ") at ", len, " on ", c.h->cache_id());
  if (r->popped == 0) {
    // Refused: too many tokens, or a sliding layer evicted what the rollback needs.
    if (n <= len && !c.sliding()) {
      return absl::InternalError(
          absl::StrCat(what, " refused on a cache with no sliding layer: ", r->refusal));
    }
    ++tally_.popn_refused;
    return r->seq_len == len
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat(what, " refused but seq_len is ", r->seq_len));
  }
  if (r->popped != n || n > len || r->seq_len != len - n) {
    return absl::InternalError(
        absl::StrCat(what, ": popped ", r->popped, ", seq_len ", r->seq_len));
  }
  for (KvHistory& l : c.layers) l.Truncate(len - n);
  return absl::OkStatus();
}

absl::Status Actor::Reset(Tracked& c) {
  const bool keep_pages = std::uniform_int_distribution<int>(0, 1)(rng_) == 1;
  KVARENA_RETURN_IF_ERROR(c.h->reset(keep_pages));
  for (KvHistory& l : c.layers) l = KvHistory(c.h->num_kv_heads(), c.h->head_dim());
  if (c.h->num_tokens() != 0) {
    return absl::InternalError(
        absl::StrCat("reset on ", c.h->cache_id(), ": num_tokens() = ", c.h->num_tokens()));
  }
  return absl::OkStatus();
}

absl::Status Actor::Release(size_t index) {
  Tracked& c = *caches_[index];
  KVARENA_RETURN_IF_ERROR(Annotate(c.h->release(), absl::StrCat("release ", c.h->cache_id())));
  if (c.h->is_valid()) return absl::InternalError("is_valid() after release()");
  caches_.erase(caches_.begin() + std::ptrdiff_t(index));
  return absl::OkStatus();
}

absl::Status Actor::Local(Tracked& c) {
  const int64_t len = c.len(0);
  const int64_t n = Tokens(true);
  const absl::Status reserved = c.h->reserve(n);
  KVARENA_RETURN_IF_ERROR(Judge(OpKind::kLocal, reserved, c, len, n));
  if (!reserved.ok()) return absl::OkStatus();  // an allowed refusal: nothing was reserved
  std::uniform_int_distribution<int> pct(0, 99);
  for (int layer = 0; layer < c.h->num_layers(); ++layer) {
    HostTensor k = Random(c, c.h->num_kv_heads(), n), v = Random(c, c.h->num_kv_heads(), n);
    const std::string what =
        absl::StrCat("local on ", c.h->cache_id(), " layer ", layer, " pos ", len);
    if (pct(rng_) < 30) {
      KVARENA_RETURN_IF_ERROR(Annotate(c.h->append_local(layer, k.arg(), v.arg()), what));
      c.layers[size_t(layer)].Append(k, v);
      continue;
    }
    HostTensor q = Random(c, c.q_heads, n);
    auto out = c.h->attention_local(layer, q.arg(), k.arg(), v.arg());
    if (!out.ok()) return Annotate(out.status(), what);
    c.layers[size_t(layer)].Append(k, v);
    KVARENA_RETURN_IF_ERROR(testing::CompareOutput(
        what, *out,
        c.layers[size_t(layer)].Attention(q, len, 0, c.h->layer_windows()[size_t(layer)])));
  }
  return Annotate(c.h->commit(n), absl::StrCat("commit(", n, ") on ", c.h->cache_id()));
}

absl::Status Actor::Verify(const Tracked& c) const {
  auto d = c.h->describe();
  if (!d.ok()) return Annotate(d.status(), absl::StrCat("describe ", c.h->cache_id()));
  for (int layer = 0; layer < c.h->num_layers(); ++layer) {
    const std::string what = absl::StrCat("get_kv ", c.h->cache_id(), " layer ", layer);
    const KvHistory& want = c.layers[size_t(layer)];
    if (d->info.layer_lens[size_t(layer)] != want.len()) {
      return absl::InternalError(absl::StrCat(what, ": describe says ",
                                              d->info.layer_lens[size_t(layer)], " tokens, ",
                                              want.len(), " were written"));
    }
    auto kv = c.h->get_kv(layer);
    if (!kv.ok()) return Annotate(kv.status(), what);
    if (c.h->layer_windows()[size_t(layer)] == 0 && kv->first_pos != 0) {
      return absl::InternalError(
          absl::StrCat(what, ": first_pos ", kv->first_pos, " on a global layer"));
    }
    // Bit for bit: the bytes sent, re-encoded from the copy, against the bytes read back.
    for (int part = 0; part < 2; ++part) {
      const TensorOut& got = part == 0 ? kv->k : kv->v;
      const std::vector<double> values = want.HeadMajor(part, kv->first_pos);
      if (got.data != testing::EncodeValues(values, c.h->dtype())) {
        KVARENA_RETURN_IF_ERROR(
            testing::CompareExact(absl::StrCat(what, part == 0 ? " k" : " v"), got, values));
        return absl::InternalError(absl::StrCat(what, part == 0 ? " k" : " v", ": bytes differ"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Actor::VerifyAll() {
  for (const auto& c : caches_) KVARENA_RETURN_IF_ERROR(Verify(*c));
  return absl::OkStatus();
}

absl::Status Actor::ReleaseAll() {
  while (!caches_.empty()) KVARENA_RETURN_IF_ERROR(Release(caches_.size() - 1));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Actor::PageLines() const {
  std::vector<std::string> lines;
  for (const auto& c : caches_) {
    auto d = c->h->describe();
    if (!d.ok()) return Annotate(d.status(), absl::StrCat("describe ", c->h->cache_id()));
    std::vector<int32_t> pages;
    for (const LayerPages& l : d->layers)
      pages.insert(pages.end(), l.page_ids.begin(), l.page_ids.end());
    lines.push_back(absl::StrCat("cache ", c->h->cache_id(), " pool ", d->info.pool_id, " pages ",
                                 pages.empty() ? "-" : absl::StrJoin(pages, ",")));
  }
  return lines;
}

}  // namespace kvarena::stress
