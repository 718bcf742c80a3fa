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
# pyenv puts new console scripts on PATH only after a rehash.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
echo "host ready: $(docker version -f 'dockerd {{.Server.Version}}'), registry 127.0.0.1:5000"
