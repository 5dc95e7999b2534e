// The four ways bench/decode_loop_bench runs one decode loop (its header says what each
// is), the shape they share and the tensors of a step. Only decode_loop_bench includes it.
#ifndef KVARENA_BENCH_DECODE_LOOP_WAYS_H_
#define KVARENA_BENCH_DECODE_LOOP_WAYS_H_

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/half_tensor.h"
#include "bench/pool_awake.h"
#include "core/kv_store.h"
#include "kvarena/client.h"
#include "kvarena/decode_batch.h"

namespace kvarena::decode_loop {

constexpr int kLayers = 32, kKvHeads = 8, kQHeads = 32, kHeadDim = 128, kBatch = 8;
constexpr int kContext = 2048, kPageSize = 16, kTensorSets = 16;

// A [1, heads, tokens, kHeadDim] float16 tensor that owns its bytes.
struct Half {
  Half(int heads, int tokens, std::mt19937* rng) : shape{1, heads, tokens, kHeadDim} {
    std::uniform_real_distribution<float> dist(-1, 1);
    bytes.resize(size_t(heads) * tokens * kHeadDim * 2);
    for (size_t i = 0; i < bytes.size(); i += 2) {
      const uint16_t h = ToHalf(dist(*rng));
      std::memcpy(&bytes[i], &h, 2);
    }
  }
  TensorArg arg() const { return {DType::kFloat16, shape, bytes.data(), bytes.size()}; }
  std::vector<int64_t> shape;
  std::string bytes;
};

struct StepTensors {  // one decode token of one layer
  Half q, k, v;
  explicit StepTensors(std::mt19937* rng)
      : q(kQHeads, 1, rng), k(kKvHeads, 1, rng), v(kKvHeads, 1, rng) {}
};

inline CacheSpec Spec() {
  return CacheSpec{kLayers, kKvHeads, kHeadDim, DType::kFloat16, kPageSize, {}, 0, ""};
}

inline bool Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "decode_loop_bench: %s: %s\n", what, s.ToString().c_str());
  return false;
}

// One way of running the loop: prefill once, then decode steps on demand.
class Way {
 public:
  virtual ~Way() = default;
  virtual bool Prefill(const Half& k, const Half& v) = 0;
  // One decode step (one token on every layer of every cache) with tensors[layer % n].
  virtual bool Step(const std::vector<StepTensors>& tensors) = 0;
  double seconds = 0;
  int steps = 0;
};

// (a) A KvStore in this process.
class InProcess final : public Way {
 public:
  bool Init(const PoolAwake& awake) {
    StoreOptions o;
    awake.ApplyTo(&o);
    o.arena_bytes = size_t{3} << 30;
    o.default_page_size = kPageSize;
    auto store = KvStore::Create(o, NewHostBackend());
    if (!store.ok()) return Fail("in-process store", store.status());
    store_ = *std::move(store);
    for (int c = 0; c < kBatch; ++c) {
      auto info = store_->Allocate("", Spec(), "");
      if (!info.ok()) return Fail("allocate", info.status());
      ids_.push_back(info->cache_id);
    }
    out_.resize(size_t(kQHeads) * kHeadDim * 2);
    return true;
  }
  bool Prefill(const Half& k, const Half& v) override {
    for (const std::string& id : ids_) {
      for (int l = 0; l < kLayers; ++l) {
        if (auto r = store_->Append("", id, l, 0, k.arg(), v.arg()); !r.ok()) {
          return Fail("prefill", r.status());
        }
      }
    }
    pos_ = kContext;
    return true;
  }
  bool Step(const std::vector<StepTensors>& t) override {
    AttendArgs args;
    args.pos = pos_;
    for (int l = 0; l < kLayers; ++l) {
      const StepTensors& s = t[size_t(l) % t.size()];
      args.layer = l;
      args.q = s.q.arg();
      args.k = s.k.arg();
      args.v = s.v.arg();
      for (const std::string& id : ids_) {
        args.cache_id = id;
        if (auto r = store_->Attend("", args, out_.data(), out_.size()); !r.ok()) {
          return Fail("attend", r.status());
        }
      }
    }
    ++pos_;
    return true;
  }

 private:
  std::unique_ptr<KvStore> store_;
  std::vector<std::string> ids_;
  std::string out_;
  int64_t pos_ = 0;
};

