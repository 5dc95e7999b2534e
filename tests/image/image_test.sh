#!/usr/bin/env bash
# The image, built and run (ctest image_run):
#
#   image_test.sh KVARENAD CLI PREFIX_WORKER PYTHON_DIR
#
# Builds deploy/Dockerfile.runtime over this build's kvarenad and CLI (scripts/image.sh's
# prebuilt image: the runtime stage of deploy/Dockerfile, over a Debian 12 base made here)
# and runs it as the manifests run kvarenad: the args of deploy/kubernetes/base's kvarenad
# container, uid 10001 with group 10100 added (the pod's supplementalGroups), a read-only
# root filesystem, every capability dropped, no-new-privileges, and the socket directory
# bind-mounted from the host (owned 10001:10100, 0750, as the DaemonSet's init step leaves
# /run/kvarena). One addition: a TCP listener (published on loopback), for Health/Check
# over TCP. Then, outside the container:
#   - the manifests' probe command, inside it (podman exec), answers SERVING;
#   - both sockets are 0660, group 10100;
#   - grpc.health.v1 Health/Check over TCP (the kvarena CLI) answers SERVING;
#   - C++ workers (kvarena_prefix_worker, run as the manifests' worker container: uid
#     10002 in group 10100, the socket directory mounted read-only at /run/kvarena)
#     allocate, attend, and reuse a prefix — the second over the local path, its pool
#     mapped through the fd socket; the Python worker (worker.py, /usr/bin/python3 with the
#     build's module) does the same;
#   - /metrics (published) shows the prefix hits; once the workers are gone, Stats shows
#     no cache, no session and no page used (cached pages are free pages);
#   - with a worker holding a cache, `podman stop -t 10` (SIGTERM, then the grace): kvarenad
#     logs its drain and exits 0 within the grace;
#   - the image has no compiler, runs as 10001; its size is printed.
# KVARENA_TEST_IMAGE=TAG runs these checks on that image instead of building one
# (scripts/long.sh: the image deploy/Dockerfile built from source); the binaries given are
# then only the host's CLI and worker. Fails when deploy/Dockerfile.runtime's runtime stage
# is not deploy/Dockerfile's.
# Skipped (77), saying why, where podman cannot run containers (not installed, no root,
# the sandbox refuses them), where the Debian base cannot be made, or where kvarenad links
# a library no Debian package holds outside /usr/local/cuda (a CUDA build: the CUDA runtime
# unpacked there from NVIDIA's installer goes into the image as lib/, see scripts/image.sh).
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 KVARENAD CLI PREFIX_WORKER PYTHON_DIR" >&2; exit 2; }
kvarenad=$1 cli=$2 prefix_worker=$3 python_dir=$4
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
t_start=$SECONDS

skip() { echo "image_test: SKIPPED: $*"; exit 77; }
fail() { echo "image_test: FAILED: $*"; exit 1; }
step() { echo "image_test: $* ($((SECONDS - t_start))s)"; }

# The runtime stage, line for line: deploy/Dockerfile's after its COPY --from=build, and
# deploy/Dockerfile.runtime's after its COPY of the context.
stage_after() { awk -v copy="$2" 'found {print} index($0, copy) == 1 {found = 1}' "$1"; }
full_stage=$(stage_after "$root/deploy/Dockerfile" "COPY --from=build /out/ /tmp/kvarena/")
runtime_stage=$(stage_after "$root/deploy/Dockerfile.runtime" "COPY . /tmp/kvarena/")
[ -n "$full_stage" ] || fail "deploy/Dockerfile has no 'COPY --from=build /out/ /tmp/kvarena/'"
if [ "$full_stage" != "$runtime_stage" ]; then
  diff <(echo "$full_stage") <(echo "$runtime_stage") || true
  fail "deploy/Dockerfile.runtime's runtime stage differs from deploy/Dockerfile's (above)"
fi
step "deploy/Dockerfile.runtime's runtime stage is deploy/Dockerfile's"

