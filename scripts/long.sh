#!/usr/bin/env bash
# The checks too long for CI's budget (scripts/test.sh runs the rest), by hand or nightly:
#   1. scripts/sanitize.sh thread: the host suite under TSan (about 20 minutes here);
#   2. scripts/soak.sh: the stress suite with its counts raised;
#   3. scripts/bazel.sh test //...: every Bazel test (CI runs a representative set);
#   4. the image from source: scripts/image.sh full (deploy/Dockerfile, both stages, with
#      podman: the build stage's packages and compile take about as long as CI), then
#      tests/image's checks on it (CI runs them on the image of its own binaries,
#      deploy/Dockerfile.runtime). Skipped, saying why, where podman cannot run containers;
#      KVARENA_LONG_IMAGE=0 leaves it out.
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/sanitize.sh thread
scripts/soak.sh
scripts/bazel.sh test //...
if [ "${KVARENA_LONG_IMAGE:-1}" != 0 ]; then
  BUILD_DIR=${BUILD_DIR:-build}
  [ -x "$BUILD_DIR/tests/mp/kvarena_prefix_worker" ] || scripts/build.sh
  version=$(sed -n 's/^project(kvarena VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
  if scripts/image.sh full; then
    KVARENA_TEST_IMAGE="localhost/kvarena:$version" bash tests/image/image_test.sh \
      "$BUILD_DIR/daemon/kvarenad" "$BUILD_DIR/tools/kvarena" \
      "$BUILD_DIR/tests/mp/kvarena_prefix_worker" "$BUILD_DIR/python" || [ $? -eq 77 ]
  else
    status=$?
    # image.sh exits 1 naming why when podman cannot run (image_podman_ready); a failed
    # build is a failure.
    source scripts/image.sh
    if image_podman_ready; then exit "$status"; fi
    echo "long.sh: the image: SKIPPED: $IMAGE_REASON"
  fi
fi
