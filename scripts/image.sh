#!/usr/bin/env bash
# Builds kvarena's image with podman, from a Debian 12 base made on this machine (no
# registry needed; only the Debian mirror this machine's apt sources name).
#
#   scripts/image.sh full                  deploy/Dockerfile, both stages: compiles inside
#                                          the image (CI-length; scripts/long.sh runs it)
#                                          -> localhost/kvarena:VERSION
#   scripts/image.sh prebuilt [BUILD_DIR]  deploy/Dockerfile.runtime over BUILD_DIR's
#   scripts/image.sh prebuilt KVARENAD CLI kvarenad and kvarena (default build/): the same
#                                          runtime stage, no compiler run
#                                          -> localhost/kvarena:VERSION-prebuilt
#   scripts/image.sh base                  only the base image, localhost/debian:12
#
# The base: `debootstrap --variant=minbase bookworm` from the mirror of this machine's apt
# sources (KVARENA_DEBIAN_MIRROR overrides), with its apt sources (debian.sources) and
# slimmed as debian:12-slim is (no docs, man pages or locales; apt keeps no .debs), as a
# tar cached in ${KVARENA_IMAGE_CACHE:-~/.cache/kvarena-image} and imported by podman.
# KVARENA_BASE_IMAGE=debian:12-slim (or any other name outside localhost/) pulls that
# instead. KVARENA_IMAGE names the built image. Prints each step's wall time and the size.
#
# podman runs as root (through `sudo -n` when not root). Where the sandbox denies what
# podman's defaults ask for (setting rlimits without CAP_SYS_RESOURCE, crun's cgroups),
# it writes a containers.conf (runc, cgroupfs, the current hard limits) into the cache dir
# and exports CONTAINERS_CONF. tests/image sources this file for the same set-up:
# image_podman_ready, then pm (podman) and image_prebuilt.
set -euo pipefail

IMAGE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE_VERSION=$(sed -n 's/^project(kvarena VERSION \([0-9.]*\).*/\1/p' "$IMAGE_ROOT/CMakeLists.txt")
IMAGE_CACHE=${KVARENA_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvarena-image}
IMAGE_BASE=${KVARENA_BASE_IMAGE:-localhost/debian:12}
IMAGE_REASON=""  # why podman cannot run containers here, once image_podman_ready said no

# Root's commands: directly as root, else through sudo -n (never a password prompt).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}
# podman as root, with the containers.conf chosen by image_podman_ready.
pm() {
  as_root env ${CONTAINERS_CONF:+CONTAINERS_CONF="$CONTAINERS_CONF"} podman "$@"
}

# The Debian mirror this machine's apt uses: the first bookworm source naming .../debian.
image_mirror() {
  if [ -n "${KVARENA_DEBIAN_MIRROR:-}" ]; then echo "$KVARENA_DEBIAN_MIRROR"; return; fi
  local m
  m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
      awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) {print $i; exit}}')
  [ -n "$m" ] || m=$(awk '$1 == "deb" && $0 ~ /bookworm/ {
                            for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) {print $i; exit}}' \
                       /etc/apt/sources.list 2>/dev/null)
  echo "${m:-http://deb.debian.org/debian}"
}

