#!/usr/bin/env bash
# The daemon's instructions per call, by method: runs build/daemon/kvarenad under
# valgrind's callgrind, drives it with bench/rpc_calls (setup, then per method a warm-up,
# counters zeroed, N calls, counters dumped) and prints Ir / N for each method — on a
# shared, loaded machine a count, unlike a wall-clock time, does not move with the load.
# Every thread of the daemon is counted, its pollers' idle wake-ups included (a few
# hundred instructions each, not per call).
#
# Usage: bench/rpc_callgrind.sh [N] [METHODS...]   (default 2000; ping health popn stats)
#   BUILD_DIR (default build). KEEP=DIR keeps the callgrind.out files there (for
#   callgrind_annotate); FLAGS adds kvarenad flags.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
N=${1:-2000}
shift || true
METHODS=("$@")
[ ${#METHODS[@]} -eq 0 ] && METHODS=(ping health popn stats)
dir=${KEEP:-$(mktemp -d /tmp/kvarena_callgrind.XXXXXX)}
mkdir -p "$dir"
sock="$dir/kvarena.sock"
# shellcheck disable=SC2086
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out.%p" \
  "$B/daemon/kvarenad" --listen="unix:$sock" --fd_socket=none --num_threads=1 \
  --arena_bytes=256Mi ${FLAGS:-} >"$dir/kvarenad.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
calls() { "$B/bench/rpc_calls" --address="unix:$sock" "$@"; }
for _ in $(seq 600); do
  calls --method=ping --n=1 2>/dev/null && break
  sleep 0.1
done
calls --method=setup
printf '%-8s %8s %14s\n' method calls "Ir per call"
for m in "${METHODS[@]}"; do
  warm=$m
  # popn takes away what append put: each runs after its own append, untimed.
  [ "$m" = popn ] && calls --method=append --n=50 && calls --method=popn --n=50
  [ "$m" = popn ] && calls --method=append --n="$N"
  [ "$m" = append ] || calls --method="$warm" --n=50
  callgrind_control --zero "$daemon" >/dev/null
  calls --method="$m" --n="$N"
  callgrind_control --dump="$m" "$daemon" >/dev/null
  [ "$m" = append ] && calls --method=popn --n="$N"
  out=$(ls -t "$dir"/callgrind.out.$daemon.* | head -1)
  mv "$out" "$dir/callgrind.$m"
  ir=$(callgrind_annotate "$dir/callgrind.$m" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  printf '%-8s %8d %14d\n' "$m" "$N" $((ir / N))
done
echo "(callgrind files in $dir: callgrind_annotate --inclusive=yes $dir/callgrind.METHOD)"
