// Page allocation throughput: alloc+free pairs per second on one pool, single pages and
// batches (what a Reserve for a decode batch does), from 1 and 2 threads.
#include <memory>
#include <vector>

#include "arena/region.h"
#include "benchmark/benchmark.h"
#include "core/page_pool.h"

namespace kvarena {
namespace {

struct Fixture {
  Fixture() : backend(NewHostBackend()), budget(size_t{1} << 30) {
    pool = *PagePool::Create(0, PageLayout{DType::kFloat16, 16, 8, 128}, backend.get(), &budget, 1);
  }
  std::unique_ptr<Backend> backend;
  ArenaBudget budget;
  std::unique_ptr<PagePool> pool;
};

Fixture& Shared() {
  static Fixture* f = new Fixture();
  return *f;
}

// Each iteration allocates `batch` pages and frees them: 2 * batch page operations.
void BM_AllocFree(benchmark::State& state) {
  const int64_t batch = state.range(0);
  PagePool& pool = *Shared().pool;
  // Keep some pages live so the pool is not trivially empty.
  std::vector<int32_t> live, ids;
  if (state.thread_index() == 0) (void)pool.Allocate(1000, &live);
  ids.reserve(size_t(batch));
  for (auto _ : state) {
    ids.clear();
    if (!pool.Allocate(batch, &ids).ok()) state.SkipWithError("allocate failed");
    pool.Free(ids);
  }
  pool.Free(live);
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["alloc+free/s"] =
      benchmark::Counter(double(state.iterations() * batch), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AllocFree)->Arg(1)->Arg(16)->Arg(256)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace
}  // namespace kvarena

BENCHMARK_MAIN();
