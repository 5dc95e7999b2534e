#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole suite under ctest,
# then the Bazel build with a representative set of its tests (scripts/bazel.sh;
# KVARENA_BAZEL=0 skips it), the sanitizer build's tests and the fuzzers. Exits non-zero on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps
# The cheap tree checks first (docs/testing.md): relative links in the docs resolve, every
# C++ file is formatted (.clang-format), and every BUILD.bazel lists the sources CMake builds.
scripts/check-links
scripts/check-format --all
scripts/check-build-lists
scripts/build.sh
if [ -f tests/node/package.json ]; then
  (cd tests/node && npm install --no-audit --no-fund --loglevel=error)
fi
# The deploy manifests' test: the exact versions of its package-lock.json.
if [ -f tests/deploy/package-lock.json ]; then
  (cd tests/deploy && npm ci --no-audit --no-fund --loglevel=error)
fi
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure --timeout 300 -j"$(nproc)")
# The same tree under Bazel: the binaries and a representative set of the host tests
# (//:representative_tests; docs/testing.md, "Bazel"). KVARENA_BAZEL=0 skips it.
[ "${KVARENA_BAZEL:-1}" = 0 ] || scripts/bazel.sh
# Core, arena, daemon, client, zero-copy and multi-process tests again under ASan + UBSan,
# compiled with clang's thread-safety analysis as errors.
scripts/sanitize.sh address
# libFuzzer over the request path, the decoders and the fd socket: ${FUZZ_SECONDS:-60}s each
# (the same build).
scripts/fuzz.sh
