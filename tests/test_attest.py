"""An export's SBOM and signed provenance (k3env.handoff.attest): written beside the .sqsh,
made again from the file to compare, signatures checked with the given key and by openssl
(a verifier k3env did not write); each tamper refused in words."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3env.checks.probe_plan import planned_checks
from k3env.checks.probe_run import MARK
from k3env.cli import main
from k3env.commands.verify import _attested
from k3env.engine import registry
from k3env.engine.protocol import RunResult
from k3env.errors import ConfigError
from k3env.handoff import referrers
from k3env.handoff.attest import (
    SBOM_SUFFIX,
    SIG_SUFFIX,
    STATEMENT_SUFFIX,
    attest,
    beside,
    check,
    hashed,
)
from k3env.handoff.enroot_export import export_image
from k3env.handoff.sbom import debian_packages, python_packages
from k3env.handoff.sbomdiff import diff
from k3env.handoff.squashfs import Squashfs
from k3env.hashing import file_sha256
from k3env.image.build import make_builder
from k3env.image.records import Exported, read, write
from k3env.log import Log
from k3env.signing import SigningKey, VerifyKey, envelope, load_signing_key, load_verify_key

from .fake_engine import FakeEngine
from .project import MODULE_FILE, Project
from .test_yaml_budgets import measured

QUIET = Log(quiet=True)
pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("mksquashfs", "unsquashfs", "faketime", "openssl")),
    reason="squashfs-tools, faketime and openssl",
)


def keypair(directory: Path, name: str) -> tuple[SigningKey, VerifyKey, Path]:
    """A key pair made by openssl, as docs/sbom.md tells a user to make one."""
    key, pub = directory / f"{name}.key", directory / f"{name}.pub"
    subprocess.run(
        f"openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt "
        f"-out {key} && openssl ec -in {key} -pubout -out {pub}",
        shell=True,
        check=True,
        capture_output=True,
    )
    return load_signing_key(key), load_verify_key(pub), pub


@pytest.fixture
def exported(fake_engine: FakeEngine, fake_project: Project, tmp_path: Path) -> Iterator[Path]:
    lock = fake_project.lock()
    build = make_builder(lock, fake_engine, fake_project.state, QUIET, False).build(
        fake_project.spec(lock)
    )
    yield Path(export_image(fake_engine, fake_project.state, build, tmp_path / "out", QUIET).path)


def gates(sqsh: Path, key: VerifyKey | None) -> list[tuple[str, str, str]]:
    with tempfile.TemporaryDirectory() as work:
        said = check(sqsh, fs(sqsh, work), key, hashed(sqsh))
    return [(g.name, g.status, g.detail) for g in said]


def fs(sqsh: Path, work: str) -> Squashfs:
    return Squashfs(sqsh, QUIET, Path(work))


def signed(sqsh: Path, key: SigningKey) -> bytes:
    with tempfile.TemporaryDirectory() as work:
        attest(sqsh, file_sha256(sqsh), fs(sqsh, work), key)
    return beside(sqsh, SBOM_SUFFIX).read_bytes()


def test_a_signed_export_verifies_and_its_sbom_lists_what_the_image_holds(
    exported: Path, tmp_path: Path
) -> None:
    key, pub, pub_path = keypair(tmp_path, "k3env")
    first = signed(exported, key)
    assert signed(exported, key) == first  # the same file, the same SBOM bytes
    doc = json.loads(first)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    names = {c["name"] for c in doc["components"]}
    assert names == {"lock:base.testbase", "lock:patch.int64"}  # the fake image has no dists
    assert doc["metadata"]["component"]["name"] == "probe"
    assert gates(exported, pub) == [
        ("sbom", "passed", f"made again from the file, byte-identical ({len(names)} components)"),
        ("sbom signature", "passed", "signed by the given key"),
        ("provenance", "passed",
         "signed by the given key; its subject is this file, its SBOM this one"),
    ]  # fmt: skip
    # openssl, which k3env did not write, verifies the same signature.
    raw = tmp_path / "sig.der"
    raw.write_bytes(base64.b64decode(beside(exported, SIG_SUFFIX).read_text()))
    said = subprocess.run(
        ["openssl", "dgst", "-sha256", "-verify", str(pub_path), "-signature", str(raw),
         str(beside(exported, SBOM_SUFFIX))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert said.returncode == 0 and "Verified OK" in said.stdout
    envelope = json.loads(beside(exported, STATEMENT_SUFFIX).read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"][0]["name"] == exported.name


def test_without_a_key_signatures_are_not_checked_and_missing_files_are_said(
    exported: Path, tmp_path: Path
) -> None:
    assert gates(exported, None) == [
        ("sbom", "not checked", f"no SBOM beside the file ({exported.name}{SBOM_SUFFIX})")
    ]
    key, pub, _ = keypair(tmp_path, "k3env")
    assert gates(exported, pub)[0][1] == "failed"  # a key says they must be there
    signed(exported, key)
    assert [(n, s) for n, s, _ in gates(exported, None)] == [
        ("sbom", "passed"), ("sbom signature", "not checked"), ("provenance", "not checked"),
    ]  # fmt: skip


def test_each_tamper_is_refused_in_words(exported: Path, tmp_path: Path) -> None:
    key, pub, _ = keypair(tmp_path, "k3env")
    _, other, _ = keypair(tmp_path, "other")
    document = signed(exported, key)
    by = {n: (s, d) for n, s, d in gates(exported, other)}
    assert by["sbom signature"] == ("failed", "not the given key's signature")
    assert by["provenance"] == (
        "failed",
        "refused: no signature in the envelope is the given key's",
    )
    # An SBOM edited after signing: no longer the file's, nor the signed one.
    beside(exported, SBOM_SUFFIX).write_bytes(document.replace(b'"probe"', b'"other"', 1))
    by = {n: (s, d) for n, s, d in gates(exported, pub)}
    assert by["sbom"][0] == "failed" and "the file or its SBOM changed" in by["sbom"][1]
    assert by["sbom signature"][0] == "failed"
    assert by["provenance"] == ("failed", "it names another SBOM (sha256 differs)")
    # The signature removed.
    beside(exported, SBOM_SUFFIX).write_bytes(document)
    beside(exported, SIG_SUFFIX).unlink()
    by = {n: (s, d) for n, s, d in gates(exported, pub)}
    assert by["sbom signature"] == ("failed", f"no signature ({exported.name}{SIG_SUFFIX})")
    # A statement of another file (its subject's sha256).
    signed(exported, key)
    envelope = json.loads(beside(exported, STATEMENT_SUFFIX).read_text())
    with exported.open("ab") as f:
        f.write(b"\0")
    by = {n: (s, d) for n, s, d in gates(exported, pub)}
    assert by["provenance"] == ("failed", "its subject is another file (sha256 differs)")
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    # Not an envelope at all.
    beside(exported, STATEMENT_SUFFIX).write_text("{}")
    by = {n: (s, d) for n, s, d in gates(exported, pub)}
    assert by["provenance"][0] == "failed" and "not a DSSE envelope" in by["provenance"][1]


def test_keys_k3env_cannot_use_are_refused_naming_the_file(tmp_path: Path) -> None:
    rsa = tmp_path / "rsa.key"
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024",
                    "-out", str(rsa)], check=True, capture_output=True)  # fmt: skip
    with pytest.raises(ConfigError, match="not an ECDSA P-256 private key"):
        load_signing_key(rsa)
    (tmp_path / "junk.pub").write_text("-----BEGIN PUBLIC KEY-----\nnope\n")
    with pytest.raises(ConfigError, match="not a PEM public key"):
        load_verify_key(tmp_path / "junk.pub")
    _, pub, pub_path = keypair(tmp_path, "k3env")
    with pytest.raises(ConfigError, match="not a PEM private key"):
        load_signing_key(pub_path)
    assert not pub.verify(b"x", "not base64!")


def test_the_command_refuses_a_key_without_a_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "--key", str(tmp_path / "k.pub")]) == 2
    assert "--key goes with --check FILE.sqsh" in capsys.readouterr().err
    assert main(["export", "--check", "x.sqsh", "--sign-key", str(tmp_path / "k.key")]) == 2
    assert "--check takes --key PUB.pem" in capsys.readouterr().err


def test_the_sbom_reads_dists_and_debian_packages_from_the_file_as_untrusted_text(
    tmp_path: Path,
) -> None:
    site = tmp_path / "tree/usr/lib/python3/dist-packages"
    for name, meta in (
        ("vllm-0.31.0", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n\nName: not-me\n"),
        ("Ai_Dynamo-1.6.1", "Name: ai_dynamo\nVersion: 1.6.1\n"),
        ("evil-1", "Name: evil\\nInjected: 1\nVersion: 1; rm -rf /\n"),
    ):
        info = site / f"{name}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(meta)
        (info / "RECORD").write_text("")
    status = tmp_path / "tree/var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text(
        "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n"
        "Package: bash\nStatus: install ok installed\nVersion: 5.2-15\n"
    )
    subprocess.run(["mksquashfs", str(tmp_path / "tree"), str(tmp_path / "t.sqsh"), "-quiet",
                    "-no-progress", "-noappend"], check=True, capture_output=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        image = fs(tmp_path / "t.sqsh", work)
        wheels = {("ai-dynamo", "1.6.1"): "ab" * 32}
        got = [(p.name, p.version, p.sha256) for p in python_packages(image, wheels)]
        debs = [(p.name, p.version, p.arch) for p in debian_packages(image)]
    assert got == [
        ("ai_dynamo", "1.6.1", "ab" * 32),  # the pinned wheel's sha256, by canonical name
        ("unreadable:usr/lib/python3/dist-packages/evil-1.dist-info", "", ""),
        ("vllm", "0.31.0", ""),
    ]
    assert debs == [("libc6", "2.36-9", "amd64"), ("bash", "5.2-15", "")]


def test_the_fallback_referrers_index_keeps_others_entries_once_and_drops_malformed_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The registry boundary isolated (the real registry path: tests/engine/
    test_handoff_engine.py): what the sha256-<hex> tag held is kept when well formed, ours
    added once, nothing else tagged."""
    theirs = {"mediaType": referrers.OCI_MANIFEST, "digest": "sha256:" + "a" * 64, "size": 9}
    ours = {"mediaType": referrers.OCI_MANIFEST, "digest": "sha256:" + "b" * 64, "size": 5,
            "artifactType": "application/vnd.cyclonedx+json"}  # fmt: skip
    held = {"manifests": [theirs, {"digest": "../x"}, "junk", dict(ours, size=1)]}
    put: list[tuple[str, str, bytes, str]] = []
    monkeypatch.setattr(registry, "tagged_index", lambda repo, tag: json.dumps(held).encode())

    def put_manifest(repo: str, ref: str, body: bytes, media_type: str) -> str:
        put.append((repo, ref, body, media_type))
        return ""

    monkeypatch.setattr(registry, "put_manifest", put_manifest)
    referrers._fallback("reg/app", "sha256:" + "c" * 64, [ours], QUIET)
    ((repo, tag, body, media_type),) = put
    assert (repo, tag, media_type) == ("reg/app", "sha256-" + "c" * 64, referrers.OCI_INDEX)
    assert json.loads(body)["manifests"] == [theirs, ours]


