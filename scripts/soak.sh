#!/usr/bin/env bash
# The long stress run, by hand (CI runs the same tests with small counts): tests/stress's
# suite with its counts raised, repeated ${SOAK_ROUNDS:-1} times, each test on a fresh seed
# (printed; KVARENA_SEED=N replays one). Defaults: 2000 ops per thread of the 8x8 mixed
# load and of the daemon-kill survivors, 100 kill-storm cycles, 30 refusals per thread in
# the exhaustion test. Any of KVARENA_STRESS_OPS, KVARENA_KILL_CYCLES,
# KVARENA_STRESS_EXHAUSTIONS may be set to override. Builds first when the test is missing.
# Exits non-zero on the first failing round; prints each test's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
test_bin="$BUILD_DIR/tests/stress/stress_test"
[ -x "$test_bin" ] || scripts/build.sh
export KVARENA_STRESS_OPS=${KVARENA_STRESS_OPS:-2000}
export KVARENA_KILL_CYCLES=${KVARENA_KILL_CYCLES:-100}
export KVARENA_STRESS_EXHAUSTIONS=${KVARENA_STRESS_EXHAUSTIONS:-30}
echo "soak: ops/thread=$KVARENA_STRESS_OPS kill cycles=$KVARENA_KILL_CYCLES" \
     "refusals/thread=$KVARENA_STRESS_EXHAUSTIONS rounds=${SOAK_ROUNDS:-1}"
"$test_bin" --gtest_repeat="${SOAK_ROUNDS:-1}" --gtest_break_on_failure "$@"
