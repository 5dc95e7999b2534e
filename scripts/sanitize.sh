#!/usr/bin/env bash
# Builds the host code with clang-14 under a sanitizer and runs the tests under it:
#   scripts/sanitize.sh address   ASan + UBSan in build-asan (also the fuzz build:
#                                 scripts/fuzz.sh reuses it), compiled with clang's
#                                 -Wthread-safety -Werror=thread-safety; scripts/test.sh
#                                 runs it
#   scripts/sanitize.sh thread    TSan in build-tsan (also with the thread-safety analysis).
#                                 Debian's abseil is not built for TSan: every process runs
#                                 with tests/tsan/absl_sync_annotations.cc preloaded, which
#                                 shows TSan each absl::Mutex / CondVar / Notification, and
#                                 scripts/tsan.supp drops what happens inside uninstrumented
#                                 gRPC (docs/testing.md, "Sanitizers").
# It builds the test binaries of core, arena, daemon, client, the tiers, the Redis tier
# (which skip where redis-server is missing), the zero-copy and the multi-process tests
# (and the binaries they start) and runs all of their tests; with
# SANITIZE_ALL=1 also kernels/cpu's (slow under TSan). Exits non-zero on any failure or
# sanitizer report.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: scripts/sanitize.sh address|thread}
case "$mode" in
  address) build=${ASAN_BUILD_DIR:-build-asan}
           extra=(-DKVARENA_SANITIZE=address -DKVARENA_FUZZ=ON -DKVARENA_THREAD_SAFETY=ON) ;;
  thread)  build=${TSAN_BUILD_DIR:-build-tsan}; extra=(-DKVARENA_SANITIZE=thread -DKVARENA_THREAD_SAFETY=ON) ;;
  *) echo "sanitize.sh: mode $mode: use address or thread" >&2; exit 2 ;;
esac
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVARENA_CUDA=OFF "${extra[@]}" >/dev/null
# The tests, the binaries they start, and nothing else (no benches, no fuzzers here).
targets=(base_test core_test arena_test client_test daemon_test mp_test zerocopy_test
         fd_socket_test fd_limits_test remote_client_test tiers_test redis_test redis_nodes_test
         kvarenad kvarena_worker kvarena)
[ "${SANITIZE_ALL:-0}" = 1 ] && targets+=(kernels_test)
# Without libFuzzer (the thread build) the fuzz targets replay their corpora in ctest.
[ "$mode" = thread ] && targets+=(requests_fuzzer decode_fuzzer fd_fuzzer)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}
if [ "$mode" = thread ]; then
  # Debian's abseil is not built for TSan: this library shows it every absl::Mutex, CondVar
  # and Notification as acquire/release edges (tests/tsan/absl_sync_annotations.cc). Built
  # uninstrumented, so every process the tests start (kvarenad, workers, bash) may load it.
  clang++-14 -std=c++20 -O2 -fPIC -shared -o "$build/libabsl_sync_annotations.so" \
    tests/tsan/absl_sync_annotations.cc -ldl
  export LD_PRELOAD=$PWD/$build/libabsl_sync_annotations.so
fi
cd "$build"
# ctest knows the tests of the binaries built above (gtest discovery runs at build time);
# the Node client, the CUDA tests and the Prometheus rules (promtool and a scraper; their
# arena filler is not built here) are not sanitizer business, and ScratchQuarantine
# runs two attends over 64k tokens on one thread, a minute each under a sanitizer (it
# runs in the ordinary build).
ctest --output-on-failure --timeout 600 -j"$(nproc)" -E "node_|cuda|Cuda|ScratchQuarantine|_NOT_BUILT|prefix_bench|tier_bench|prometheus_rules"
