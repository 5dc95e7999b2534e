#!/usr/bin/env bash
# install_test: `cmake --install` of the build into a temporary prefix, then
#   - a worker project out of tree (tests/install/worker) configured with find_package(kvarena)
#     against that prefix only, built and run (inproc:);
#   - the same worker.cc built with pkg-config's flags alone, and run;
#   - the installed kvarenad and kvarena CLI run (--help / a health check);
#   - the installed Python module imported from the prefix (when the build made it).
# Usage: install_test.sh BUILD_DIR WORKER_SOURCE_DIR
set -euo pipefail
build=$1
worker=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
for f in bin/kvarenad bin/kvarena include/kvarena/client.h lib/cmake/kvarena/kvarenaConfig.cmake \
    lib/pkgconfig/kvarena.pc; do
  [ -e "$prefix/$f" ] || { echo "install_test: $f not installed" >&2; exit 1; }
done
ls "$prefix"/lib*/libkvarena_client.so* >/dev/null

# find_package(kvarena)
cmake -S "$worker" -B "$tmp/worker-build" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/configure.log"
cmake --build "$tmp/worker-build" >"$tmp/build.log"
"$tmp/worker-build/installed_worker"

# pkg-config
libdir=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --variable=libdir kvarena)
# shellcheck disable=SC2046  # pkg-config prints a list of flags
c++ -o "$tmp/pc_worker" "$worker/worker.cc" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs kvarena) -Wl,-rpath,"$libdir"
"$tmp/pc_worker"

# the daemon and the CLI, from the prefix
sock=$tmp/kvarena.sock
"$prefix/bin/kvarenad" --listen="unix:$sock" --backend=host --arena_bytes=64Mi >"$tmp/kvarenad.log" 2>&1 &
daemon=$!
for _ in $(seq 1 200); do
  "$prefix/bin/kvarena" --address="unix:$sock" health >/dev/null 2>&1 && break
  sleep 0.05
done
"$prefix/bin/kvarena" --address="unix:$sock" health
"$tmp/worker-build/installed_worker" "unix:$sock"
kill "$daemon"
wait "$daemon" || true

# the Python module
if [ -d "$build/python/kvarena" ]; then
  site=$(echo "$prefix"/lib/python3*/dist-packages)
  PYTHONPATH=$site /usr/bin/python3 -c "
import kvarena, sys
assert kvarena.__file__.startswith('$site'), kvarena.__file__
c = kvarena.connect('inproc:')
print('install_test: python', kvarena.__file__, c.allocate(1, 1, 4, 'float32'))
"
fi
echo "install_test: ok"
