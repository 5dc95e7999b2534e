#!/usr/bin/env bash
# ctest driver for deploy_test.js: $1 = kvarenad, $2 = the kvarena CLI. Exits 77 (ctest:
# skipped) only when node or npm is missing. Without node_modules (`npm ci` here: what
# scripts/test.sh does) or kubectl (scripts/setup-deps installs it) it fails, saying so.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v node >/dev/null || { echo "node not found: skipped"; exit 77; }
command -v npm >/dev/null || { echo "npm not found: skipped"; exit 77; }
[ -d "$here/node_modules/kubernetes-models" ] ||
  { echo "$here/node_modules is missing: run 'npm ci' there (scripts/test.sh does)"; exit 1; }
command -v "${KUBECTL:-kubectl}" >/dev/null ||
  { echo "kubectl not found: scripts/setup-deps installs Debian's kubernetes-client"; exit 1; }
exec node "$here/deploy_test.js" --kvarenad="$1" --kvarena="$2"
