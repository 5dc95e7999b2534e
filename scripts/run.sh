#!/usr/bin/env bash
# Builds kvarena, starts kvarenad on unix:/tmp/kvarena.sock (metrics on 127.0.0.1:9464), runs the
# demo worker against it, prints how to look inside, and keeps the daemon in the
# foreground until Ctrl-C.
#
# Environment: BUILD_DIR (default build), KVARENA_SOCKET (default /tmp/kvarena.sock),
# METRICS_PORT (default 9464), ARENA_BYTES (default 1Gi), BACKEND (default auto),
# SKIP_BUILD=1 to reuse a build.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
SOCKET=${KVARENA_SOCKET:-/tmp/kvarena.sock}
METRICS_PORT=${METRICS_PORT:-9464}
ARENA_BYTES=${ARENA_BYTES:-1Gi}
ADDRESS="unix:${SOCKET}"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  scripts/setup-deps
  BUILD_DIR="$BUILD_DIR" scripts/build.sh
fi
BIN="$BUILD_DIR"
for b in daemon/kvarenad tools/kvarena client/kvarena_demo; do
  [ -x "$BIN/$b" ] || { echo "run.sh: $BIN/$b is missing; build first" >&2; exit 1; }
done

# The embedded default: --backend=auto serves from the GPU when this build has CUDA and a
# device is usable, else from host memory (the start line says which).
BACKEND=${BACKEND:-auto}

if [ -S "$SOCKET" ] && "$BIN/tools/kvarena" --address="$ADDRESS" health >/dev/null 2>&1; then
  echo "run.sh: a kvarenad is already serving $ADDRESS; stop it first" >&2
  exit 1
fi

"$BIN/daemon/kvarenad" --listen="$ADDRESS" --backend="$BACKEND" --arena_bytes="$ARENA_BYTES" \
  --metrics_port="$METRICS_PORT" &
DAEMON_PID=$!

stop_daemon() {
  trap - INT TERM EXIT
  if kill -0 "$DAEMON_PID" 2>/dev/null; then
    echo
    echo "run.sh: stopping kvarenad (pid $DAEMON_PID)"
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
}
trap stop_daemon INT TERM EXIT

for _ in $(seq 1 100); do
  if "$BIN/tools/kvarena" --address="$ADDRESS" health >/dev/null 2>&1; then break; fi
  if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
    echo "run.sh: kvarenad exited during startup" >&2
    exit 1
  fi
  sleep 0.1
done
"$BIN/tools/kvarena" --address="$ADDRESS" health

echo
echo "== kvarena_demo"
"$BIN/client/kvarena_demo" --address="$ADDRESS"

echo
echo "== llama_decode.py (the Python module: torch, served and local paths)"
if [ -f "$BIN/python/kvarena/__init__.py" ]; then
  PYTHONPATH="$BIN/python" /usr/bin/python3 python/examples/llama_decode.py --address="$ADDRESS"
else
  echo "run.sh: skipped: $BIN/python/kvarena was not built (needs pybind11-dev, libdlpack-dev)"
fi

echo
echo "== kvarena stats"
"$BIN/tools/kvarena" --address="$ADDRESS" stats
echo
echo "== kvarena caches"
"$BIN/tools/kvarena" --address="$ADDRESS" caches

cat <<MSG

kvarenad is serving $ADDRESS (pid $DAEMON_PID). Look inside with:
  $BIN/tools/kvarena stats                 # pages used/free, bytes, pools (add --json)
  $BIN/tools/kvarena caches                # one row per cache
  $BIN/tools/kvarena stats --cache=kvarena-demo
  $BIN/tools/kvarena health
  grpcurl -plaintext -unix $SOCKET list
  grpcurl -plaintext -unix $SOCKET describe kvarena.v1.KvCacheService
  grpcurl -plaintext -unix $SOCKET kvarena.v1.KvCacheService/Stats
  grpcurl -plaintext -unix -d '{"cache_id":"kvarena-demo"}' $SOCKET kvarena.v1.KvCacheService/Stats
  grpcurl -plaintext -unix $SOCKET grpc.health.v1.Health/Check
  curl -s localhost:$METRICS_PORT/metrics
  $BIN/client/kvarena_demo                 # run the demo again

Ctrl-C stops the daemon.
MSG

wait "$DAEMON_PID"