# Makes the base rootfs tar (debootstrap, then slimmed) at $1.
image_make_base_tar() {
  local tar=$1 mirror root t0=$SECONDS
  command -v debootstrap >/dev/null || { echo "image.sh: debootstrap is not installed" >&2; return 1; }
  mirror=$(image_mirror)
  mkdir -p "$IMAGE_CACHE"
  root=$(mktemp -d "$IMAGE_CACHE/rootfs.XXXXXX")
  echo "image.sh: debootstrap --variant=minbase bookworm from $mirror"
  if ! as_root debootstrap --variant=minbase bookworm "$root" "$mirror" >"$IMAGE_CACHE/debootstrap.log" 2>&1; then
    tail -20 "$IMAGE_CACHE/debootstrap.log" >&2
    as_root rm -rf "$root"
    return 1
  fi
  # apt sources: this machine's Debian ones (bookworm, -updates, -security) where they are
  # in debian.sources and no mirror was named; else the mirror's bookworm and -updates.
  if [ -z "${KVARENA_DEBIAN_MIRROR:-}" ] && [ -f /etc/apt/sources.list.d/debian.sources ]; then
    as_root cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
    as_root rm -f "$root/etc/apt/sources.list"
  else
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" |
      as_root tee "$root/etc/apt/sources.list" >/dev/null
  fi
  # As debian:12-slim: dpkg leaves out docs, man pages and locales; apt keeps no .debs.
  as_root tee "$root/etc/dpkg/dpkg.cfg.d/slim" >/dev/null <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
  as_root tee "$root/etc/apt/apt.conf.d/docker-clean" >/dev/null <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  # The man page directories stay, empty: openjdk's postinst (the build stage's
  # bazel-bootstrap) links a man page into /usr/share/man/man1 and fails without it.
  as_root sh -c "cd '$root' && rm -rf var/lib/apt/lists/* var/cache/apt/*.bin var/cache/apt/archives/*.deb \
    var/log/* usr/share/groff/* usr/share/info/* usr/share/lintian/* \
    usr/share/linda/* usr/share/locale/* \
    && find usr/share/man -mindepth 1 -not -type d -delete \
    && mkdir -p usr/share/man/man1 usr/share/man/man5 usr/share/man/man7 usr/share/man/man8 \
    && find usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete \
    && find usr/share/doc -mindepth 1 -type d -empty -delete"
  as_root tar --numeric-owner -C "$root" -cf "$tar.tmp" .
  as_root rm -rf "$root"
  mv "$tar.tmp" "$tar"
  echo "image.sh: base rootfs $(du -h "$tar" | cut -f1) in $tar ($((SECONDS - t0))s)"
}

