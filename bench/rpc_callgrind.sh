#!/usr/bin/env bash
# The daemon's instructions per call, by method: runs build/daemon/kvarenad under
# valgrind's callgrind, drives it with bench/rpc_calls (setup, then per method a warm-up,
# counters zeroed, N calls, counters dumped) and prints Ir / N for each method — on a
# shared, loaded machine a count, unlike a wall-clock time, does not move with the load.
# Every thread of the daemon is counted; idle, all of them together run about 30k
# instructions a second (timers, the reaper), noise below 0.1% of a call.
#
# Usage: bench/rpc_callgrind.sh [N] [METHODS...]   (default 2000; ping health popn stats)
#   BUILD_DIR (default build); KVARENAD (default $BUILD_DIR/daemon/kvarenad: another
#   build's, to compare); ROUNDS (default 5) measurements of each method. KEEP=DIR
#   keeps the callgrind files there (for callgrind_annotate); FLAGS adds kvarenad flags.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
N=${1:-2000}
ROUNDS=${ROUNDS:-5}
shift || true
METHODS=("$@")
[ ${#METHODS[@]} -eq 0 ] && METHODS=(ping health popn stats)
dir=${KEEP:-$(mktemp -d /tmp/kvarena_callgrind.XXXXXX)}
mkdir -p "$dir"
sock="$dir/kvarena.sock"
# shellcheck disable=SC2086
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out.%p" \
  "${KVARENAD:-$B/daemon/kvarenad}" --listen="unix:$sock" --fd_socket=none --num_threads=1 \
  --arena_bytes=256Mi ${FLAGS:-} >"$dir/kvarenad.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
calls() { "$B/bench/rpc_calls" --address="unix:$sock" "$@"; }
for _ in $(seq 600); do
  calls --method=ping --n=1 2>/dev/null && break
  sleep 0.1
done
calls --method=setup
# gRPC's path through a call varies with how the client's and the daemon's threads meet
# (which thread reads, whether reads coalesce): counts move a few percent from run to
# run, so each method is measured ROUNDS times, interleaved, and the median is shown.
for round in $(seq "$ROUNDS"); do
  for m in "${METHODS[@]}"; do
    # popn takes away what append put: each runs after its own append, uncounted.
    [ "$m" = popn ] && calls --method=append --n="$N"
    [ "$m" = append ] || [ "$m" = popn ] || calls --method="$m" --n=50
    callgrind_control --zero "$daemon" >/dev/null
    calls --method="$m" --n="$N"
    callgrind_control --dump="$m.$round" "$daemon" >/dev/null
    [ "$m" = append ] && calls --method=popn --n="$N"
    out=$(ls -t "$dir"/callgrind.out.$daemon.* | head -1)
    mv "$out" "$dir/callgrind.$m.$round"
    ir=$(callgrind_annotate "$dir/callgrind.$m.$round" 2>/dev/null |
         awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    echo "$m $((ir / N))" >>"$dir/per_call"
  done
done
printf '%-8s %8s %18s %22s\n' method calls "Ir per call (median)" "min .. max of $ROUNDS rounds"
for m in "${METHODS[@]}"; do
  awk -v m="$m" '$1 == m {print $2}' "$dir/per_call" | sort -n | awk -v m="$m" -v n="$N" '
    {v[NR] = $1} END {printf "%-8s %8d %18d %22s\n", m, n, v[int((NR + 1) / 2)], v[1] " .. " v[NR]}'
done
echo "(callgrind files in $dir: callgrind_annotate --inclusive=yes $dir/callgrind.METHOD.ROUND)"
