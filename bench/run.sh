#!/usr/bin/env bash
# Runs the benchmarks and prints their tables. Usage: bench/run.sh [quick]
#   BUILD_DIR (default build) must hold a build; scripts/build.sh makes one.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
min_time=0.5
[ "${1:-}" = quick ] && min_time=0.1

echo "== $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"

echo; echo "== Page alloc+free (bench/page_pool_bench)"
"$B/bench/page_pool_bench" --benchmark_min_time=$min_time

echo; echo "== CPU decode attention vs read-only pass vs memcpy (bench/attention_bench)"
"$B/bench/attention_bench" --benchmark_min_time=$min_time

if [ -x "$B/bench/rpc_bench" ]; then
  echo; echo "== RPC latency over a Unix socket vs an empty RPC (bench/rpc_bench)"
  "$B/bench/rpc_bench"
fi
if [ -x "$B/bench/decode_loop_bench" ]; then
  echo; echo "== Decode loop: in-process vs local path vs served path (bench/decode_loop_bench)"
  "$B/bench/decode_loop_bench"
fi
if [ -x "$B/bench/prefix_bench" ]; then
  echo; echo "== Shared-prefix workload with and without prefix reuse (bench/prefix_bench)"
  "$B/bench/prefix_bench"
fi
if [ -x "$B/bench/scale_bench" ]; then
  echo; echo "== Reserve+Commit, Stats and daemon memory from 10 to 1M live caches (bench/scale_bench)"
  if [ "${1:-}" = quick ]; then "$B/bench/scale_bench" --quick; else "$B/bench/scale_bench"; fi
fi
if [ -x "$B/bench/tier_bench" ]; then
  echo; echo "== TTFT for a prefix from the arena, host, disk (cold) and Redis tiers vs a miss (bench/tier_bench)"
  if [ "${1:-}" = quick ]; then "$B/bench/tier_bench" --quick; else "$B/bench/tier_bench"; fi
fi