# The manifests' kvarenad: the args and probe command of deploy/kubernetes/base.
manifest="$root/deploy/kubernetes/base/model-worker.yaml"
mapfile -t args < <(awk '/^ *args:/ {a = 1; next}
                         a && /^ *- --/ {sub(/^ *- /, ""); sub(/ +#.*/, ""); print; next}
                         a {exit}' "$manifest")
probe=$(awk '/startupProbe:/ {p = 1} p && /command:/ {sub(/.*command: *\[/, ""); sub(/\].*/, "");
                                                      gsub(/, */, " "); print; exit}' "$manifest")
printf '%s\n' "${args[@]}" | grep -qx -- '--listen=unix:/run/kvarena/kvarena.sock' ||
  fail "no --listen=unix:/run/kvarena/kvarena.sock among $manifest's args: ${args[*]}"
printf '%s\n' "${args[@]}" | grep -qx -- '--socket_group=10100' ||
  fail "no --socket_group=10100 among $manifest's args: ${args[*]}"
[ -n "$probe" ] || fail "no startupProbe command in $manifest"

# shellcheck source=../../scripts/image.sh
source "$root/scripts/image.sh"
for tool in setpriv unshare; do
  command -v "$tool" >/dev/null || skip "$tool (util-linux) is missing: the workers need it"
done
[ -x /usr/bin/python3 ] || skip "/usr/bin/python3 is missing (free ports, JSON)"
if [ -z "${KVARENA_TEST_IMAGE:-}" ] &&
   ! packages=$(UNPACKAGED_OK=/usr/local/cuda "$root/deploy/runtime-packages.sh" "$kvarenad" \
                "$cli" 2>&1); then
  skip "the image carries Debian packages only, and $packages"
fi
image_podman_ready || skip "$IMAGE_REASON"
step "podman runs containers${CONTAINERS_CONF:+ (CONTAINERS_CONF=$CONTAINERS_CONF)}"

if [ -n "${KVARENA_TEST_IMAGE:-}" ]; then  # scripts/long.sh: the image deploy/Dockerfile built
  tag=$KVARENA_TEST_IMAGE
  pm image exists "$tag" || fail "no image $tag (KVARENA_TEST_IMAGE)"
else
  # One tag per build tree, so that two builds' tests never replace each other's image.
  tag="localhost/kvarena:$IMAGE_VERSION-test-$(printf '%s' "$(realpath "$kvarenad")" | md5sum | cut -c1-8)"
  old_id=$(pm image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  image_prebuilt "$kvarenad" "$cli" "$tag" || fail "the image did not build"
  new_id=$(pm image inspect --format '{{.Id}}' "$tag")
  if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then pm rmi "$old_id" >/dev/null 2>&1 || true; fi
fi
size=$(image_size "$tag")
step "image $tag, $size"

tmp=$(mktemp -d)
name="kvarena-image-test-$$"
held=""
cleanup() {
  [ -z "$held" ] || as_root kill -KILL "$held" 2>/dev/null || true
  pm rm -f -t 0 "$name" >/dev/null 2>&1 || true
  as_root rm -rf "$tmp"
}
trap cleanup EXIT

# No compiler in the image, and it runs as 10001.
compilers=$(pm run --rm --entrypoint sh "$tag" -c \
  'command -v cc gcc g++ c++ clang clang++ clang-14 as ld cpp make cmake || true')
[ -z "$compilers" ] || fail "the image has a compiler or build tool: $compilers"
# USER 10001:10001 names the group, so podman adds no supplementary group from
# /etc/group: --group-add 10100 is the pod's supplementalGroups.
ids=$(pm run --rm --group-add 10100 --entrypoint id "$tag")
[ "$ids" = "uid=10001(kvarena) gid=10001(kvarena) groups=10001(kvarena),10100(kvarena-sockets)" ] ||
  fail "the image's user, with --group-add 10100: $ids"
step "no compiler or build tool in the image; with --group-add 10100 it runs as $ids"

# The socket directory, as the DaemonSet's init step leaves /run/kvarena; the workers'
# files where uid 10002 can read them.
run_dir="$tmp/run"
as_root install -d -o 10001 -g 10100 -m 0750 "$run_dir"
mkdir -p "$tmp/w/python"
cp "$prefix_worker" "$tmp/w/"
cp "$here/worker.py" "$tmp/w/"
have_python=""
if [ -d "$python_dir/kvarena" ] && [ -x /usr/bin/python3 ]; then
  cp -r "$python_dir/kvarena" "$tmp/w/python/"
  have_python=1
fi
chmod -R a+rX "$tmp/w"
chmod 0755 "$tmp"
# A worker as the manifests' worker container runs (its pid, the same all the way down
# to the worker: exec, in $tmp/worker.pid): uid 10002 in group 10100, the socket
# directory mounted read-only at /run/kvarena, the daemon's path (its own mount namespace,
# /run a fresh tmpfs there). The same path matters: the daemon names its fd socket by its
# own path (AttachEvent.fd_socket), and a worker that sees the directory elsewhere cannot
# map the pools (the local path fails; the served path works).
as_worker() {
  # shellcheck disable=SC2016  # expanded by the inner sh
  as_root unshare --mount --propagation private sh -c '
    mount -t tmpfs -o size=1m,mode=0755 tmpfs /run && mkdir /run/kvarena &&
    mount --bind "$0" /run/kvarena && mount -o remount,bind,ro /run/kvarena &&
    echo $$ >"$1" && shift &&
    exec setpriv --reuid=10002 --regid=10002 --groups=10100 --inh-caps=-all "$@"' \
    "$run_dir" "$tmp/worker.pid" "$@"
}

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
metrics_port=$(free_port)
grpc_port=$(free_port)
run_args=()
for a in "${args[@]}"; do
  case "$a" in
    --listen=*) run_args+=("$a,0.0.0.0:50051") ;;  # and a TCP listener, for Health/Check
    *) run_args+=("$a") ;;
  esac
done
pm run -d --name "$name" --user 10001:10001 --group-add 10100 --read-only --cap-drop=ALL \
  --security-opt=no-new-privileges -v "$run_dir:/run/kvarena" \
  -p "127.0.0.1:$metrics_port:9464" -p "127.0.0.1:$grpc_port:50051" \
  "$tag" "${run_args[@]}" >/dev/null || fail "podman run failed"
step "started: podman run --user 10001:10001 --group-add 10100 --read-only --cap-drop=ALL" \
     "--security-opt=no-new-privileges -v $run_dir:/run/kvarena $tag ${run_args[*]}"

# The manifests' probe, inside the container, until kvarenad serves (60 s: the
# startupProbe's budget).
# shellcheck disable=SC2086  # the probe's words
for _ in $(seq 60); do
  if out=$(pm exec "$name" $probe 2>&1) && [ "$out" = SERVING ]; then break; fi
  [ "$(pm inspect --format '{{.State.Running}}' "$name")" = true ] ||
    { pm logs "$name"; fail "kvarenad exited before serving"; }
  sleep 1
done
[ "${out:-}" = SERVING ] || { pm logs "$name"; fail "the probe ($probe) says: $out"; }
step "the manifests' probe in the container: $probe -> SERVING"

for s in kvarena.sock kvarena.sock.fds; do
  got=$(as_root stat -c '%a %g' "$run_dir/$s" 2>/dev/null) || fail "no $run_dir/$s"
  [ "$got" = "660 10100" ] || fail "$s: mode and group $got, want 660 10100"
done
step "both sockets are 0660, group 10100"

health=$("$cli" --address="127.0.0.1:$grpc_port" --timeout=5s health 2>&1) ||
  fail "Health/Check over TCP: $health"
[ "$health" = SERVING ] || fail "Health/Check over TCP: $health"
step "grpc.health.v1 Health/Check over TCP (kvarena health, 127.0.0.1:$grpc_port): SERVING"

# C++ workers as the manifests' worker: uid 10002, group 10100. A 200-token prompt of
# 16-token pages: the second worker adopts 192 tokens, then computes over the local path.
address="unix:/run/kvarena/kvarena.sock"
worker=("$tmp/w/$(basename "$prefix_worker")" --address="$address" --prefix_namespace=image-test)
as_worker "${worker[@]}" --expect_cached=0 >"$tmp/cxx1.log" 2>&1 ||
  { cat "$tmp/cxx1.log"; fail "the first C++ worker"; }
as_worker "${worker[@]}" --expect_cached=192 --local >"$tmp/cxx2.log" 2>&1 ||
  { cat "$tmp/cxx2.log"; fail "the second C++ worker (prefix reuse, local path)"; }
grep -h "allocated cached_tokens" "$tmp/cxx1.log" "$tmp/cxx2.log" | sed 's/^/  /'
step "C++ workers (uid 10002): allocated, attended, reused a 192-token prefix, local path"

if [ -n "$have_python" ]; then
  as_worker env PYTHONPATH="$tmp/w/python" /usr/bin/python3 "$tmp/w/worker.py" "$address" \
    image-test-python >"$tmp/py.log" 2>&1 || { cat "$tmp/py.log"; fail "the Python worker"; }
  sed 's/^/  /' "$tmp/py.log"
  step "Python worker (uid 10002): allocated, attended, reused a prefix, local path"
else
  echo "image_test: NOTE: no Python module in $python_dir (or no /usr/bin/python3):" \
       "the Python worker did not run"
fi

# /metrics through the published port: the workers' prefix hits are there.
if command -v curl >/dev/null; then
  metrics=$(curl -fsS "http://127.0.0.1:$metrics_port/metrics") || fail "GET /metrics"
else
  metrics=$(/usr/bin/python3 -c 'import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "http://127.0.0.1:$metrics_port/metrics") || fail "GET /metrics"
fi
hits=$(awk '$1 ~ /^kvarena_prefix_hit_tokens_total/ {s += $2} END {print s + 0}' <<<"$metrics")
[ "${hits%.*}" -ge 192 ] || fail "/metrics: kvarena_prefix_hit_tokens_total $hits, want >= 192"
step "/metrics scraped ($(grep -c '^kvarena_' <<<"$metrics") samples): prefix hit tokens $hits"

# No page leaked: the workers' sessions end (their grace is 5 s) and leave nothing used.
no_leak='import json, sys
s = json.loads(sys.argv[1]); p = s["pages"]
if len(sys.argv) > 2:
    print("  caches", s["num_caches"], "sessions", s["num_sessions"], "pages used",
          p["pages_used"], "cached", p["pages_cached"], "of", p["num_pages"])
sys.exit(0 if int(s["num_caches"]) == 0 and int(s["num_sessions"]) == 0
         and int(p["pages_used"]) == 0 else 1)'
for _ in $(seq 30); do
  stats=$("$cli" --address="127.0.0.1:$grpc_port" --timeout=5s stats --json) || fail "stats: $stats"
  /usr/bin/python3 -c "$no_leak" "$stats" && break
  sleep 1
done
/usr/bin/python3 -c "$no_leak" "$stats" print || fail "pages left after the workers: $stats"
step "after the workers: no cache, no session, no page used"

# SIGTERM with a worker holding a cache: kvarenad drains and exits 0 within the grace.
as_root rm -f "$tmp/worker.pid"  # the earlier workers' pids: gone, maybe reused
as_worker "${worker[@]}" --prefix_namespace=image-test-held --hold >"$tmp/held.log" 2>&1 &
for _ in $(seq 100); do grep -q holding "$tmp/held.log" && break; sleep 0.2; done
held=$(cat "$tmp/worker.pid" 2>/dev/null || true)
grep -q holding "$tmp/held.log" || { cat "$tmp/held.log"; fail "the holding worker"; }
t0=$(date +%s%N)
pm stop -t 10 "$name" >/dev/null || fail "podman stop"
stop_ms=$((($(date +%s%N) - t0) / 1000000))
# kvarenad's own exit, as conmon recorded it: podman stop's wall time adds podman's
# clean-up, which a loaded machine stretches.
finished=$(pm inspect --format '{{.State.FinishedAt.UnixNano}}' "$name")
took_ms=$(((finished - t0) / 1000000))
code=$(pm inspect --format '{{.State.ExitCode}}' "$name")
logs=$(pm logs "$name" 2>&1)
sed 's/^/  /' <<<"$logs"
[ "$code" = 0 ] || fail "kvarenad exited $code after podman stop -t 10 (137: killed at the grace's end)"
grep -q "Terminated: draining (health NOT_SERVING)" <<<"$logs" || fail "kvarenad did not log its drain"
[ "$took_ms" -lt 10000 ] || fail "kvarenad exited ${took_ms} ms after podman stop, the grace is 10 s"
# The worker, resumed, finds the daemon gone.
[ -n "$held" ] || fail "the holding worker's pid"
as_root kill -USR1 "$held"
for _ in $(seq 100); do as_root kill -0 "$held" 2>/dev/null || break; sleep 0.2; done
as_root kill -KILL "$held" 2>/dev/null || true
wait 2>/dev/null || true
held=""
echo "  the holding worker, resumed: $(tail -1 "$tmp/held.log")"
step "podman stop -t 10 with a worker holding a cache: drained, exit 0 ${took_ms} ms after" \
     "the SIGTERM (podman stop returned after ${stop_ms} ms)"

echo "image_test: image $tag: $size; the whole test took $((SECONDS - t_start))s"