# The base image: present in podman's store, else imported from the cached tar (made first
# when missing), or pulled when it is not a localhost/ name.
image_base() {
  local t0=$SECONDS tar="$IMAGE_CACHE/debian-12-minbase.tar"
  pm image exists "$IMAGE_BASE" && return 0
  case "$IMAGE_BASE" in
    localhost/*) ;;
    *) pm pull -q "$IMAGE_BASE" >/dev/null; return ;;
  esac
  [ -f "$tar" ] || image_make_base_tar "$tar"
  pm import -q --change 'CMD ["/bin/bash"]' "$tar" "$IMAGE_BASE" >/dev/null
  echo "image.sh: base image $IMAGE_BASE imported ($((SECONDS - t0))s)"
}

# podman can run a container here: 0, with CONTAINERS_CONF exported when one is needed;
# else 1, with IMAGE_REASON set. Makes the base image (the container it tries) first.
image_podman_ready() {
  if ! command -v podman >/dev/null; then
    IMAGE_REASON="podman is not installed"; return 1
  fi
  if [ "$(id -u)" -ne 0 ] && ! sudo -n true 2>/dev/null; then
    IMAGE_REASON="podman runs as root here, and this user is not root and has no sudo -n"; return 1
  fi
  if ! pm info >/dev/null 2>&1; then
    IMAGE_REASON="podman info fails: $(pm info 2>&1 | tail -1)"; return 1
  fi
  if ! image_base; then
    IMAGE_REASON="the base image $IMAGE_BASE could not be made"; return 1
  fi
  local err="$IMAGE_CACHE/probe.err" conf nproc
  mkdir -p "$IMAGE_CACHE"
  probe() { pm run --rm --pull=never --network=none "$IMAGE_BASE" true 2>"$err"; }
  probe && return 0
  if [ -n "${CONTAINERS_CONF:-}" ]; then  # the caller's: keep it
    IMAGE_REASON="podman run fails with CONTAINERS_CONF=$CONTAINERS_CONF: $(tail -1 "$err")"; return 1
  fi
  # A sandbox without CAP_SYS_RESOURCE cannot raise rlimits to podman's defaults, and
  # crun may refuse its cgroups: runc, cgroupfs, and limits no higher than the current
  # ones (nproc: podman's own hard limit is not ours, so try a few).
  conf="$IMAGE_CACHE/containers.conf"
  if [ -f "$conf" ]; then  # what worked last time
    export CONTAINERS_CONF="$conf"
    probe && return 0
  fi
  for nproc in "" "$(ulimit -Hu)" 32768 4096; do
    {
      echo "# written by scripts/image.sh: podman here cannot use its defaults"
      echo "[containers]"
      echo "default_ulimits = [\"nofile=$(ulimit -Hn):$(ulimit -Hn)\"${nproc:+, \"nproc=$nproc:$nproc\"}]"
      echo "[engine]"
      echo "runtime = \"runc\""
      echo "cgroup_manager = \"cgroupfs\""
    } >"$conf"
    export CONTAINERS_CONF="$conf"
    probe && return 0
  done
  unset CONTAINERS_CONF
  IMAGE_REASON="podman run fails here, with its defaults and with $conf: $(tail -1 "$err")"
  return 1
}

image_size() { pm image inspect --format '{{.Size}}' "$1" | awk '{printf "%.1f MB", $1 / 1e6}'; }

# deploy/Dockerfile.runtime over prebuilt binaries: image_prebuilt KVARENAD CLI TAG.
image_prebuilt() {
  local kvarenad=$1 cli=$2 tag=$3 ctx t0=$SECONDS
  ctx=$(mktemp -d)
  mkdir "$ctx/bin"
  install -m 0755 -s "$kvarenad" "$ctx/bin/kvarenad"
  install -m 0755 -s "$cli" "$ctx/bin/kvarena"
  # A CUDA build's runtime library, unpacked from NVIDIA's installer here, goes in as lib/.
  UNPACKAGED_OK=/usr/local/cuda UNPACKAGED_COPY_TO="$ctx/lib" \
    "$IMAGE_ROOT/deploy/runtime-packages.sh" "$ctx/bin/kvarenad" "$ctx/bin/kvarena" \
    >"$ctx/runtime-packages"
  chmod -R a+rX "$ctx"
  echo "image.sh: runtime packages: $(tr '\n' ' ' <"$ctx/runtime-packages")"
  if ! pm build -q --network host --pull=never -f "$IMAGE_ROOT/deploy/Dockerfile.runtime" \
         --build-arg RUNTIME_IMAGE="$IMAGE_BASE" -t "$tag" "$ctx" >/dev/null; then
    rm -rf "$ctx"
    echo "image.sh: podman build of deploy/Dockerfile.runtime failed" >&2
    return 1
  fi
  rm -rf "$ctx"
  echo "image.sh: built $tag from prebuilt binaries in $((SECONDS - t0))s, $(image_size "$tag")"
}

image_full() {
  local tag=$1 t0=$SECONDS
  (cd "$IMAGE_ROOT" &&
     pm build --network host --pull=never --ignorefile deploy/Dockerfile.dockerignore \
       -f deploy/Dockerfile --build-arg BUILD_IMAGE="$IMAGE_BASE" \
       --build-arg RUNTIME_IMAGE="$IMAGE_BASE" -t "$tag" .)
  echo "image.sh: built $tag from source (deploy/Dockerfile) in $((SECONDS - t0))s, $(image_size "$tag")"
}

image_main() {
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  case "$cmd" in
    base|full|prebuilt) ;;
    *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; return 2 ;;
  esac
  if ! image_podman_ready; then
    echo "image.sh: $IMAGE_REASON" >&2
    return 1
  fi
  [ -z "${CONTAINERS_CONF:-}" ] || echo "image.sh: CONTAINERS_CONF=$CONTAINERS_CONF"
  case "$cmd" in
    base) echo "image.sh: $IMAGE_BASE, $(image_size "$IMAGE_BASE")" ;;
    full) image_full "${KVARENA_IMAGE:-localhost/kvarena:$IMAGE_VERSION}" ;;
    prebuilt)
      local kvarenad cli
      if [ $# -eq 2 ]; then
        kvarenad=$1 cli=$2
      else
        kvarenad=${1:-$IMAGE_ROOT/build}/daemon/kvarenad cli=${1:-$IMAGE_ROOT/build}/tools/kvarena
      fi
      image_prebuilt "$kvarenad" "$cli" "${KVARENA_IMAGE:-localhost/kvarena:$IMAGE_VERSION-prebuilt}"
      ;;
  esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then image_main "$@"; fi
