#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan) into ${ASAN_BUILD_DIR:-build-asan}
# (the address build of scripts/sanitize.sh, whose objects it shares) and runs each for ${FUZZ_SECONDS:-60} seconds from its seed corpus (fuzz/corpus/<target>;
# new inputs go to a scratch copy, the repository's corpus is never written). Prints each
# target's executions; exits non-zero on the first crash, leaving the input under
# ${ASAN_BUILD_DIR}/artifacts/<target>/ (copy it to fuzz/regressions/<target>/ with a fix).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${ASAN_BUILD_DIR:-build-asan}
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVARENA_CUDA=OFF -DKVARENA_SANITIZE=address \
  -DKVARENA_FUZZ=ON -DKVARENA_THREAD_SAFETY=ON >/dev/null
targets=$(cd fuzz && ls *_fuzzer.cc | sed 's/\.cc$//')
cmake --build "$BUILD" -j"$(nproc)" --target $targets
for t in $targets; do
  work="$BUILD/corpus/$t"
  mkdir -p "$work" "$BUILD/artifacts/$t" "fuzz/corpus/$t"
  seeds=("fuzz/corpus/$t")
  [ -d "fuzz/regressions/$t" ] && seeds+=("fuzz/regressions/$t")  # every input that once crashed
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s"
  "$BUILD/fuzz/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t/" "$work" "${seeds[@]}" \
    2>"$BUILD/$t.log" || { tail -60 "$BUILD/$t.log"; echo "fuzz: $t FAILED"; exit 1; }
  echo "fuzz: $t $(grep -E 'stat::number_of_executed_units' "$BUILD/$t.log" | awk '{print $2}') executions," \
       "$(grep -E 'stat::new_units_added' "$BUILD/$t.log" | awk '{print $2}') new inputs"
done
