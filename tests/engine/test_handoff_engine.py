"""Cluster handoff on a real registry and real squashfs-tools: push by digest, export, check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from k3env.cli import main
from k3env.engine.dockerd import DockerEngine
from k3env.state import State

from ..test_push_unit import rc_script
from .conftest import REGISTRY, TEST_LOCK, BaseFixture, _require, run_json, write_project

pytestmark = [pytest.mark.engine, pytest.mark.registry]

LOCK = TEST_LOCK


def registry_digest(reference: str) -> str:
    repo, tag = reference.split("/", 1)[1].rsplit(":", 1)
    request = urllib.request.Request(
        f"http://{REGISTRY}/v2/{repo}/manifests/{tag}",
        method="HEAD",
        headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.docker.distribution.manifest.v2+json"
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.headers["Docker-Content-Digest"])


def test_push_records_the_registry_digest_and_skips_present_layers(
    project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    first = run_json(capsys, "push")["images"][0]
    assert first["digest"] == registry_digest(first["reference"])
    # This registry (distribution 2.8, no auth) answers enroot 4.1.2's permission probe (a HEAD
    # with no Accept header) for k3env's OCI manifest with 404: said at the push.
    assert "gets HTTP 404 for this OCI manifest" in first["enroot_probe"]
    # The base was pushed before (by digest, as the lock pins it): only the new layer is sent.
    assert first["layers_sent"] <= 1 and first["layers_skipped"] >= 1
    record = State().read_json("pushed", first["image_id"].removeprefix("sha256:") + ".json")
    assert record["digest"] == first["digest"]
    assert first["enroot_uri"] == f"docker://{REGISTRY}#{first['by_digest'].split('/', 1)[1]}"
    again = run_json(capsys, "push")["images"][0]
    assert again["digest"] == first["digest"] and again["layers_sent"] == 0


def test_push_to_a_registry_that_is_down_leaves_no_record(
    project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    assert main(["push", "--lock", LOCK, "--registry", "127.0.0.1:5999"]) == 3
    assert "cannot reach the registry" in capsys.readouterr().err
    # The tag made for the push went with it: no stray 127.0.0.1:5999/... left behind.
    stray = subprocess.run(
        ["docker", "images", "-q", "127.0.0.1:5999/k3env-test/probe"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert stray == []
    assert not State().path("pushed").exists() or not any(State().path("pushed").iterdir())


def _unsquash(sqsh: str, dest: Path) -> Path:
    subprocess.run(["unsquashfs", "-q", "-d", str(dest), sqsh], check=True, capture_output=True)
    return dest


def _squash(root: Path, out: Path) -> Path:
    """A squashfs of ``root`` as enroot makes one: all-root, enroot's default options."""
    subprocess.run(
        ["mksquashfs", str(root), str(out), "-noappend", "-quiet", "-no-progress", "-all-root",
         "-comp", "lzo", "-noD"],
        check=True,
    )  # fmt: skip
    return out


def _inspect(image_id: str) -> dict[str, object]:
    out = subprocess.run(
        ["docker", "image", "inspect", image_id], capture_output=True, text=True, check=True
    ).stdout
    config: dict[str, object] = json.loads(out)[0]["Config"]
    return config


def _enroot_rc(config: dict[str, object]) -> str:
    """/etc/rc as enroot 4.x writes it for this config (../shared/FACTS.md): every label as
    `# KEY VALUE` sorted by key, a blank line, then the fixed script; the test base has no
    entrypoint, Cmd ["python3"] and no WorkingDir, so exec gets two spaces and 'python3'."""
    labels = config.get("Labels") or {}
    assert isinstance(labels, dict)
    head = "".join(f"# {k} {v}\n" for k, v in sorted(labels.items()))
    assert config.get("Cmd") == ["python3"] and not config.get("Entrypoint")
    return head + "\n" + rc_script("/", "", "'python3'")


