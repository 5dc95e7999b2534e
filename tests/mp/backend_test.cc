// Workers that use their own mapping of the daemon's pool, against each backend: host
// memfd pages (everywhere), and CUDA VMM device memory with the CUDA kernels on both
// sides (only where kvarenad has CUDA and a device is usable; skipped elsewhere).
#include <regex>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/mp/mp_fixture.h"
#if defined(KVARENAD_CUDA)
#include "arena/cuda/cuda_region.h"
#endif

namespace kvarena::testing {
namespace {

using ::testing::HasSubstr;

bool CudaUsable() {
#if defined(KVARENAD_CUDA)
  return CudaDevicePresent();
#else
  return false;
#endif
}

class BackendWorkersTest : public MultiProcessTest,
                           public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    MultiProcessTest::SetUp();
    if (GetParam() == "cuda" && !CudaUsable()) GTEST_SKIP() << "no CUDA backend or device here";
    StartDaemon("1s", GetParam());
  }
  // What the worker's handle reports as its device.
  std::string Device() const { return GetParam() == "cuda" ? "cuda:0" : "cpu"; }
};

// Served path: the daemon writes every K/V (its kernels, its pages); the worker reads them
// back through its own mapping of the pool and gets get_kv's bytes.
TEST_P(BackendWorkersTest, WorkerReadsTheDaemonsKvThroughItsMapping) {
  auto w = StartWorker(31, {"--check_mapping", "--layers=3", "--decode=40", "--window=16",
                            "--dtype=bfloat16", "--print_every=100"});
  ExpectExitsOk(*w, "worker");
  EXPECT_THAT(w->output(), HasSubstr("device " + Device()));
  EXPECT_THAT(w->output(), HasSubstr("mapping ok: 3 layers"));
}

// Local path: the worker writes K/V and attends with its own kernels (CUDA ones on a CUDA
// pool) in lockstep with a served twin; outputs are bit-identical and get_kv /
// get_kv_local equal what was written. 8 kv heads of 128 in float16 make 64 KiB pages,
// 32 to a 2 MiB chunk: the two caches grow the pool by chunks during the decode, and the
// worker maps each as its Reserve returns. The second round runs after both caches were
// released (the daemon decommitted all but one chunk) and grows the pool again over the
// same offsets: new memory the worker's mapping must pick up in place of the old.
TEST_P(BackendWorkersTest, LocalPathDecodeAcrossPoolGrowthMatchesServedPath) {
  auto w = StartWorker(32, {"--local", "--check_mapping", "--rounds=2", "--layers=4",
                            "--kv_heads=8", "--q_heads=16", "--head_dim=128", "--decode=300",
                            "--window=24", "--dtype=float16", "--print_every=100"});
  ExpectExitsOk(*w, "local worker");
  const std::string out = w->output();
  EXPECT_THAT(out, HasSubstr("device " + Device()));
  EXPECT_THAT(out, HasSubstr("local path: decode_steps 300"));
  EXPECT_THAT(out, HasSubstr("mapping ok: 4 layers"));
  EXPECT_THAT(out, HasSubstr("round 2/2 ok"));
  auto st = Observer()->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->backend, GetParam());
  EXPECT_EQ(WaitForArenaPages([](int64_t p) { return p == 0; }), 0);
}

// The batched local path (DecodeBatch) over the worker's mapping: on a CUDA pool it runs
// the CUDA kernels sequence by sequence (DESIGN.md, "Where the code differs from the
// brief"); outputs match the float64 reference either way (the worker checks).
TEST_P(BackendWorkersTest, BatchWorkerDecodesThroughItsMapping) {
  auto w = StartProgram(KVARENA_BATCH_WORKER_PATH, {absl::StrCat("--seed=", uint64_t{seed_}),
                                                    "--batch=5", "--head_dim=64", "--steps=30"});
  ExpectExitsOk(*w, "batch worker");
  EXPECT_THAT(w->output(), HasSubstr("batch worker ok"));
  EXPECT_EQ(WaitForArenaPages([](int64_t p) { return p == 0; }), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendWorkersTest, ::testing::Values("host", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace kvarena::testing
