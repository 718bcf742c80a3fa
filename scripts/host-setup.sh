#!/usr/bin/env bash
# Prepare a Debian 12 build host (as root) for k3env: install the host tools from Debian,
# start dockerd and a local registry on 127.0.0.1:5000 if they are not running. Idempotent.
# On a Nix host use `nix develop` for the tools instead (flake.nix); the services still apply.
set -euo pipefail

need=()
for pair in dockerd:docker.io docker-registry:docker-registry skopeo:skopeo \
            mksquashfs:squashfs-tools debootstrap:debootstrap nix-instantiate:nix-bin \
            curl:curl git:git faketime:faketime qemu-aarch64-static:qemu-user-static \
            update-binfmts:binfmt-support sbatch:slurm-wlm slurmd:slurm-wlm munged:munge; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair##*:}")
done
# slurm-wlm + munge: the local Slurm of tests/engine/test_slurm_engine.py (the test starts its
# own munged, slurmctld and slurmd on localhost, and stops them; nothing runs between tests).
if [ "${#need[@]}" -gt 0 ]; then
  echo "+ apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# arm64 (Grace) containers and chroots run under qemu-user: the kernel hands aarch64 programs
# to qemu-aarch64-static through binfmt_misc (flag F: the handler is opened now, so it works
# inside containers too).
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if ! grep -q enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null; then
  echo "+ update-binfmts --enable qemu-aarch64"
  update-binfmts --enable qemu-aarch64 >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "+ dockerd (log: /var/log/k3env-dockerd.log)"
  nohup dockerd >/var/log/k3env-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/k3env-dockerd.log" >&2; exit 1; }
fi

if ! curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1; then
  conf=/etc/k3env/registry.yml
  mkdir -p /etc/k3env /var/lib/k3env-registry
  cat >"$conf" <<'YML'
version: 0.1
storage:
  filesystem:
    rootdirectory: /var/lib/k3env-registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:5000
YML
  echo "+ docker-registry serve $conf (log: /var/log/k3env-registry.log)"
  nohup docker-registry serve "$conf" >/var/log/k3env-registry.log 2>&1 &
  for _ in $(seq 1 40); do curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1 && break; sleep 0.25; done
  curl -fsS http://127.0.0.1:5000/v2/ >/dev/null || { echo "registry did not start" >&2; exit 1; }
fi