def test_export_is_deterministic_and_laid_out_as_enroot_does(
    project: Path,
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = run_json(capsys, "export", "--out", "a")["images"][0]
    # The second from a shell like `nix develop`'s: its SOURCE_DATE_EPOCH made mksquashfs
    # refuse the -mkfs-time the export gives it ("can't be used at the same time").
    for name, value in {"SOURCE_DATE_EPOCH": "315532800", "TZ": "America/New_York"}.items():
        monkeypatch.setenv(name, value)
    b = run_json(capsys, "export", "--out", "b")["images"][0]
    assert a["sha256"] == b["sha256"]
    assert Path(a["path"]).read_bytes() == Path(b["path"]).read_bytes()
    sqsh = a["path"]

    def cat(path: str) -> str:
        return subprocess.run(
            ["unsquashfs", "-cat", sqsh, path], capture_output=True, text=True, check=True
        ).stdout

    config = _inspect(a["image_id"])
    assert cat("etc/environment").splitlines() == config["Env"]
    assert "A=1" in config["Env"] and "STACK_WIDE=1" in config["Env"]
    assert cat("etc/rc") == _enroot_rc(config)
    assert "idx_mapping.long()" in cat("usr/lib/python3/dist-packages/k3test/mod.py")
    listing = subprocess.run(
        ["unsquashfs", "-lln", sqsh], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert listing[0].startswith("drwxr-xr-x 0/0")  # the root, as enroot's `mkdir rootfs`
    assert not any("squashfs-root/dev/" in line or ".dockerenv" in line for line in listing)
    # The image's own mtimes stay (Python's timestamp .pyc stay valid): a base file keeps its
    # layer's mtime, not the image's creation time.
    base_file = next(line for line in listing if line.endswith("/usr/bin/python3.11"))
    assert " 1970-01-01 " not in base_file
    assert main(["export", "--lock", LOCK, "--check", sqsh]) == 0


def _registry_bytes(path: str, accept: str = "*/*") -> bytes:
    request = urllib.request.Request(f"http://{REGISTRY}{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        return bytes(response.read())


def _registry_json(path: str, accept: str) -> dict[str, Any]:
    doc = json.loads(_registry_bytes(path, accept))
    assert isinstance(doc, dict)
    return doc


def test_a_signed_export_carries_its_sbom_and_provenance_and_a_tamper_is_refused(
    project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    """build -> export --sign-key, the image removed and rebuilt -> push -> export --sign-key
    again: the same SBOM bytes, attached to the pushed manifest; export --check --key passes on
    the real image, and refuses an edited SBOM and another key, naming the gate."""
    keys = {}
    for name in ("k3env", "other"):
        key, pub = project / f"{name}.key", project / f"{name}.pub"
        subprocess.run(
            f"openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt "
            f"-out {key} && openssl ec -in {key} -pubout -out {pub}",
            shell=True, check=True, capture_output=True,
        )  # fmt: skip
        keys[name] = (key, pub)
    b = run_json(capsys, "export", "--out", "b", "--sign-key", str(keys["k3env"][0]))["images"][0]
    assert b["referrers"] is None  # not pushed yet: nothing attached, said
    # Removed from the engine: push and export build it again, from the same lock.
    subprocess.run(["docker", "rmi", "-f", b["image_id"]], check=True, capture_output=True)
    pushed = run_json(capsys, "push")["images"][0]
    a = run_json(capsys, "export", "--out", "a", "--sign-key", str(keys["k3env"][0]))["images"][0]
    # Attached to the pushed manifest as OCI referrers; distribution 2.8 has no referrers API,
    # so the spec's fallback tag sha256-<hex> names their index.
    repo = pushed["reference"].split("/", 1)[1].rsplit(":", 1)[0]
    tag = "sha256-" + pushed["digest"].removeprefix("sha256:")
    index = _registry_json(f"/v2/{repo}/manifests/{tag}", "application/vnd.oci.image.index.v1+json")
    assert [m["artifactType"] for m in index["manifests"]] == [
        "application/vnd.cyclonedx+json",
        "application/vnd.k3env.signature.v1+base64",
        "application/vnd.dsse.envelope.v1+json",
    ]
    assert [m["digest"] for m in index["manifests"]] == [r["digest"] for r in a["referrers"]]
    sbom_ref = _registry_json(f"/v2/{repo}/manifests/{index['manifests'][0]['digest']}",
                              "application/vnd.oci.image.manifest.v1+json")  # fmt: skip
    assert sbom_ref["subject"]["digest"] == pushed["digest"]
    blob = _registry_bytes(f"/v2/{repo}/blobs/{sbom_ref['layers'][0]['digest']}")
    assert blob == Path(a["path"] + ".cdx.json").read_bytes()
    sbom_a = Path(a["path"] + ".cdx.json").read_bytes()
    assert a["image_id"] == b["image_id"]  # rebuilt: the same image
    assert sbom_a == Path(b["path"] + ".cdx.json").read_bytes()  # and the same SBOM bytes
    doc = json.loads(sbom_a)
    kinds = {c.get("purl", "").split("/", 1)[0] for c in doc["components"]}
    assert {"pkg:deb", "pkg:pypi"} <= kinds  # dpkg's packages and Python's dists, from the file
    assert any(c["name"] == "libc6" for c in doc["components"])
    check = run_json(capsys, "export", "--check", a["path"], "--key", str(keys["k3env"][1]))
    by = {g["gate"]: g for g in check["checks"]}
    assert [by[n]["status"] for n in ("sbom", "sbom signature", "provenance")] == ["passed"] * 3
    assert (
        main(["export", "--lock", LOCK, "--check", a["path"], "--key", str(keys["other"][1])]) == 4
    )
    assert "sbom signature failed: not the given key's signature" in capsys.readouterr().err
    # verify --key: the last export's signatures and statement, by the export's record; and
    # dpkg's packages read from the real image's files into its facts, as the SBOM lists them.
    verify = ["verify", "--lock", LOCK, "--json", "--key"]
    main([*verify, str(keys["k3env"][1])])
    (image,) = json.loads(capsys.readouterr().out)["images"]
    assert [(g["gate"], g["status"]) for g in image["sbom"]["gates"]] == [
        ("sbom", "not checked"), ("sbom signature", "passed"), ("provenance", "passed"),
    ]  # fmt: skip
    debs = {d["name"]: d["version"] for d in image["facts"]["debian_packages"]}
    listed = {c["name"]: c["version"] for c in doc["components"]
              if c.get("purl", "").startswith("pkg:deb/")}  # fmt: skip
    assert debs == listed and "libc6" in debs
    Path(a["path"] + ".cdx.json").write_bytes(sbom_a.replace(b'"libc6"', b'"libc7"', 1))
    assert main([*verify, str(keys["k3env"][1])]) == 4
    out = json.loads(capsys.readouterr().out)
    assert "sbom signature failed: not the given key's signature" in out["error"]["message"]
    assert (
        main(["export", "--lock", LOCK, "--check", a["path"], "--key", str(keys["k3env"][1])]) == 4
    )
    assert "sbom failed: differs from the SBOM made from the file" in capsys.readouterr().err


@pytest.fixture(scope="module")
def exported_root(
    tmp_path_factory: pytest.TempPathFactory, test_base: BaseFixture
) -> Iterator[Path]:
    """The rootfs of the test image, exported once for the module and re-laid as `enroot
    import` lays it out: /etc/rc and /etc/environment written from the image config in
    enroot's documented form."""
    root = tmp_path_factory.mktemp("exported")
    write_project(root, test_base)
    proc = subprocess.run(
        [sys.executable, "-m", "k3env", "export", "--lock", LOCK, "--out", "a", "--json", "-q"],
        cwd=root, env={**os.environ, "K3ENV_STATE_DIR": str(root / "state")},
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    exported = json.loads(proc.stdout)["images"][0]
    rootfs = _unsquash(str(root / exported["path"]), root / "rootfs")
    config = _inspect(exported["image_id"])
    (rootfs / "etc/rc").write_text(_enroot_rc(config))
    env = config["Env"]
    assert isinstance(env, list)
    (rootfs / "etc/environment").write_text("".join(f"{e}\n" for e in env))
    yield rootfs


@pytest.fixture
def enroot_import(exported_root: Path, project: Path) -> Path:
    """This test's own copy of the exported rootfs, to tamper with."""
    root = project / "rootfs"
    subprocess.run(["cp", "-a", str(exported_root), str(root)], check=True)
    return root


def test_check_accepts_what_enroot_import_writes(
    enroot_import: Path, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sqsh = _squash(enroot_import, project / "enroot.sqsh")
    assert main(["export", "--lock", LOCK, "--check", str(sqsh)]) == 0, capsys.readouterr()


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + line)


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


K3TEST_INIT = "usr/lib/python3/dist-packages/k3test/__init__.py"
TAMPERING: dict[str, tuple[Callable[[Path], None], str]] = {
    "env-appended": (lambda r: _append(r / "etc/environment", "PYTHONHASHSEED=43\n"),
                     "etc/environment: extra line 'PYTHONHASHSEED=43'"),
    "ld-preload": (lambda r: _append(r / "etc/environment", "LD_PRELOAD=/x.so\n"),
                   "etc/environment: extra line 'LD_PRELOAD=/x.so'"),
    "env-changed": (lambda r: _replace(r / "etc/environment", "A=1", "A=2"),
                    "etc/environment: changed: 'A=2' (image config: 'A=1')"),
    "exec-rewritten": (lambda r: _replace(r / "etc/rc", "exec  'python3'", "exec  'sh'"),
                       "etc/rc: unexpected line \"    exec  'sh'\""),
    "rc-line-injected": (lambda r: _replace(r / "etc/rc", "\nmkdir", "\ntouch /tmp/p\nmkdir"),
                         "etc/rc: unexpected line 'touch /tmp/p'"),
    "dist-file-byte": (lambda r: _append(r / K3TEST_INIT, "x"),
                       f"python k3test-1.0: /{K3TEST_INIT} differs from its RECORD"),
    "patched-file": (lambda r: _replace(r / "usr/lib/python3/dist-packages/k3test/mod.py",
                                        "idx_mapping.long()", "idx_mapping"),
                     "patch int64"),
    "provenance-digest-byte": (lambda r: _replace(r / "etc/k3env/provenance.json",
                                                  '"digest": "sha256:', '"digest": "sha256:0'),
                               "provenance: /etc/k3env/provenance.json sha256"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_check_rejects_tampering_naming_what_changed(
    enroot_import: Path, project: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    tamper, needle = TAMPERING[case]
    tamper(enroot_import)
    sqsh = _squash(enroot_import, project / "tampered.sqsh")
    assert main(["export", "--lock", LOCK, "--check", str(sqsh)]) == 4
    out = capsys.readouterr()
    assert needle in out.out, out.out
    assert "failed or did not run" in out.err


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p.write_bytes(b""), "not a squashfs image (0 bytes"),
        (lambda p: p.write_bytes(os.urandom(4096)), "not a squashfs image (4096 bytes"),
        (lambda p: p.mkdir(), "is a directory, not a squashfs image"),
    ],
    ids=["empty", "random-bytes", "directory"],
)
def test_a_bad_file_is_exit_2_saying_what_it_is(
    project: Path, capsys: pytest.CaptureFixture[str], make: Any, needle: str
) -> None:
    target = project / "bad.sqsh"
    make(target)
    assert main(["export", "--lock", LOCK, "--check", str(target)]) == 2
    assert needle in capsys.readouterr().err


def test_malformed_provenance_and_an_unrelated_image_are_exit_2(
    enroot_import: Path, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (enroot_import / "etc/k3env/provenance.json").write_text("{not json")
    sqsh = _squash(enroot_import, project / "malformed.sqsh")
    assert main(["export", "--lock", LOCK, "--check", str(sqsh)]) == 2
    assert "is not valid provenance" in capsys.readouterr().err
    (enroot_import / "etc/k3env/provenance.json").unlink()
    sqsh = _squash(enroot_import, project / "unrelated.sqsh")
    assert main(["export", "--lock", LOCK, "--check", str(sqsh)]) == 2
    assert "it was not built by k3env" in capsys.readouterr().err


def test_unknown_image_is_a_clear_error(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--lock", LOCK, "nope"]) == 2
    assert "unknown image(s) ['nope']" in capsys.readouterr().err


def test_disk_full_leaves_no_partial_sqsh(
    project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    full = project / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        assert main(["export", "--lock", LOCK, "--out", str(full)]) == 3
        assert "mksquashfs" in capsys.readouterr().err
        assert os.listdir(full) == []
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_engine_export_removes_its_container(engine: DockerEngine, project: Path) -> None:
    before = _export_containers()
    stream = engine.export("k3env/debian-python:" + _stage1_tag(engine))
    next(stream)
    assert len(_export_containers() - before) == 1  # the export's own, while it streams
    stream.close()
    assert _export_containers() == before


def _export_containers() -> set[str]:
    """The engine's export containers (the other lane starts and removes its own meanwhile)."""
    listing = subprocess.run(
        ["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {line.split()[0] for line in listing.stdout.splitlines() if "k3env-export" in line}


def _stage1_tag(engine: DockerEngine) -> str:
    listing = subprocess.run(
        ["docker", "images", "--format", "{{.Tag}}", "k3env/debian-python"],
        capture_output=True,
        text=True,
    )
    return listing.stdout.split()[0]


# The enroot releases scripts/host-setup.sh builds into /opt/k3env-cluster: the one the cluster
# profiles pin, and main at 8ea147d (enroot 4.2's /etc/rc provenance line; still "4.1.2").
ENROOTS = {
    "4.1.2": ("enroot", "bd51f53b6fa954805ae3e1985c5dc7594ff66d05"),
    "main-8ea147d": ("enroot-main", "8ea147d337da60cb1c557140f3a85cdf0d620968"),
}


def _enroot_import(release: str, work: Path, uri: str) -> Path:
    """`enroot import -o FILE URI` with that release, its paths under ``work``."""
    bin_dir = Path("/opt/k3env-cluster") / ENROOTS[release][0] / "bin"
    if not (bin_dir / "enroot").is_file():
        _require(f"enroot {release} in {bin_dir} (scripts/host-setup.sh builds it)")
    paths = {f"ENROOT_{k}_PATH": str(work / k.lower())
             for k in ("RUNTIME", "DATA", "CACHE", "TEMP", "CONFIG")}  # fmt: skip
    for path in paths.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    # Uncompressed (enroot's default is lzo): the check reads files, and it is ~2x faster here.
    squash = {"ENROOT_SQUASH_OPTIONS": "-noI -noD -noF -noX"}
    env = {**os.environ, **paths, **squash, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = work / "imported.sqsh"
    done = subprocess.run([str(bin_dir / "enroot"), "import", "-o", str(out), uri], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _profile(project: Path, release: str) -> str:
    """b200-dgxc's profile with [runtime.enroot] at ``release``'s commit."""
    text = (Path(__file__).parents[2] / "clusters/b200-dgxc.toml").read_text()
    path = project / f"cluster-{release}.toml"
    path.write_text(text.replace(ENROOTS["4.1.2"][1], ENROOTS[release][1]))
    return str(path)


@pytest.mark.parametrize("release", ENROOTS)
def test_each_enroot_imports_the_image_and_export_check_reads_what_it_wrote(
    release: str, project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    """The pushed image imported from the engine by enroot 4.1.2 and by enroot main: each
    passes `export --check --cluster` with its own release's profile (main's first line names
    the image by its reference) and fails with the other's. Tampering, refused for both: main's
    import with its first line naming another image's digest fails with either profile and
    without one (to a 4.1.2 profile any such line is tampering)."""
    pushed = run_json(capsys, "push")["images"][0]
    local = pushed["reference"].split("/", 1)[1]  # k3env-test/probe:TAG, as the engine names it
    sqsh = _enroot_import(release, project / "enroot", f"dockerd://{local}")
    rc = subprocess.run(["unsquashfs", "-cat", str(sqsh), "etc/rc"], capture_output=True,
                        text=True, check=True).stdout  # fmt: skip
    check = run_json(
        capsys, "export", "--check", str(sqsh), "--cluster", _profile(project, release)
    )
    gate = {g["gate"]: g for g in check["checks"]}["etc/rc enroot-provenance"]
    other = "4.1.2" if release != "4.1.2" else "main-8ea147d"
    argv = ["export", "--lock", LOCK, "--check", str(sqsh), "--cluster"]
    assert main([*argv, _profile(project, other)]) == 4
    err = capsys.readouterr().err
    if release == "4.1.2":
        assert not rc.startswith("# enroot-provenance")
        assert gate["detail"].startswith("no provenance line: /etc/rc as enroot 4.1.2 (")
        assert "etc/rc enroot-provenance failed: no provenance line: removed" in err
        return
    assert rc.startswith(f"# enroot-provenance: dockerd://{local}\n")
    assert gate["detail"].endswith(f"names this image by its reference {local}")
    assert "etc/rc enroot-provenance failed: a provenance line: tampering" in err
    root = _unsquash(str(sqsh), project / "root")
    body = rc.split("\n", 1)[1]
    (root / "etc/rc").write_text(f"# enroot-provenance: dockerd://sha256:{'0' * 64}\n{body}")
    tampered = str(_squash(root, project / "tampered.sqsh"))
    for profile, said in (
        ([], "first line names another image"),
        (["--cluster", _profile(project, release)], "first line names another image"),
        (["--cluster", _profile(project, "4.1.2")], "a provenance line: tampering"),
    ):
        assert main(["export", "--lock", LOCK, "--check", tampered, *profile]) == 4
        err = capsys.readouterr().err
        assert f"etc/rc enroot-provenance failed: {said}" in err, err
