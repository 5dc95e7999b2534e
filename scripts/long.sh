#!/usr/bin/env bash
# The checks too long for CI's budget (scripts/test.sh runs the rest), by hand or nightly:
#   1. scripts/sanitize.sh thread: the host suite under TSan (about 20 minutes here);
#   2. scripts/soak.sh: the stress suite with its counts raised;
#   3. scripts/bazel.sh test //...: every Bazel test (CI runs a representative set).
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/sanitize.sh thread
scripts/soak.sh
scripts/bazel.sh test //...
