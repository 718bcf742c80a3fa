# Sourced (not run) by scripts/engine28.sh and scripts/slurm-root.sh: a newer Debian beside the
# host's Debian 12, as a debootstrapped minbase root made from Debian's own mirror.
# How such roots ran here: ../shared/upstream/README.md, "Newer engines and Slurm from Debian's
# own packages".

say() { echo "+ $*" >&2; }

# The mirror the host's own apt uses (deb822 sources first, then sources.list).
debian_mirror() {
  local mirror="${K3ENV_DEBIAN_MIRROR:-}"
  if [ -z "$mirror" ]; then
    mirror="$(sed -n 's/^URIs:[[:space:]]*\(\S*\/debian\)\/\?$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)"
  fi
  if [ -z "$mirror" ]; then
    mirror="$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
  fi
  echo "${mirror:-http://deb.debian.org/debian}"
}

# sid's Release file can be past its Valid-Until on a snapshot-backed mirror.
apt_opts=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -o Dpkg::Use-Pty=0)

# debian_root SUITE ROOT LOG: debootstrap a minbase SUITE at ROOT once (into ROOT.partial, moved
# into place whole), with no service started while packages install.
debian_root() {
  local suite="$1" root="$2" log="$3" mirror
  command -v debootstrap >/dev/null || { say "apt-get install debootstrap"; apt-get install -y -qq debootstrap >/dev/null; }
  if [ ! -x "$root/usr/bin/apt-get" ]; then
    mirror="$(debian_mirror)"
    rm -rf "$root.partial"
    mkdir -p "$(dirname "$root")"
    say "debootstrap --variant=minbase --include=ca-certificates $suite $root $mirror"
    debootstrap --variant=minbase --include=ca-certificates "$suite" "$root.partial" "$mirror" >"$log" 2>&1 \
      || { tail -n 20 "$log" >&2; exit 1; }
    mv "$root.partial" "$root"
  fi
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
}

# debian_root_install RUN LOG PKG...: apt-get install PKG... (no recommends) where RUN runs a
# command inside the root (`chroot ROOT` with its mounts made, or a wrapper that enters it).
debian_root_install() {
  local run="$1" log="$2"
  shift 2
  say "$run apt-get install $*"
  {
    $run apt-get "${apt_opts[@]}" update
    DEBIAN_FRONTEND=noninteractive $run apt-get "${apt_opts[@]}" install -y "$@"
    $run apt-get clean
  } >"$log" 2>&1 || { tail -n 20 "$log" >&2; exit 1; }
}

# check_archive FILE COMMIT SHA256: an upstream source archive is the one pinned (its git commit,
# from the archive's pax header, and its sha256), or the script stops.
check_archive() {
  [ -r "$1" ] || { echo "k3env: missing $1" >&2; exit 1; }
  local got  # (not `zcat | git ...`: zcat's SIGPIPE would fail the pipeline under pipefail)
  got=$(git get-tar-commit-id < <(zcat "$1"))
  [ "$got" = "$2" ] || { echo "k3env: $1 is commit $got, expected $2" >&2; exit 1; }
  echo "$3  $1" | sha256sum -c --quiet - || { echo "k3env: $1 sha256 mismatch" >&2; exit 1; }
}

# The pinned pyxis source (clusters/*.toml name 0.24.0), built against each Slurm it runs in.
PYXIS_COMMIT=107519944221822ea1dace4db8e7234b2eaa4cd5
PYXIS_SHA256=063653ba39125ac29796cc6079701d1ec34dd4c5baf698efacc0f36bf3619681

