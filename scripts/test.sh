#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole suite under ctest.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps
scripts/build.sh
if [ -f tests/node/package.json ]; then
  (cd tests/node && npm install --no-audit --no-fund --loglevel=error)
fi
# The deploy manifests' test: the exact versions of its package-lock.json.
if [ -f tests/deploy/package-lock.json ]; then
  (cd tests/deploy && npm ci --no-audit --no-fund --loglevel=error)
fi
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure --timeout 300 -j"$(nproc)")
# Core, arena, daemon, client, zero-copy and multi-process tests again under ASan + UBSan,
# compiled with clang's thread-safety analysis as errors.
scripts/sanitize.sh address
# libFuzzer over the request path, the decoders and the fd socket: ${FUZZ_SECONDS:-60}s each
# (the same build).
scripts/fuzz.sh
