#!/usr/bin/env bash
# The Bazel build (docs/testing.md, "Bazel"): Debian's bazel-bootstrap 4.2.3 and the
# system libraries, offline. With no arguments, what scripts/test.sh runs: builds kvarenad,
# the kvarena CLI and the client library and runs //:representative_tests (core, daemon,
# client and multi-process tests). Arguments replace that, e.g.
#   scripts/bazel.sh test //...                  every target and every host test
#   scripts/bazel.sh build //:kvarenad
#   scripts/bazel.sh test //tests/stress:stress_test
# Settings (jobs, memory, output base and disk cache under /tmp) are in .bazelrc. Exits
# non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps
# Bazel's client and JVM need a writable HOME.
if [ -z "${HOME:-}" ] || [ ! -w "${HOME}" ]; then
  HOME=$(mktemp -d "${TMPDIR:-/tmp}/kvarena-bazel-home.XXXXXX")
  export HOME
fi

# The disk cache (.bazelrc) is shared by every clone on this machine. Its keys are the
# actions' command lines and declared inputs, which leave out the system headers and
# compilers: it is emptied whenever an installed package or nvcc changes, and when it
# grows past KVARENA_BAZEL_CACHE_MB (default 4096) MiB.
cache=/tmp/kvarena-bazel/disk-cache
system=$( { dpkg-query -W; nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null || true; } | md5sum)
if [ -d "${cache}" ] && { [ "$(cat "${cache}.system" 2>/dev/null)" != "${system}" ] ||
    [ "$(du -sm "${cache}" | cut -f1)" -gt "${KVARENA_BAZEL_CACHE_MB:-4096}" ]; }; then
  echo "bazel.sh: emptying ${cache}"
  rm -rf "${cache}"
fi
mkdir -p "${cache}"
echo "${system}" >"${cache}.system"

[ $# -gt 0 ] || set -- test //:kvarenad //:kvarena //:client //:representative_tests
exec nice bazel "$@"