def test_two_images_packages_compared() -> None:
    old = {"pypi:vllm": "0.31.0", "deb:libc6": "2.36-9"}
    d = diff(old, {"pypi:vllm": "0.32.0", "deb:zstd": "1.5"})
    assert (d.added, d.removed, d.changed) == (
        (("deb:zstd", "1.5"),),
        (("deb:libc6", "2.36-9"),),
        (("pypi:vllm", "0.31.0", "0.32.0"),),
    )
    assert diff(old, old).empty and not d.empty


def test_verify_says_what_the_host_holds_of_an_images_sbom(
    exported: Path, fake_project: Project, tmp_path: Path
) -> None:
    """verify's gates per image, from its last export's record (never the .sqsh's bytes):
    both signatures with the given key, the statement naming the SBOM and the recorded
    sha256; each wrong input failed in words."""
    state = fake_project.state
    assert _attested(state, "sha256:" + "1" * 64, None).said == (
        "none: not exported (k3env export --sign-key KEY.pem)"
    )
    (image_id,) = [f"sha256:{f.stem}" for f in (state.root / "exports").glob("*.json")]
    record = read(state, Exported, image_id)
    assert record is not None and record.path == str(exported)
    key, pub, _ = keypair(tmp_path, "k3env")
    _, other, _ = keypair(tmp_path, "other")

    def said(verify_key: VerifyKey | None) -> list[tuple[str, str, str]]:
        got = _attested(state, image_id, verify_key)
        return [(g.name, g.status, g.detail) for g in got.gates]

    no_sbom = f"no SBOM beside the file ({exported.name}{SBOM_SUFFIX})"
    assert said(None) == [("sbom", "not checked", no_sbom)]
    assert said(pub) == [("sbom", "failed", no_sbom)]  # a key says they must be there
    with tempfile.TemporaryDirectory() as work:
        attest(exported, record.sha256, fs(exported, work), key)
    there = (
        f"{exported.name}{SBOM_SUFFIX} is there ({beside(exported, SBOM_SUFFIX).stat().st_size}"
        f" bytes); not made again from the image here: k3env export --check {exported} --key "
        "PUB.pem"
    )
    assert said(pub) == [
        ("sbom", "not checked", there),
        ("sbom signature", "passed", "signed by the given key"),
        ("provenance", "passed", "signed by the given key; its subject is the export's recorded "
         "sha256 (the file's own bytes: k3env export --check), its SBOM this one"),
    ]  # fmt: skip
    got = _attested(state, image_id, None)
    assert [(g.name, g.status) for g in got.gates] == [
        ("sbom", "not checked"), ("sbom signature", "not checked"), ("provenance", "not checked"),
    ]  # fmt: skip
    assert len(got.files) == 3 and "sbom signature not checked (no --key given)" in got.said
    assert got.said.endswith(f"k3env export --check {exported} --key PUB.pem")
    assert said(other)[1:] == [
        ("sbom signature", "failed", "not the given key's signature"),
        ("provenance", "failed", "refused: no signature in the envelope is the given key's"),
    ]
    # The SBOM edited after signing.
    document = beside(exported, SBOM_SUFFIX).read_bytes()
    beside(exported, SBOM_SUFFIX).write_bytes(document.replace(b'"probe"', b'"other"', 1))
    assert said(pub)[1:] == [
        ("sbom signature", "failed", "not the given key's signature"),
        ("provenance", "failed", "it names another SBOM (sha256 differs)"),
    ]
    beside(exported, SBOM_SUFFIX).write_bytes(document)
    # The signature gone.
    sig = beside(exported, SIG_SUFFIX).read_bytes()
    beside(exported, SIG_SUFFIX).unlink()
    assert said(pub)[1] == (
        "sbom signature",
        "failed",
        f"no signature ({exported.name}{SIG_SUFFIX})",
    )
    beside(exported, SIG_SUFFIX).write_bytes(sig)
    # The export recorded again as another file: the statement's subject is not it.
    write(state, dataclasses.replace(record, sha256="f" * 64), image_id)
    assert said(pub)[2] == (
        "provenance",
        "failed",
        "its subject is not the export's recorded sha256 (another file)",
    )