// (b) and (c): caches in the daemon, through one attached client over the Unix socket.
class ThroughDaemon final : public Way {
 public:
  ThroughDaemon(std::shared_ptr<Client> client, bool local)
      : client_(std::move(client)), local_(local) {}
  bool Init() {
    for (int c = 0; c < kBatch; ++c) {
      auto h = client_->Allocate(Spec());
      if (!h.ok()) return Fail("allocate", h.status());
      batch_.emplace_back(*h, 1);
    }
    return true;
  }
  bool Prefill(const Half& k, const Half& v) override {
    CacheTokenList all = batch_;
    for (auto& item : all) item.second = kContext;
    if (auto s = client_->Reserve(all); !s.ok()) return Fail("prefill reserve", s);
    for (auto& [h, n] : batch_) {
      for (int l = 0; l < kLayers; ++l) {
        if (auto s = h->append_local(l, k.arg(), v.arg()); !s.ok()) return Fail("prefill", s);
      }
    }
    if (auto s = client_->Commit(all); !s.ok()) return Fail("prefill commit", s);
    return true;
  }
  bool Step(const std::vector<StepTensors>& t) override {
    if (local_) {
      if (auto s = client_->Reserve(batch_); !s.ok()) return Fail("reserve", s);
    }
    for (int l = 0; l < kLayers; ++l) {
      const StepTensors& s = t[size_t(l) % t.size()];
      for (auto& [h, n] : batch_) {
        auto out = local_ ? h->attention_local(l, s.q.arg(), s.k.arg(), s.v.arg())
                          : h->attention(l, s.q.arg(), s.k.arg(), s.v.arg());
        if (!out.ok()) return Fail(local_ ? "attention_local" : "attention", out.status());
      }
    }
    if (local_) {
      if (auto s = client_->Commit(batch_); !s.ok()) return Fail("commit", s);
    }
    return true;
  }

 private:
  std::shared_ptr<Client> client_;
  const bool local_;
  CacheTokenList batch_;  // every cache, 1 token per step
};

// (d) The batched local path: DecodeBatch over the same daemon's pool, one Plan per step
// (Reserve RPCs only at page boundaries), one Run per layer for the whole batch, one Commit.
class Batched final : public Way {
 public:
  explicit Batched(std::shared_ptr<Client> client) : client_(std::move(client)) {}
  bool Init() {
    for (int c = 0; c < kBatch; ++c) {
      auto h = client_->Allocate(Spec());
      if (!h.ok()) return Fail("allocate", h.status());
      caches_.push_back(*h);
    }
    return true;
  }
  bool Prefill(const Half& k, const Half& v) override {
    CacheTokenList all;
    for (const auto& h : caches_) all.emplace_back(h, kContext);
    if (auto s = client_->Reserve(all); !s.ok()) return Fail("prefill reserve", s);
    for (const auto& h : caches_) {
      for (int l = 0; l < kLayers; ++l) {
        if (auto s = h->append_local(l, k.arg(), v.arg()); !s.ok()) return Fail("prefill", s);
      }
    }
    if (auto s = client_->Commit(all); !s.ok()) return Fail("prefill commit", s);
    auto batch = DecodeBatch::Create(caches_);
    if (!batch.ok()) return Fail("DecodeBatch::Create", batch.status());
    batch_ = *std::move(batch);
    return true;
  }
  // Every sequence gets the same q/k/v as the other ways give each cache.
  void SetTensors(const std::vector<StepTensors>& t) {
    auto stack = [](const Half& h) {
      Stacked s;
      s.shape = h.shape;
      s.shape[0] = kBatch;
      for (int b = 0; b < kBatch; ++b) s.bytes += h.bytes;
      return s;
    };
    for (const StepTensors& x : t) sets_.push_back({stack(x.q), stack(x.k), stack(x.v)});
    out_.resize(sets_[0].q.bytes.size());
  }
  bool Step(const std::vector<StepTensors>& t) override {
    (void)t;  // SetTensors stacked them
    if (auto s = batch_->Plan(); !s.ok()) return Fail("plan", s);
    for (int l = 0; l < kLayers; ++l) {
      const Set& s = sets_[size_t(l) % sets_.size()];
      if (auto st = batch_->Run(l, s.q.arg(), s.k.arg(), s.v.arg(), {out_.data(), out_.size()});
          !st.ok()) {
        return Fail("run", st);
      }
    }
    if (auto s = batch_->Commit(); !s.ok()) return Fail("commit", s);
    return true;
  }

 private:
  struct Stacked {  // [kBatch, heads, 1, kHeadDim]
    std::vector<int64_t> shape;
    std::string bytes;
    TensorArg arg() const { return {DType::kFloat16, shape, bytes.data(), bytes.size()}; }
  };
  struct Set {
    Stacked q, k, v;
  };
  std::shared_ptr<Client> client_;
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches_;
  std::unique_ptr<DecodeBatch> batch_;
  std::vector<Set> sets_;
  std::string out_;
};

}  // namespace kvarena::decode_loop

#endif  // KVARENA_BENCH_DECODE_LOOP_WAYS_H_
