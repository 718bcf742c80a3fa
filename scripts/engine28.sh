#!/usr/bin/env bash
# A Docker 28 engine beside the host's own (Debian 12's 20.10), from Debian sid's packages:
# docker.io 28.5.2 with containerd 2.1.9, in a debootstrapped sid root, with its own socket,
# data root, exec root and bridge. The host's dockerd, its socket and docker0 are not touched.
#
#   bash scripts/engine28.sh [containerd|classic] [NAME]    # as root, on a Debian 12 host
#
# containerd (the default): the containerd image store (`features.containerd-snapshotter`),
# what Docker 29 uses on a new install; an image's ID is its manifest digest there.
# classic: the graph-driver store (overlay2), where an image's ID is its config digest.
# Both can run at once (one socket each; NAME, default the store, names another engine of its
# own: tests start one and purge it). The last line printed is the DOCKER_HOST to use:
#
#   export "$(bash scripts/engine28.sh containerd | tail -n 1)"
#
# Idempotent: the sid root is made once under /var/lib/k3env-docker28 (a second run only
# checks the mounts and the daemon, ~1 s); `K3ENV_DOCKER28_STOP=1` stops that engine (its data
# root stays, images survive a restart; `K3ENV_DOCKER28_PURGE=1` removes it too).
# `K3ENV_DOCKER28_CLI=1` also installs the root's own client (docker-cli 28.5.2 and its
# docker-buildx 0.29.1 plugin: `docker build` on Docker 28 as its users run it; Debian 12's 20.10
# client cannot drive that BuildKit) and prints `DOCKER_CLI=/var/lib/k3env-docker28/docker`
# before the DOCKER_HOST line: a wrapper that runs it in the root, in the current directory
# (under /tmp, /var/tmp, /root or /home: what is bound there). How it runs, and why each mount
# is there: ../shared/upstream/README.md, "Newer engines and Slurm from Debian's own packages".
set -euo pipefail

store="${1:-containerd}"
name="${2:-$store}"   # another name: another engine (socket, data root, bridge) on the same root
case "$store" in
  containerd) snapshotter=true ;;
  classic) snapshotter=false ;;
  *) echo "usage: $0 [containerd|classic] [NAME]" >&2; exit 2 ;;
esac
case "$name" in
  *[!a-z0-9-]* | "") echo "$0: NAME is lower-case letters, digits and '-'" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "$0: run as root (debootstrap, chroot, mounts, a bridge)" >&2; exit 2; }
# shellcheck source=scripts/debian-root.sh
. "$(dirname "$0")/debian-root.sh"

top=/var/lib/k3env-docker28
root="$top/root"
run="/run/k3env-docker28/$name"           # socket, exec root and pidfile (host path)
data="/var/lib/k3env-docker28-data/$name"  # the data root (host path, bound at the same path)
sock="$run/docker.sock"
log="$top/$name.log"
bridge="k3e28-${name:0:9}"                 # an interface name has at most 15 characters
host="unix://$sock"

ping() { curl -fsS --max-time 10 --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; }
alive() { [ -f "$run/dockerd.pid" ] && kill -0 "$(cat "$run/dockerd.pid")" 2>/dev/null; }

# K3ENV_DOCKER28_STOP=1: stop this engine and take its bridge away; with K3ENV_DOCKER28_PURGE=1
# also its data root and its mounts in the root (a test's engine: nothing of it stays).
if [ "${K3ENV_DOCKER28_STOP:-}" = 1 ]; then
  if [ -f "$run/dockerd.pid" ] && kill -0 "$(cat "$run/dockerd.pid")" 2>/dev/null; then
    pid="$(cat "$run/dockerd.pid")"
    say "kill $pid (dockerd 28, $name)"
    kill "$pid"
    for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { echo "$0: dockerd $pid did not stop" >&2; exit 1; }
  fi
  ip link del "$bridge" 2>/dev/null || true
  if [ "${K3ENV_DOCKER28_PURGE:-}" = 1 ]; then
    for d in "$root$data" "$root$run"; do
      if mountpoint -q "$d"; then umount -R "$d"; fi
      rmdir "$d" 2>/dev/null || true
    done
    say "rm -rf $data $run"
    rm -rf "$data" "$run" "$log" "$root/etc/k3env-docker28/$name.json"
  fi
  exit 0
fi

