// --cpu_pool_awake_us=U for the benchmarks that run a kvarenad child beside an in-process
// KvStore (rpc_bench, decode_loop_bench): how long idle CPU attention workers stay awake,
// one setting given to both sides. Header-only.
#ifndef KVARENA_BENCH_POOL_AWAKE_H_
#define KVARENA_BENCH_POOL_AWAKE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/kv_store.h"

namespace kvarena {

struct PoolAwake {
  static constexpr const char kFlag[] = "--cpu_pool_awake_us=";
  int64_t us = -1;  // < 0: each side keeps its default (kvarenad's --cpu_pool_awake)

  // Takes `arg` if it is --cpu_pool_awake_us=U.
  bool Parse(const std::string& arg) {
    if (arg.rfind(kFlag, 0) != 0) return false;
    us = std::stoll(arg.substr(sizeof(kFlag) - 1));
    return true;
  }
  void AddTo(std::vector<std::string>* daemon_flags) const {
    if (us >= 0) daemon_flags->push_back("--cpu_pool_awake=" + std::to_string(us) + "us");
  }
  void ApplyTo(StoreOptions* options) const {
    if (us >= 0) options->cpu_pool_awake = absl::Microseconds(us);
  }
};

}  // namespace kvarena

#endif  // KVARENA_BENCH_POOL_AWAKE_H_
