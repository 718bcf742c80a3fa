#!/usr/bin/env bash
# A newer Slurm beside the host's own (Debian 12's 22.05): a debootstrapped Debian root with that
# suite's Slurm and munge, pyxis 0.24.0 built inside against that Slurm, and the host's enroot
# 4.1.2 (/opt/k3env-cluster, scripts/host-setup.sh) bound in. Nothing is installed on the host.
#
#   bash scripts/slurm-root.sh [trixie|sid]      # as root; trixie: Slurm 24.11, sid: 26.05
#
# The last line printed is a directory of wrappers (slurmctld, slurmd, munged, srun, sbatch,
# scontrol, sinfo, squeue, ...) to put first on PATH: each runs that command inside the root.
# Idempotent: the root is made once under /var/lib/k3env-slurm/SUITE (a stamp; later runs ~1 s).
#
# Why a wrapper enters the root by pivot_root and not chroot: enroot makes a user namespace,
# which the kernel refuses to a chrooted process ("enroot-nsenter: failed to create user
# namespace: Operation not permitted", then pyxis' task_init() fails with rc=-1). Each wrapper
# runs in a mount namespace of its own (`unshare --mount --propagation slave`), binds what jobs
# need into the root there (recursively: a checkout may itself be a mount, as CI's is) and
# pivots into it; the host's mount table never changes. K3ENV_SLURM_BINDS (space-separated host
# paths) adds binds, e.g. the checkout whose python a pyxis importer runs.
set -euo pipefail

suite="${1:-trixie}"
case "$suite" in
  trixie | sid) ;;
  *) echo "usage: $0 [trixie|sid]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "$0: run as root (debootstrap, namespaces, mounts)" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/debian-root.sh
. "$here/debian-root.sh"

top=/var/lib/k3env-slurm/$suite
root=$top/root
bin=$top/bin
enroot=/opt/k3env-cluster/enroot
[ -x "$enroot/bin/enroot" ] || { echo "$0: no enroot in $enroot (scripts/host-setup.sh builds it)" >&2; exit 1; }
upstream="${K3ENV_UPSTREAM:-}"
for candidate in "$here/../../shared/upstream" /work/shared/upstream; do
  [ -z "$upstream" ] && [ -f "$candidate/pyxis-0.24.0.tar.gz" ] && upstream="$candidate"
done
pyxis_tgz="${upstream:-?}/pyxis-0.24.0.tar.gz"
check_archive "$pyxis_tgz" "$PYXIS_COMMIT" "$PYXIS_SHA256"

# Slurm and munge; gcc, make and libslurm-dev build pyxis; enroot's run-time tools (its deb's
# Depends and Recommends, as host-setup.sh lists them) with libbsd0 for its helpers, squashfuse
# (pyxis use_squashfuse=1) and python3 (a job's /usr/bin/python3, the importer's).
pkgs=(slurmctld slurmd slurm-client munge libslurm-dev gcc make libc6-dev mount util-linux
      bash curl mawk jq parallel passwd squashfs-tools zstd pigz bsdextrautils ncurses-bin
      libbsd0 squashfuse fuse3 python3 ca-certificates)
stamp="${pkgs[*]} pyxis=$PYXIS_COMMIT"

mkdir -p "$top"
exec 9>"$top/.lock"
flock 9  # one maker at a time

# --- the wrappers ------------------------------------------------------------------------------
# Host paths every job reaches at the same path: temporary directories, home directories (pyenv's
# python, ~/.cache), the host's enroot, munge's key, name resolution. A checkout is not among
# them (the wrappers serve any): K3ENV_SLURM_BINDS names it.
binds="/tmp /var/tmp /root /home $enroot /etc/munge /etc/hosts /etc/resolv.conf"
# A wrapper is replaced whole (another process may be running the old one) and only if it changed.
put() {  # FILE: stdin's text, executable
  cat >"$1.partial.$$"
  chmod 755 "$1.partial.$$"
  if cmp -s "$1.partial.$$" "$1"; then rm -f "$1.partial.$$"; else mv "$1.partial.$$" "$1"; fi
}
mkdir -p "$bin"
put "$bin/k3env-enter" <<EOF
#!/bin/bash
# k3env-enter CMD [ARG...]: CMD inside $root (made by scripts/slurm-root.sh $suite).
set -euo pipefail
export K3ENV_SLURM_ROOT=$root
exec unshare --mount --propagation slave -- /bin/bash -c '
  set -euo pipefail
  root=\$K3ENV_SLURM_ROOT cwd=\$PWD
  mount --bind "\$root" "\$root"        # pivot_root needs the new root to be a mount point
  mount -t proc proc "\$root/proc"
  for d in /sys /dev $binds \${K3ENV_SLURM_BINDS:-}; do
    [ -e "\$d" ] && [ "\$d" != / ] || continue
    if [ -d "\$d" ]; then mkdir -p "\$root\$d"; else [ -e "\$root\$d" ] || touch "\$root\$d"; fi
    mount --rbind "\$d" "\$root\$d"
    mount --make-rslave "\$root\$d"
  done
  cd "\$root"
  mkdir -p .k3env-host
  pivot_root . .k3env-host
  ! command -v umount >/dev/null || umount -l /.k3env-host  # (not yet in a fresh root)
  cd "\$cwd" 2>/dev/null || cd /
  exec "\$@"' k3env-enter "\$@"
EOF
# runuser, useradd and usermod: a job of another user is submitted, and its user exists, in here.
for cmd in slurmctld slurmd munged srun sbatch scontrol sinfo squeue scancel sacct \
           runuser useradd usermod; do
  printf '#!/bin/sh\nexec %s %s "$@"\n' "$bin/k3env-enter" "$cmd" | put "$bin/$cmd"
done

# --- the root, made once -------------------------------------------------------------------------
if [ "$(cat "$root/.k3env-ready" 2>/dev/null)" != "$stamp" ]; then
  debian_root "$suite" "$root" "$top/debootstrap.log"
  debian_root_install "$bin/k3env-enter" "$top/apt.log" "${pkgs[@]}"
  # pyxis against this root's Slurm (a SPANK plugin must match the slurmd that loads it).
  rm -rf "$root/usr/src/pyxis-0.24.0" "$root/opt/k3env-pyxis"
  tar xzf "$pyxis_tgz" -C "$root/usr/src"
  say "k3env-enter make -C /usr/src/pyxis-0.24.0 prefix=/opt/k3env-pyxis install"
  "$bin/k3env-enter" make -s -C /usr/src/pyxis-0.24.0 prefix=/opt/k3env-pyxis install \
    >"$top/pyxis-make.log" 2>&1 || { cat "$top/pyxis-make.log" >&2; exit 1; }
  rm -rf "$root/usr/src/pyxis-0.24.0"
  echo "$stamp" >"$root/.k3env-ready"
fi
flock -u 9
exec 9>&-
echo "slurm root: $("$bin/slurmd" -V) ($root), pyxis 0.24.0 (/opt/k3env-pyxis inside)," \
  "enroot $("$enroot/bin/enroot" version) ($enroot)" >&2
echo "$bin"
