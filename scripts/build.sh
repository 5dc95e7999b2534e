#!/usr/bin/env bash
# Configures and builds into ${BUILD_DIR:-build}. CUDA is used when nvcc is found.
# BUILD_TARGETS="kvarenad kvarena" builds only those targets (deploy/Dockerfile does).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
# shellcheck disable=SC2086  # BUILD_TARGETS is a list
cmake --build "$BUILD_DIR" -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