# nox and uv pinned: uv resolves the twin's closure (`k3env twin --resolve`), and another uv
# release may resolve the same inputs at the same index cut-off to other bytes.
NOX_VERSION=2026.10.20
UV_VERSION=0.13.9
if [ "$(python3 -m nox --version 2>&1)" != "$NOX_VERSION" ] || \
   [ "$(uv --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  # uv: nox makes its sessions' venvs with it (seconds, not a pip run each).
  echo "+ python3 -m pip install nox==$NOX_VERSION uv==$UV_VERSION"
  python3 -m pip install -q "nox==$NOX_VERSION" "uv==$UV_VERSION"
fi
# Upstream sources for a host without GitHub (CI): the real NVIDIA/srt-slurm history as a git
# bundle, served in place of GitHub the way a networked host reaches it. A mirror clone of the
# bundle (checked: its sha256, and the pinned tag naming the pinned commit), and git told to
# fetch the lock's URL from it (`url.<mirror>.insteadOf`): the lock is unchanged, and
# `k3env srt materialize` without --source gets the real srt-slurm.
upstream="${K3ENV_UPSTREAM:-}"
for candidate in "$(cd "$(dirname "$0")/.." && pwd)/../shared/upstream" /work/shared/upstream; do
  [ -z "$upstream" ] && [ -f "$candidate/srt-slurm.bundle" ] && upstream="$candidate"
done
SRT_BUNDLE_SHA256=ea462bf504bb12f31467c8b411444337c00dedf49e146740911a945ffb150ba9
SRT_URL=https://github.com/NVIDIA/srt-slurm.git
if [ -n "$upstream" ] && [ -f "$upstream/srt-slurm.bundle" ]; then
  mirror=/var/lib/k3env-upstream/srt-slurm.git
  if [ ! -d "$mirror" ]; then
    echo "$SRT_BUNDLE_SHA256  $upstream/srt-slurm.bundle" | sha256sum -c --quiet - || {
      echo "$upstream/srt-slurm.bundle is not the bundle this script knows (sha256)" >&2; exit 1; }
    echo "+ git clone --mirror $upstream/srt-slurm.bundle $mirror"
    mkdir -p "$(dirname "$mirror")"
    git clone -q --mirror "$upstream/srt-slurm.bundle" "$mirror.partial" 2>/dev/null
    mv "$mirror.partial" "$mirror"
  fi
  pinned=$(git -C "$mirror" rev-parse 'refs/tags/v1.0.36^{commit}')
  [ "$pinned" = cb651682117df129162cd276cf567ec70dc57b36 ] || {
    echo "$mirror: v1.0.36 is $pinned, not the pinned commit" >&2; exit 1; }
  git config --global "url.$mirror.insteadOf" "$SRT_URL"
  echo "srt-slurm: $SRT_URL served from $mirror (the real history, $upstream)"
fi
# The cluster's runtime, built from its pinned sources (the versions clusters/*.toml name):
# enroot 4.1.2 and pyxis 0.24.0 from ../shared/upstream (each archive checked against its git
# commit and sha256 before it is built), into /opt/k3env-cluster; a stamp per build makes it
# idempotent. tests/engine/test_pyxis_engine.py runs k3env's images through them under the
# local Slurm. (glibc 2.36 has no strlcpy: enroot's sources get <bsd/string.h>.)
if [ -n "$upstream" ] && [ -f "$upstream/enroot-4.1.2.tar.gz" ] && [ -f "$upstream/pyxis-0.24.0.tar.gz" ]; then
(
set -euo pipefail

K3ENV_CLUSTER_PREFIX=${K3ENV_CLUSTER_PREFIX:-/opt/k3env-cluster}

ENROOT_TGZ=$upstream/enroot-4.1.2.tar.gz
ENROOT_COMMIT=bd51f53b6fa954805ae3e1985c5dc7594ff66d05
ENROOT_SHA256=817e8d551135e6f3fc311d1ee57b03fb4d30325acba732f8dea43069ca11f8d3
ENROOT_MAIN_TGZ=$upstream/enroot-main-8ea147d.tar.gz
ENROOT_MAIN_COMMIT=8ea147d337da60cb1c557140f3a85cdf0d620968
ENROOT_MAIN_SHA256=c0353050fe78fe71b11ddbbcd2d054362a5d87b0543c6fa06e3b711aba977256
PYXIS_TGZ=$upstream/pyxis-0.24.0.tar.gz

# Build: gcc make libbsd-dev makeself libslurm-dev (pyxis must match the installed Slurm).
# enroot runtime (its deb's Depends/Recommends/Suggests): bash curl mawk jq parallel passwd
# squashfs-tools zstd pigz bsdextrautils util-linux ncurses-bin; squashfuse for
# pyxis use_squashfuse=1 / `enroot start x.sqsh` without unpacking.  git: get-tar-commit-id.
# Slurm itself (slurmctld slurmd slurm-client munge) is expected from the host setup.
pkgs="git gcc make libbsd-dev makeself libslurm-dev curl jq parallel passwd squashfs-tools
      zstd pigz bsdextrautils util-linux ncurses-bin squashfuse"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "k3env-cluster: apt-get install$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# shellcheck source=scripts/debian-root.sh
. "$(dirname "$0")/debian-root.sh"  # check_archive, PYXIS_COMMIT, PYXIS_SHA256
check_archive "$ENROOT_TGZ" "$ENROOT_COMMIT" "$ENROOT_SHA256"
check_archive "$PYXIS_TGZ" "$PYXIS_COMMIT" "$PYXIS_SHA256"

build=$(mktemp -d /tmp/k3env-cluster-build.XXXXXX)

# enroot: deps/ submodules are not in the archive; Debian provides makeself and libbsd.
# FORCE_GLIBC=1 builds the helpers against glibc (not the bundled musl).  glibc 2.36 has no
# strlcpy/strlcat: CPPFLAGS (from the environment, so the Makefile appends rather than replaces
# it) force-includes <bsd/string.h>; -D_GNU_SOURCE= matches the sources' own empty #define.
ENROOT_CPPFLAGS="-D_GNU_SOURCE= -include bsd/string.h"
ENROOT_LDLIBS="-l:libbsd.a -l:libbsd.so"
build_enroot() {  # ARCHIVE COMMIT DIR NAME: the archive's one top directory built into DIR
    local stamp="enroot $2 FORCE_GLIBC=1 CPPFLAGS=$ENROOT_CPPFLAGS LDLIBS=$ENROOT_LDLIBS"
    [ "$(cat "$3/.k3env-stamp" 2>/dev/null)" = "$stamp" ] && return 0
    echo "k3env-cluster: building enroot $4 into $3"
    rm -rf "$3"
    local src
    src=$(mktemp -d "$build/enroot.XXXXXX")
    tar xzf "$1" -C "$src"
    (
        cd "$src"/*/
        mkdir -p deps/dist/makeself/bin
        cp "$(command -v makeself)" deps/dist/makeself/bin/enroot-makeself
        CPPFLAGS="$ENROOT_CPPFLAGS" make -s -o deps FORCE_GLIBC=1 LDLIBS="$ENROOT_LDLIBS" \
            prefix="$3" install >"$src/make.log" 2>&1 || { cat "$src/make.log" >&2; exit 1; }
    )
    echo "$stamp" > "$3/.k3env-stamp"
}
ENROOT_DIR=$K3ENV_CLUSTER_PREFIX/enroot
build_enroot "$ENROOT_TGZ" "$ENROOT_COMMIT" "$ENROOT_DIR" 4.1.2
# enroot main at 8ea147d (what enroot 4.2.0 released: /etc/rc's `# enroot-provenance: <uri>`
# first line), built the same way beside it (~3 s) for `export --check`'s engine test of both
# (tests/engine/test_handoff_engine.py); it still calls itself 4.1.2. Only where the archive is.
ENROOT_MAIN_DIR=$K3ENV_CLUSTER_PREFIX/enroot-main
if [ -f "$ENROOT_MAIN_TGZ" ]; then
    check_archive "$ENROOT_MAIN_TGZ" "$ENROOT_MAIN_COMMIT" "$ENROOT_MAIN_SHA256"
    build_enroot "$ENROOT_MAIN_TGZ" "$ENROOT_MAIN_COMMIT" "$ENROOT_MAIN_DIR" "main 8ea147d"
fi

# pyxis: built against Debian's libslurm-dev; a SPANK plugin must match slurmd's Slurm version.
PYXIS_DIR=$K3ENV_CLUSTER_PREFIX/pyxis
slurm_ver=$(dpkg-query -W -f='${Version}' libslurm-dev)
slurmd_ver=$(dpkg-query -W -f='${Version}' slurmd 2>/dev/null || true)
if [ -n "$slurmd_ver" ] && [ "$slurmd_ver" != "$slurm_ver" ]; then
    echo "k3env-cluster: WARNING libslurm-dev $slurm_ver != slurmd $slurmd_ver" >&2
fi
pyxis_stamp="pyxis $PYXIS_COMMIT libslurm-dev=$slurm_ver"
if [ "$(cat "$PYXIS_DIR/.k3env-stamp" 2>/dev/null)" != "$pyxis_stamp" ]; then
    echo "k3env-cluster: building pyxis 0.24.0 into $PYXIS_DIR (libslurm-dev $slurm_ver)"
    rm -rf "$PYXIS_DIR"
    tar xzf "$PYXIS_TGZ" -C "$build"
    make -s -C "$build/pyxis-0.24.0" prefix="$PYXIS_DIR" install >"$build/pyxis-make.log" 2>&1 \
        || { cat "$build/pyxis-make.log" >&2; exit 1; }
    install -m 755 "$build/pyxis-0.24.0/importers/caching_importer.sh" "$PYXIS_DIR/share/pyxis/"
    echo "$pyxis_stamp" > "$PYXIS_DIR/.k3env-stamp"
fi

rm -rf "$build"
main_said=""
[ -x "$ENROOT_MAIN_DIR/bin/enroot" ] && main_said=", enroot main 8ea147d ($ENROOT_MAIN_DIR)"
echo "cluster runtime: enroot $("$ENROOT_DIR/bin/enroot" version) ($ENROOT_DIR)$main_said, pyxis 0.24.0 ($PYXIS_DIR)"
)
fi
# pyenv puts new console scripts on PATH only after a rehash.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
echo "host ready: $(docker version -f 'dockerd {{.Server.Version}}'), registry 127.0.0.1:5000"
