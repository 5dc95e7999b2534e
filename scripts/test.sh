#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole suite under ctest,
# then the Bazel build with a representative set of its tests (scripts/bazel.sh;
# KVARENA_BAZEL=0 skips it), the sanitizer build's tests and the fuzzers. Exits non-zero on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, printed as it ends and again as a table at the end, so a slow
# CI run shows where its minutes went.
start=$SECONDS
timings=()
phase() {
  local name=$1 t0=$SECONDS
  shift
  "$@"
  timings+=("$(printf '%-14s %5ds' "$name" $((SECONDS - t0)))")
  echo "test.sh: phase $name took $((SECONDS - t0))s"
}
npm_installs() {
  # The Node tests' clients: the exact versions of each package-lock.json.
  local dir
  for dir in tests/node tests/deploy; do
    if [ -f "$dir/package-lock.json" ]; then
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    fi
  done
}
tree_checks() {
  scripts/check-links
  scripts/check-format --all
  scripts/check-build-lists
}
run_ctest() { (cd "${BUILD_DIR:-build}" && ctest --output-on-failure --timeout 300 -j"$(nproc)"); }
phase setup-deps scripts/setup-deps
# The cheap tree checks first (docs/testing.md): relative links in the docs resolve, every
# C++ file is formatted (.clang-format), and every BUILD.bazel lists the sources CMake builds.
phase tree-checks tree_checks
phase build scripts/build.sh
phase npm npm_installs
phase ctest run_ctest
# The same tree under Bazel: the binaries and a representative set of the host tests
# (//:representative_tests; docs/testing.md, "Bazel"). KVARENA_BAZEL=0 skips it.
if [ "${KVARENA_BAZEL:-1}" != 0 ]; then phase bazel scripts/bazel.sh; fi
# Core, arena, daemon, client, zero-copy and multi-process tests again under ASan + UBSan,
# compiled with clang's thread-safety analysis as errors.
phase asan scripts/sanitize.sh address
# libFuzzer over the request path, the decoders and the fd socket: ${FUZZ_SECONDS:-60}s each
# (the same build).
phase fuzz scripts/fuzz.sh
echo "test.sh: phase times"
printf '  %s\n' "${timings[@]}"
echo "test.sh: all phases took $((SECONDS - start))s"