# --- mounts ------------------------------------------------------------------------------------
# The root must be a mount point (bound onto itself first: a later bind of it would hide what
# is mounted below), and so must the data root: containerd's snapshotters look their
# directory up in the mount table ("failed to find the mount info"), and the classic store's
# load remounts / ("remount /, flags: 0x84000: invalid argument"). What k3env bind-mounts into
# containers must be at the same path in here (temporary directories, the state's wheelhouse
# under ~/.cache/k3env); K3ENV_DOCKER28_BINDS adds more.
mounts() {
  mountpoint -q "$root" || mount --bind "$root" "$root"
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  mountpoint -q "$root/sys" || mount --rbind /sys "$root/sys"
  mountpoint -q "$root/dev" || mount --rbind /dev "$root/dev"
  mkdir -p "$run" "$data"
  local d
  for d in "$run" "$data" /tmp /var/tmp /root /home ${K3ENV_DOCKER28_BINDS:-}; do
    [ -d "$d" ] || continue
    mkdir -p "$root$d"
    mountpoint -q "$root$d" || mount --bind "$d" "$root$d"
  done
}

# K3ENV_DOCKER28_CLI=1: the root's docker CLI and buildx plugin (installed once, the versions
# its lists name: those of its docker.io) and the wrapper that runs them there.
client() {
  [ "${K3ENV_DOCKER28_CLI:-}" = 1 ] || return 0
  if [ ! -x "$root/usr/bin/docker" ] || [ ! -x "$root/usr/libexec/docker/cli-plugins/docker-buildx" ]; then
    exec 8>"$top/.lock"
    flock 8
    mounts
    say "chroot $root apt-get install docker-cli docker-buildx"
    { DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get "${apt_opts[@]}" install -y docker-cli docker-buildx \
        || { chroot "$root" apt-get "${apt_opts[@]}" update \
             && DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get "${apt_opts[@]}" install -y docker-cli docker-buildx; }
      chroot "$root" apt-get clean
    } >"$top/apt-cli.log" 2>&1 || { tail -n 20 "$top/apt-cli.log" >&2; exit 1; }
    flock -u 8
    exec 8>&-
  fi
  cat >"$top/docker.new" <<EOF
#!/bin/sh
# Docker 28's own client (docker-cli, docker-buildx) in $root, from scripts/engine28.sh:
# run there, in this directory (if bound there); DOCKER_HOST names the engine.
exec chroot $root /bin/sh -c 'cd "\$0" 2>/dev/null || cd /; exec /usr/bin/docker "\$@"' "\$PWD" "\$@"
EOF
  chmod 755 "$top/docker.new"
  mv "$top/docker.new" "$top/docker"
  echo "DOCKER_CLI=$top/docker"
}

# Already up: nothing to do. Running but not answering (starting, or busy): wait for it, and
# never start a second daemon over its socket.
if ping || { alive && for _ in $(seq 1 60); do ping && break; sleep 1; done && ping; }; then
  client
  echo "DOCKER_HOST=$host"
  exit 0
fi
if alive; then
  echo "$0: dockerd $(cat "$run/dockerd.pid") runs but does not answer on $sock (log: $log);" \
    "stop it with K3ENV_DOCKER28_STOP=1 $0 $store $name" >&2
  exit 1
fi

# --- the sid root, made once -----------------------------------------------------------------
mkdir -p "$top"
exec 9>"$top/.lock"
flock 9  # one maker of the root at a time (tests start engines from two processes)
if [ ! -f "$root/.k3env-ready" ]; then
  debian_root sid "$root" "$top/debootstrap.log"
  mounts
  debian_root_install "chroot $root" "$top/apt.log" docker.io containerd runc iptables ca-certificates curl
  chroot "$root" dockerd --version >&2
  touch "$root/.k3env-ready"
fi
mounts
flock -u 9
exec 9>&-  # the daemon started below does not inherit it

# --- its own bridge and daemon ------------------------------------------------------------
if [ ! -e "/sys/class/net/$bridge" ]; then
  say "ip link add $bridge type bridge"
  ip link add "$bridge" type bridge
fi
mkdir -p "$root/etc/k3env-docker28"
conf="/etc/k3env-docker28/$name.json"
printf '{"bridge": "%s", "iptables": false, "ip6tables": false, "features": {"containerd-snapshotter": %s}}\n' \
  "$bridge" "$snapshotter" >"$root$conf"
rm -f "$sock" "$run/dockerd.pid"  # stale: no daemon of this name runs (alive, above)
say "chroot $root dockerd --config-file $conf -H $host (log: $log)"
nohup chroot "$root" /usr/sbin/dockerd --config-file "$conf" -H "$host" --data-root "$data" \
  --exec-root "$run/exec" --pidfile "$run/dockerd.pid" >"$log" 2>&1 </dev/null &
for _ in $(seq 1 120); do ping && break; sleep 0.5; done
ping || { tail -n 20 "$log" >&2; echo "$0: dockerd 28 did not start; see $log" >&2; exit 1; }
curl -fsS --unix-socket "$sock" http://d/info \
  | python3 -c 'import json,sys; i=json.load(sys.stdin); print("+ dockerd", i["ServerVersion"], i["Driver"], dict(i.get("DriverStatus") or []).get("driver-type", ""), file=sys.stderr)'
client
echo "DOCKER_HOST=$host"
