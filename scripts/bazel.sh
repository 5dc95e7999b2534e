#!/usr/bin/env bash
# The Bazel build (README: Building with Bazel): Debian's bazel-bootstrap 4.2.3 and the
# system libraries, offline. With no arguments: `bazel test //...` (the daemon, the client
# library, the CLI, and the host tests //... covers); arguments replace `test //...`, e.g.
#   scripts/bazel.sh build //:kvarenad
#   scripts/bazel.sh test //tests/stress:stress_test
# Settings (jobs, memory, output base under /tmp) are in .bazelrc. Exits non-zero on any
# failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps
# Bazel's client and JVM need a writable HOME.
if [ -z "${HOME:-}" ] || [ ! -w "${HOME}" ]; then
  HOME=$(mktemp -d "${TMPDIR:-/tmp}/kvarena-bazel-home.XXXXXX")
  export HOME
fi
[ $# -gt 0 ] || set -- test //...
exec nice bazel "$@"
