#!/usr/bin/env bash
# Prints the Debian packages that hold the shared libraries BINARY... load (ldd, then
# dpkg -S), one per line, sorted: what deploy/Dockerfile's runtime stage installs, so the
# image carries exactly the libraries the build linked. Fails, naming it, when a library
# is not found or belongs to no package — except libraries under a directory listed in
# $UNPACKAGED_OK (colon-separated; e.g. a CUDA toolkit unpacked from NVIDIA's installer
# rather than its Debian repository), which are named on stderr and left out — and, with
# $UNPACKAGED_COPY_TO=DIR, copied there under the name the binaries load them by (the
# image's runtime stage installs DIR, as lib/, into /usr/local/lib).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }

deps=$(ldd "$@")
missing=$(awk '/=> not found/ {print $1}' <<<"$deps" | sort -u)
[ -z "$missing" ] || { echo "$0: libraries not found: $missing" >&2; exit 1; }
# "name => /path (addr)" lines, and the loader's own "/path (addr)" line.
mapfile -t libs < <(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $2 ~ /^\(/ {print $1}' \
                      <<<"$deps" | sort -u)

# Debian 12 is usr-merged: dpkg may know a file as /lib/... or /usr/lib/..., under its
# own name or its symlink's. One dpkg -S for every spelling (it is slow per call).
spellings() {
  local p
  for p in "$1" "$(readlink -f "$1")"; do
    printf '%s\n' "$p" "/usr$p" "${p#/usr}"
  done
}
declare -A owner
while IFS= read -r line; do  # "pkg[:arch][, pkg...]: /path"
  owner[${line#*: }]=${line%%: *}
done < <(for lib in "${libs[@]}"; do spellings "$lib"; done | sort -u | xargs dpkg -S 2>/dev/null || true)

for lib in "${libs[@]}"; do
  found=""
  while IFS= read -r p; do
    [ -n "${owner[$p]:-}" ] && { found=${owner[$p]}; break; }
  done < <(spellings "$lib")
  if [ -z "$found" ]; then
    skip=""
    IFS=: read -ra ok_dirs <<<"${UNPACKAGED_OK:-}"
    for d in "${ok_dirs[@]}"; do
      [ -n "$d" ] && case "$(readlink -f "$lib")" in "$(readlink -f "$d")"/*) skip=1 ;; esac
    done
    [ -n "$skip" ] || { echo "$0: $lib belongs to no Debian package" >&2; exit 1; }
    echo "$0: $lib belongs to no Debian package; left out (UNPACKAGED_OK)" >&2
    if [ -n "${UNPACKAGED_COPY_TO:-}" ]; then
      mkdir -p "$UNPACKAGED_COPY_TO"
      cp -L "$lib" "$UNPACKAGED_COPY_TO/$(basename "$lib")"
    fi
    continue
  fi
  echo "${found%%:*}"
done | sort -u
