#!/usr/bin/env bash
# ctest driver for reflection_client.js: starts kvarenad ($1) on a socket in a fresh temp
# dir, runs the Node client against it, then stops the daemon with SIGTERM (it must exit 0).
# Exits 77 (ctest: skipped) only when node or npm is missing. Without node_modules (`npm ci`
# here: the exact versions of package-lock.json) it fails, saying so.
set -uo pipefail
kvarenad=$1
here=$(cd "$(dirname "$0")" && pwd)
proto="$here/../../proto/kvarena/v1/kvarena.proto"
command -v node >/dev/null || { echo "node not found: skipped"; exit 77; }
command -v npm >/dev/null || { echo "npm not found: skipped"; exit 77; }
[ -d "$here/node_modules/grpc-js-reflection-client" ] ||
  { echo "$here/node_modules is missing: run 'npm ci' there"; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvarena_node.XXXXXX")
sock="$dir/kvarena.sock"
"$kvarenad" --listen="unix:$sock" --arena_bytes=64Mi >"$dir/kvarenad.log" 2>&1 &
pid=$!
trap 'kill -KILL $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "kvarenad did not start:"; cat "$dir/kvarenad.log"; exit 1; }

node "$here/reflection_client.js" "unix:$sock" "$proto"
rc=$?
kill -TERM $pid
wait $pid
daemon_rc=$?
cat "$dir/kvarenad.log"
[ $daemon_rc -eq 0 ] || { echo "kvarenad exited $daemon_rc after SIGTERM"; exit 1; }
exit $rc
