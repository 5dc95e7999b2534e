#!/usr/bin/env bash
# The tree checks of scripts/test.sh must fail on a broken input, not only pass on a good one:
# each is run on a temporary copy that is right, then deliberately broken.
#   tests/scripts/checks_test.sh [links|format|build-lists]...   (default: all three)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvarena-checks.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect STATUS WHAT COMMAND...: runs COMMAND, which must exit STATUS.
expect() {
  local want=$1 what=$2 got=0
  shift 2
  "$@" >"$tmp/out" 2>&1 || got=$?
  if [ "$got" != "$want" ]; then
    echo "FAIL: $what: exit $got, expected $want"; sed 's/^/    /' "$tmp/out"
    failures=$((failures + 1))
  else
    echo "ok: $what (exit $got)"
  fi
}

links() {
  local d="$tmp/links"
  mkdir -p "$d/docs" "$d/bench"
  printf '# Top\n\n## Two words\n\nSee [the guide](docs/guide.md#a-section) and [here](#two-words).\n' \
    >"$d/README.md"
  printf '# Design\n\n[up](README.md) [dir](docs/)\n\n```\n[in a fence](nowhere.md)\n```\n' >"$d/DESIGN.md"
  printf '# Results\n\n[`code` link](../docs/guide.md) `[in a span](nowhere.md)`\n' >"$d/bench/RESULTS.md"
  printf '# Guide\n\n## A section\n\n[back](../README.md#top) [web](https://example.com/x)\n' \
    >"$d/docs/guide.md"
  expect 0 "check-links: a tree whose links resolve" "$repo/scripts/check-links" --root "$d"
  sed -i 's|docs/guide.md#a-section|docs/missing.md|' "$d/README.md"
  expect 1 "check-links: a link to a missing file" "$repo/scripts/check-links" --root "$d"
  sed -i 's|docs/missing.md|docs/guide.md#no-such-section|' "$d/README.md"
  expect 1 "check-links: a link to a missing anchor" "$repo/scripts/check-links" --root "$d"
  sed -i 's|docs/guide.md#no-such-section|docs/guide.md|; s|(#two-words)|(#two)|' "$d/README.md"
  expect 1 "check-links: a missing anchor in the same file" "$repo/scripts/check-links" --root "$d"
  sed -i 's|(#two)|(#two-words)|' "$d/README.md"
  printf '[ref]: ../nowhere.md\n' >>"$d/docs/guide.md"
  expect 1 "check-links: a reference definition to a missing file" \
    "$repo/scripts/check-links" --root "$d"
}

format() {
  command -v clang-format-14 >/dev/null || { echo "skip: format (no clang-format-14)"; return; }
  local d="$tmp/format"
  mkdir -p "$d/scripts"
  cp "$repo/scripts/check-format" "$d/scripts/"
  cp "$repo/.clang-format" "$d/"
  git -C "$d" init -q -b main
  printf 'int Add(int a, int b) { return a + b; }\n' >"$d/a.cc"
  git -C "$d" add -A && git -C "$d" -c user.name=t -c user.email=t@t commit -qm base
  git -C "$d" checkout -q -b work
  printf 'int Add(int a, int b) { return a + b; }\nint   Sub(int a,int b){return a-b;}\n' >"$d/a.cc"
  printf 'int  Untouched( ) ;\n' >"$d/b.cc"
  expect 1 "check-format: a badly formatted changed line" "$d/scripts/check-format"
  printf 'int Add(int a, int b) { return a + b; }\nint Sub(int a, int b) { return a - b; }\n' >"$d/a.cc"
  expect 0 "check-format: the line reformatted (b.cc is untracked, so not checked)" \
    "$d/scripts/check-format"
  git -C "$d" add b.cc
  expect 1 "check-format: a new tracked file badly formatted" "$d/scripts/check-format"
  git -C "$d" -c user.name=t -c user.email=t@t commit -qam work
  expect 0 "check-format: nothing changed since HEAD" "$d/scripts/check-format" --base HEAD
  expect 1 "check-format --all: a tracked file badly formatted" "$d/scripts/check-format" --all
}

build_lists() {
  local d="$tmp/tree"
  mkdir -p "$d"
  # The tree as checked out: tracked files and new ones git does not ignore.
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
     xargs -0 cp --parents -t "$d")
  expect 0 "check-build-lists: the tree as committed" \
    "$repo/scripts/check-build-lists" --source-dir "$d" --build-dir "$d/build"
  grep -q '"validate.cc",' "$d/core/BUILD.bazel"
  sed -i '/"validate.cc",/d' "$d/core/BUILD.bazel"
  expect 1 "check-build-lists: a source CMake builds missing from BUILD.bazel" \
    "$repo/scripts/check-build-lists" --source-dir "$d" --build-dir "$d/build"
  grep -q 'core/validate.cc: CMake builds it' "$tmp/out" ||
    { echo "FAIL: the message does not name core/validate.cc"; failures=$((failures + 1)); }
  sed -i 's|"tier_set.cc",|"tier_set.cc",\n        "validate.cc",\n        "extra.cc",|' \
    "$d/core/BUILD.bazel"
  touch "$d/core/extra.cc"
  expect 1 "check-build-lists: a source BUILD.bazel lists that CMake does not build" \
    "$repo/scripts/check-build-lists" --source-dir "$d" --build-dir "$d/build"
  grep -q 'core/extra.cc: //core:core lists it' "$tmp/out" ||
    { echo "FAIL: the message does not name core/extra.cc"; failures=$((failures + 1)); }
}

for check in "${@:-links format build-lists}"; do
  for c in $check; do
    case "$c" in
      links) links ;;
      format) format ;;
      build-lists) build_lists ;;
      *) echo "unknown check $c" >&2; exit 2 ;;
    esac
  done
done
[ "$failures" = 0 ] || { echo "$failures check(s) misbehaved"; exit 1; }
echo "all checks fail on broken input and pass on good input"
