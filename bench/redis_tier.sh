#!/usr/bin/env bash
# The Redis tier's store (bench/redis_tier_bench) beside redis-benchmark's figure for the
# same value size (the ceiling), on a 3+3 Redis Cluster this script starts on loopback ports
# in a temp dir and kills on exit. Usage: bench/redis_tier.sh [VALUE_BYTES] [CHUNKS]
#   BUILD_DIR (default build) must hold redis_tier_bench.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
size=${1:-1048576}
chunks=${2:-256}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

base=$((20000 + RANDOM % 5000))
ports=()
for i in 0 1 2 3 4 5; do
  port=$((base + i))
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" --save '' --appendonly no \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
    --cluster-require-full-coverage no --logfile "$dir/$port/log" &
  pids+=($!)
  ports+=("$port")
done
for port in "${ports[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas 1 \
  --cluster-yes >/dev/null
for port in "${ports[@]}"; do
  for _ in $(seq 200); do
    redis-cli -p "$port" cluster info | grep -q cluster_state:ok && break
    sleep 0.1
  done
done
seeds=$(printf '127.0.0.1:%s,' "${ports[@]:0:3}")
seeds=${seeds%,}

echo "== $(date -u +%F) $(nproc) cores, redis $(redis-server --version | grep -o 'v=[0-9.]*')"
echo "== redis-benchmark --cluster, $size-byte values, one client, no pipeline (the ceiling)"
redis-benchmark --cluster -p "${ports[0]}" -c 1 -n 500 -d "$size" -t set,get -q 2>/dev/null |
  tr '\r' '\n' | grep 'requests per second' |
  awk -v size="$size" '{printf "%-34s %10.0f ops/s %9.1f MB/s\n", $1, $2, $2 * size / 1e6}' || true
echo "== the tier's store (bench/redis_tier_bench)"
"$B/bench/redis_tier_bench" --seeds="$seeds" --value_bytes="$size" --chunks="$chunks"
