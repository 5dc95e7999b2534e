// The one in-process client fixture of the client tests: a Client connected to "inproc:"
// (the daemon's core in this process, so views into the pool are real pointers), and the
// allocation every test repeats. Not thread-safe; one per test.
#ifndef KVARENA_TESTS_SUPPORT_INPROC_FIXTURE_H_
#define KVARENA_TESTS_SUPPORT_INPROC_FIXTURE_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "tests/support/status_matchers.h"

namespace kvarena::testing {

// Options of an "inproc:" client: an arena of arena_bytes and num_threads CPU threads for
// the kernels (0: the caller's thread).
inline ClientOptions InprocOptions(int num_threads, size_t arena_bytes = size_t{64} << 20) {
  ClientOptions options;
  options.arena_bytes = arena_bytes;
  options.num_threads = num_threads;
  return options;
}

// A CacheSpec of this geometry; the rest (windows, max_tokens, namespace) left to set.
inline CacheSpec MakeSpec(int num_layers, int num_kv_heads, int head_dim, DType dtype,
                          int page_size) {
  CacheSpec spec;
  spec.num_layers = num_layers;
  spec.num_kv_heads = num_kv_heads;
  spec.head_dim = head_dim;
  spec.dtype = dtype;
  spec.page_size = page_size;
  return spec;
}

// A fixture (over ::testing::Test or ::testing::TestWithParam<T>) whose SetUp connects
// client_ to "inproc:" with the options given at construction.
template <typename Base = ::testing::Test>
class InprocClientFixture : public Base {
 protected:
  explicit InprocClientFixture(ClientOptions options = InprocOptions(1))
      : options_(std::move(options)) {}

  void SetUp() override {
    absl::StatusOr<std::shared_ptr<Client>> c = Client::Connect("inproc:", options_);
    ASSERT_THAT(c, IsOk());
    client_ = *c;
  }

  // A cache of spec; nullptr, with the test failed, when the client refuses it.
  std::shared_ptr<GenericKvCacheHandle> NewCache(const CacheSpec& spec) {
    absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> h = client_->Allocate(spec);
    EXPECT_THAT(h, IsOk());
    return h.ok() ? *h : nullptr;
  }

  ClientOptions options_;
  std::shared_ptr<Client> client_;
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_INPROC_FIXTURE_H_
