#!/usr/bin/env bash
# wheel_test: the kvarena wheel, end to end (docs/python.md, "A wheel"):
#   - `pip wheel . --no-build-isolation --no-index` of the source tree (setup.py: CMake
#     into build/wheel, or KVARENA_WHEEL_BUILD_DIR: under ctest the suite's own build), with
#     Debian's /usr/bin/python3;
#   - the wheel's name and contents: the extension, python/kvarena/*.py, kvarenad and the
#     kvarena CLI (executable), the two console commands;
#   - one version: CMakeLists.txt's project VERSION = the wheel's = `kvarenad --version` =
#     `kvarena --version`;
#   - a fresh venv (--system-site-packages, for Debian's numpy), the wheel installed into
#     it with pip --no-index, every shared library its binaries need found;
#   - the venv's kvarenad on a Unix socket in a temporary directory (the console command
#     execs the binary: same pid), the venv's `kvarena health`, and tests/wheel/worker.py
#     run from that directory with the venv's python (allocate, append, attend, prefix
#     reuse, numpy reference, release);
#   - kvarenad stopped by its pid with SIGTERM, exiting 0.
# Exits 77 (skipped) when python3-venv or python3-pip is missing.
# Usage: wheel_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
py=/usr/bin/python3
if ! "$py" -c 'import ensurepip, pip, venv' 2>/dev/null; then
  echo "wheel_test: SKIP: needs python3-venv and python3-pip (scripts/setup-deps)"
  exit 77
fi
tmp=$(mktemp -d)
daemon=""
cleanup() {
  [ -z "$daemon" ] || kill -KILL "$daemon" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "wheel_test: FAIL: $*" >&2
  exit 1
}
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

version=$(sed -n 's/^project(kvarena VERSION \([0-9.]*\)[ )].*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "no project(kvarena VERSION ...) line in $src/CMakeLists.txt"
tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')

# The wheel, built from the source tree as a user would.
t=$(now)
(cd "$src" && PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip wheel . --no-build-isolation \
  --no-index --no-deps --no-cache-dir -w "$tmp/dist") >"$tmp/wheel.log" 2>&1 ||
  { cat "$tmp/wheel.log" >&2; fail "pip wheel"; }
echo "wheel_test: pip wheel: $(since "$t") s"
wheel=$tmp/dist/kvarena-$version-$tag-$tag-linux_x86_64.whl
[ -f "$wheel" ] || fail "no $(basename "$wheel") in dist/: $(ls "$tmp/dist")"
echo "wheel_test: $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"

"$py" - "$wheel" "$src/python/kvarena" <<'EOF'
import pathlib, stat, sys, zipfile
wheel, pkg = sys.argv[1], pathlib.Path(sys.argv[2])
z = zipfile.ZipFile(wheel)
names = set(z.namelist())
want = {f"kvarena/{p.name}" for p in pkg.glob("*.py")} | {"kvarena/_bin/kvarenad",
                                                          "kvarena/_bin/kvarena"}
missing = want - names
assert not missing, f"wheel_test: missing from the wheel: {sorted(missing)}"
assert [n for n in names if n.startswith("kvarena/_kvarena.") and n.endswith(".so")], names
for b in ("kvarenad", "kvarena"):
    mode = z.getinfo(f"kvarena/_bin/{b}").external_attr >> 16
    assert mode & stat.S_IXUSR, f"wheel_test: kvarena/_bin/{b} is not executable ({mode:o})"
ep = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
text = z.read(ep).decode()
for line in ("kvarenad = kvarena._commands:kvarenad", "kvarena = kvarena._commands:kvarena"):
    assert line in text, f"wheel_test: no `{line}` in {ep}:\n{text}"
print(f"wheel_test: {len(names)} files in the wheel, the binaries executable")
EOF

# A fresh venv that sees Debian's numpy, the wheel installed into it.
t=$(now)
venv=$tmp/venv
"$py" -m venv --system-site-packages "$venv"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install -q --no-index --no-deps \
  "$wheel" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; fail "pip install"; }
echo "wheel_test: venv + pip install: $(since "$t") s"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
if [ ! -x "$site/kvarena/_bin/kvarenad" ] || [ ! -x "$site/kvarena/_bin/kvarena" ]; then
  fail "pip installed the binaries in $site/kvarena/_bin/ without their executable bit"
fi
for f in "$site"/kvarena/_bin/kvarenad "$site"/kvarena/_bin/kvarena "$site"/kvarena/_kvarena.*.so; do
  if ldd "$f" | grep -q 'not found'; then
    ldd "$f" >&2
    fail "$f needs a library that is not found"
  fi
done

# One version: CMakeLists.txt's, the wheel's (its name, checked above), kvarenad's.
said=$("$venv/bin/kvarenad" --version)
[ "$said" = "kvarenad $version" ] || fail "kvarenad --version says '$said', CMakeLists.txt $version"
said=$("$venv/bin/kvarena" --version)
[ "$said" = "kvarena $version" ] || fail "kvarena --version says '$said', CMakeLists.txt $version"
echo "wheel_test: version $version: CMakeLists.txt, the wheel, kvarenad and kvarena --version"

# The wheel's kvarenad on a socket in the temporary directory.
sock=$tmp/kvarena.sock
"$venv/bin/kvarenad" --listen="unix:$sock" --backend=host --arena_bytes=64Mi \
  >"$tmp/kvarenad.log" 2>&1 &
daemon=$!
for _ in $(seq 1 200); do
  "$venv/bin/kvarena" --address="unix:$sock" health >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || { cat "$tmp/kvarenad.log" >&2; fail "kvarenad exited"; }
  sleep 0.05
done
"$venv/bin/kvarena" --address="unix:$sock" health
exe=$(readlink "/proc/$daemon/exe")
[ "$exe" = "$(readlink -f "$site/kvarena/_bin/kvarenad")" ] ||
  fail "pid $daemon runs $exe, not the wheel's kvarenad"

# The worker, from outside the source tree.
mkdir "$tmp/run"
cp "$src/tests/wheel/worker.py" "$tmp/run/"
t=$(now)
(cd "$tmp/run" && PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" worker.py "unix:$sock" \
  "$venv" "$version" ${KVARENA_SEED:+"$KVARENA_SEED"}) ||
  { cat "$tmp/kvarenad.log" >&2; fail "worker"; }
echo "wheel_test: worker: $(since "$t") s"

kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
daemon=""
[ "$rc" -eq 0 ] || { cat "$tmp/kvarenad.log" >&2; fail "kvarenad exited $rc after SIGTERM"; }
echo "wheel_test: ok"