def test_check_with_a_key_lists_the_image_once_and_reads_the_file_once(
    exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`export --check F --key PUB` of a multi-GB file: one unsquashfs listing shared by the
    image's checks and the SBOM's, and the file's bytes hashed once (for the statement's
    subject); the gates as each check says them."""
    key, _, pub_path = keypair(tmp_path, "k3env")
    signed(exported, key)
    commands: list[list[str]] = []
    monkeypatch.setattr(Log, "command", lambda self, argv: commands.append(list(argv)))
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> int:
        if Path(path) == exported:
            opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    argv = ["export", "--lock", "pins/test.lock.toml", "--check", str(exported)]
    assert main([*argv, "--key", str(pub_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("-lln" in c for c in commands) == 1
    assert len(opened) == 1
    assert lines[-3:] == [
        "passed      sbom: made again from the file, byte-identical (2 components)",
        "passed      sbom signature: signed by the given key",
        "passed      provenance: signed by the given key; its subject is this file, its SBOM "
        "this one",
    ]
    assert lines[0].startswith("passed      provenance: /etc/k3env/provenance.json has")
    # Without a key: the statement's subject is still compared, so the file is hashed once.
    commands.clear()
    opened.clear()
    assert main(argv) == 0
    assert sum("-lln" in c for c in commands) == 1 and len(opened) == 1
    # Another key: exit 4, each refusal named.
    _, _, other = keypair(tmp_path, "other")
    assert main([*argv, "--key", str(other)]) == 4
    err = capsys.readouterr().err
    assert "sbom signature failed: not the given key's signature" in err
    assert "provenance failed: refused: no signature in the envelope is the given key's" in err


def test_verify_key_fails_the_command_on_a_wrong_key_and_reports_gates_per_image(
    exported: Path, fake_engine: FakeEngine, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`k3env verify --key PUB.pem` over the in-memory engine (its probe answering every check
    passed): the right key passes, another key exits 4 naming the image and each refusal,
    the JSON carries the gates under "sbom"."""

    def probe(image: str, argv: list[str], env: dict[str, str], mounts: dict[str, str]) -> Any:
        (host,) = mounts
        plans = json.loads((Path(host) / "plan.json").read_text())["plans"]
        facts = {"distributions": [{"name": "k3test", "version": "1", "requires": []}]}
        answers = [{"results": [
            {"check": c, "profile": p, "subject": s, "status": "pass", "component": "x",
             "output": "seen"} for c, p, s in planned_checks(plan)],
            "facts": facts, "patch_targets": {
            p["name"]: {"path": MODULE_FILE, "text": fake_engine.text(image, MODULE_FILE)}
            for p in plan["patches"] if not p.get("skip")}} for plan in plans]  # fmt: skip
        payload = MARK + json.dumps({"plans": answers}) + "\n"
        return RunResult(exit_code=0, stdout=payload, stderr="")

    fake_engine.on_run(probe)
    key, _, pub = keypair(tmp_path, "k3env")
    _, _, other = keypair(tmp_path, "other")
    record = json.loads(next((tmp_path / "state/exports").glob("*.json")).read_text())
    with tempfile.TemporaryDirectory() as work:
        attest(exported, record["sha256"], fs(exported, work), key)
    argv = ["verify", "--lock", "pins/test.lock.toml", "--json"]
    assert main([*argv, "--key", str(pub)], engine=fake_engine) == 0
    (image,) = json.loads(capsys.readouterr().out)["images"]
    assert [(g["gate"], g["status"]) for g in image["sbom"]["gates"]] == [
        ("sbom", "not checked"), ("sbom signature", "passed"), ("provenance", "passed"),
    ]  # fmt: skip
    assert main([*argv, "--key", str(other)], engine=fake_engine) == 4
    out = json.loads(capsys.readouterr().out)
    assert [g["status"] for g in out["images"][0]["sbom"]["gates"]] == [
        "not checked",
        "failed",
        "failed",
    ]
    assert out["error"]["message"] == (
        "the images do not verify: 2 of 12 failed or did not run: probe sbom signature failed: "
        "not the given key's signature; probe provenance failed: refused: no signature in the "
        "envelope is the given key's"
    )
    assert "--sign-key" in out["error"]["fix"] and "probe's own output" not in out["error"]["fix"]
    # Without a key: said, not failed; one line per image in text.
    assert main(["verify", "--lock", "pins/test.lock.toml"], engine=fake_engine) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("probe sbom: ")]
    assert "sbom signature not checked (no --key given)" in line


DEEP = 10_000


def _deep_statement(key: SigningKey) -> bytes:
    """An envelope the key signed whose statement nests 10,000 deep."""
    return envelope(key, b'{"subject": ' + b"[" * DEEP + b"]" * DEEP + b"}")


@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no-key"])
def test_a_10000_deep_statement_is_refused_in_words_with_or_without_a_key(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], with_key: bool
) -> None:
    """`export --check` of a statement nested 10,000 deep, signed by the key (so it is read
    past its signature), or an envelope itself that deep: the provenance gate fails naming
    the budget, exit 4, no RecursionError."""
    key, _, pub_path = keypair(tmp_path, "k3env")
    signed(exported, key)
    argv = ["export", "--lock", "pins/test.lock.toml", "--check", str(exported)]
    argv += ["--key", str(pub_path)] if with_key else []
    for data, says in (
        (_deep_statement(key), "refused: its payload is not an in-toto statement k3env reads "
         "(JSON nested deeper than 32 levels; not read)"),
        (b"[" * DEEP + b"]" * DEEP, "refused: not a DSSE envelope (JSON nested deeper than 4 "
         "levels; not read)"),
        (b'{"payloadType": "application/vnd.in-toto+json", "payload": 7, "signatures": []}',
         "refused: not a DSSE envelope ('payload' is a JSON integer, not a string)"),
    ):  # fmt: skip
        beside(exported, STATEMENT_SUFFIX).write_bytes(data)
        assert main(argv) == 4
        err = capsys.readouterr().err
        assert f"provenance failed: {says}" in err, err
        assert "Traceback" not in err and "RecursionError" not in err
    # A statement whose subject is not where k3env reads it: named, not a KeyError.
    from k3env.signing import envelope

    beside(exported, STATEMENT_SUFFIX).write_bytes(envelope(key, b'{"subject": {"x": 1}}'))
    assert main(argv) == 4
    assert "provenance failed: refused: its statement has no string at subject[0]" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("case", ["deep-statement", "1-GiB-sbom", "1-GiB-statement"])
def test_others_files_beside_an_export_are_read_within_budgets_of_memory(
    exported: Path, tmp_path: Path, case: str
) -> None:
    """`export --check --key` in a process of its own: a 10,000-deep statement, or a 1 GiB
    SBOM or statement (sparse) beside the file: refused in words, exit 4, peak RSS under
    512 MB, no traceback."""

    key, _, pub_path = keypair(tmp_path, "k3env")
    signed(exported, key)
    if case == "deep-statement":
        beside(exported, STATEMENT_SUFFIX).write_bytes(_deep_statement(key))
        says = "JSON nested deeper than 32 levels"
    else:
        suffix = SBOM_SUFFIX if case == "1-GiB-sbom" else STATEMENT_SUFFIX
        with beside(exported, suffix).open("r+b") as f:
            f.truncate(1 << 30)
        says = "not read: it has 1,073,741,824 bytes, more than the"
    done, rss, _ = measured("export", "--lock", "pins/test.lock.toml", "--check", str(exported),
                            "--key", str(pub_path), cwd=Path.cwd(), timeout=300)  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert rss < 512 * 1024, f"peak RSS {rss >> 10} MiB"
