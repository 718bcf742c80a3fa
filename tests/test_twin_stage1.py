"""The twin's two stages at once, and the emulated second stage's trimmed package index.

The index trim is checked against debootstrap's own Perl (its ``pkgdetails``, sourced from
the host's debootstrap): every question the second stage asks gets the same answer from the
trimmed file. The overlap runs the real ``twinlayer`` against the fake engine (the install
script's two halves played by a handler); the real path, the arm64 twin built with the same
image ID as before, is the Grace benchmark's and ``test_emulation_engine``'s.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from k3env.engine.protocol import BaseImage, RunResult
from k3env.image.blobs import keep_layer, kept_layer
from k3env.image.install import Native
from k3env.image.layer import tree_layer
from k3env.image.twindebian import trim_index
from k3env.image.twinlayer import Inputs, second_layer
from k3env.log import Log
from k3env.state import State

from .fake_engine import FakeEngine, make_image

FUNCTIONS = Path("/usr/share/debootstrap/functions")


def _stanza(name: str, depends: str = "", pre: str = "", extra: str = "") -> str:
    lines = [f"Package: {name}", "Version: 1.0", "Architecture: arm64"]
    if pre:
        lines.append(f"Pre-Depends: {pre}")
    if depends:
        lines.append(f"Depends: {depends}")
    lines += [f"Filename: pool/main/{name}_1.0_arm64.deb", "Size: 10",
              f"SHA256: {hashlib.sha256(name.encode()).hexdigest()}"]  # fmt: skip
    return "\n".join(lines) + extra + "\n\n"


INDEX = (
    _stanza("zlib-unrelated", depends="libfar")
    + _stanza("python3", depends="python3.11 (>= 3.11.2), libpython3-stdlib (= 3.11.2-1)")
    + _stanza("libfar")
    + _stanza("python3.11", pre="libc6 (>= 2.36)", depends="mime-support | media-types, tzdata")
    + _stanza("libc6", depends="libgcc-s1")
    + _stanza("mime-support", depends="mailcap")
    + _stanza("mailcap", depends="perl:any")
    + _stanza("perl", extra="\nTag: role::program,\n interface::commandline")
    + _stanza("media-types")
    + _stanza("libpython3-stdlib")
    + _stanza("libgcc-s1")
    + _stanza("tzdata")
)
FETCHED = ["python3", "python3.11", "libc6", "media-types", "libpython3-stdlib", "libgcc-s1",
           "tzdata"]  # fmt: skip


def _names(text: bytes) -> list[str]:
    return [line[9:].decode() for line in text.split(b"\n") if line.startswith(b"Package: ")]


def test_the_trimmed_index_keeps_what_the_fetched_packages_name_in_order_and_bytes() -> None:
    trimmed = trim_index(INDEX.encode(), FETCHED)
    # Every alternative's closure stays (mime-support -> mailcap -> perl, arch qualifier
    # dropped); what nothing fetched names goes, with what only it names.
    assert _names(trimmed) == ["python3", "python3.11", "libc6", "mime-support", "mailcap",
                               "perl", "media-types", "libpython3-stdlib", "libgcc-s1",
                               "tzdata"]  # fmt: skip
    stanzas = [s for s in INDEX.encode().split(b"\n\n") if s]
    kept = [s + b"\n\n" for s in stanzas if _names(s)[0] in _names(trimmed)]
    assert trimmed == b"".join(kept)
    assert trimmed.endswith(b"\n\n") and b"interface::commandline" in trimmed


def test_a_last_stanza_without_its_blank_line_is_kept_as_the_file_has_it() -> None:
    text = (INDEX + _stanza("hostname")).encode()[:-1]
    trimmed = trim_index(text, ["hostname"])
    assert trimmed == _stanza("hostname").encode()[:-1]
    assert trim_index(b"", ["hostname"]) == b""


@pytest.mark.skipif(not FUNCTIONS.is_file(), reason="debootstrap is not installed on this host")
def test_debootstraps_own_perl_answers_the_same_from_the_trimmed_index(tmp_path: Path) -> None:
    full, trimmed = tmp_path / "full_Packages", tmp_path / "trimmed_Packages"
    full.write_text(INDEX)
    trimmed.write_bytes(trim_index(INDEX.encode(), FETCHED))
    ask = tmp_path / "ask.sh"
    # What the second stage asks (resolve_deps, setup_available): a name's dependencies,
    # whether names are real packages (with their details), and their stanzas.
    ask.write_text(
        "set -e\nDEBOOTSTRAP_DIR=/usr/share/debootstrap\n. $DEBOOTSTRAP_DIR/functions\n"
        'F=$1; shift\necho GETDEPS; $PKGDETAILS GETDEPS "$F" "$@"\n'
        'DEPS=$($PKGDETAILS GETDEPS "$F" "$@")\n'
        'echo PKGS; DEBOOTSTRAP_CHECKSUM_FIELD=SHA256 $PKGDETAILS PKGS REAL "$F" "$@" $DEPS\n'
        'echo STANZAS; $PKGDETAILS STANZAS "$F" "$@" $DEPS\n'
    )

    def answer(index: Path, names: list[str]) -> str:
        argv = ["sh", str(ask), str(index), *names]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    answers = [
        answer(index, names)
        for names in (FETCHED, ["python3.11"], ["mime-support", "media-types"])
        for index in (full, trimmed)
    ]
    assert answers[0] == answers[1] and answers[2] == answers[3] and answers[4] == answers[5]
    assert "mailcap" in answers[0] and "Package: tzdata" in answers[0]


# --- the second layer beside stage 1 ------------------------------------------------------
PY = "/usr/local/lib/python3.11/dist-packages"


class _Installer:
    """The install script's halves, as the fake engine's handler: ``install`` writes one
    module into OUT; ``dirs`` writes the modes this image holds of OUT's directories."""

    def __init__(self, modes: dict[str, int], started: threading.Event) -> None:
        self.modes, self.started = modes, started
        self.ran: list[tuple[str, str]] = []

    def __call__(self, image: str, argv: list[str], env: dict[str, str],
                 mounts: dict[str, str]) -> RunResult | None:  # fmt: skip
        if len(argv) < 4 or argv[1] != "-c":
            return None
        cfg = json.loads(argv[3])
        host = {inside: outside for outside, inside in mounts.items()}
        for stage in cfg["stages"]:
            self.ran.append((image, stage))
            if stage == "install":
                self.started.set()
                target = Path(host["/k3env/out"] + PY)
                target.mkdir(parents=True)
                (target / "k3mod.py").write_text("X = 1\n")
            else:
                dirs = {d: [self.modes.get(image, 0o755), 0, 0] for d in ("/usr", "/usr/local")}
                Path(host["/k3env/meta"], "meta.json").write_text(json.dumps({"dirs": dirs}))
        return RunResult(exit_code=0, stdout="", stderr="")


def _wheelhouse(state: State, tmp: Path) -> Path:
    """A wheel the wheelhouse already holds, and the requirements line that pins it."""
    house = state.path("wheels")
    house.mkdir(parents=True)
    wheel = house / "k3mod-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("k3mod.py", "X = 1\n")
    req = tmp / "twin.requirements.txt"
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    req.write_text(f"k3mod==1.0 --hash=sha256:{sha}\n")
    return req


def _run(tmp_path: Path, modes: dict[str, int], *, native: bool) -> tuple[str, Any, str]:
    engine, state = FakeEngine(), State(tmp_path / "state")
    base = engine.add(make_image({"/usr/bin/python3": b"arm64"}), "k3env/debian-python:arm")
    helper = engine.add(make_image({"/usr/bin/python3": b"amd64"}), "k3env/debian-python:amd")
    started = threading.Event()
    installer = _Installer({base.id: modes["base"], helper.id: modes["native"]}, started)
    engine.on_run(installer)
    inputs = Inputs(requirements=_wheelhouse(state, tmp_path), platform="linux/arm64",
                    epoch=1_764_460_800, where="twin", keep_level=1)  # fmt: skip

    def stage1() -> BaseImage:
        # Stage 1 is built while the worker installs: with a native image, the install has
        # begun before stage 1 is done.
        if native:
            assert started.wait(10), "the wheels were not installed beside stage 1"
        return base

    work = tmp_path / "work"
    work.mkdir()
    made = second_layer(
        engine, state, Log(quiet=True), work, inputs, stage1=stage1,
        native=lambda: Native(image=helper.id, platform_tags=("manylinux_2_17_aarch64",))
        if native else None,
    )  # fmt: skip
    assert made.stage1 == base
    # The layer's bytes are those written from stage 1's own directory modes.
    again = tmp_path / "again.tar"
    dirs = {d: [modes["base"], 0, 0] for d in ("/usr", "/usr/local")}
    assert made.diff_id == tree_layer(work / "out", again, mtime=inputs.epoch, owners=False,
                                      dirs=dirs)  # fmt: skip
    # Written straight as its registry form, which the engine loads as it is.
    kept = kept_layer(state, made.diff_id, 1)
    assert kept is not None and kept.path == made.path
    assert gzip.decompress(made.path.read_bytes()) == again.read_bytes()
    other = keep_layer(State(tmp_path / "other"), again, made.diff_id, 1)
    assert (other.digest, other.size) == (kept.digest, kept.size)  # as keeping the tar itself
    ran = [(("base" if image == base.id else "native"), stage) for image, stage in installer.ran]
    return made.diff_id, ran, base.id


def test_the_wheels_are_installed_natively_beside_stage_1_and_its_modes_checked(
    tmp_path: Path,
) -> None:
    _, ran, _ = _run(tmp_path, {"base": 0o755, "native": 0o755}, native=True)
    assert ran == [("native", "install"), ("native", "dirs"), ("base", "dirs")]


def test_modes_that_differ_from_the_native_images_write_the_layer_again(tmp_path: Path) -> None:
    _, ran, _ = _run(tmp_path, {"base": 0o2775, "native": 0o755}, native=True)
    assert ran == [("native", "install"), ("native", "dirs"), ("base", "dirs")]


def test_without_a_native_image_the_wheels_go_into_stage_1_once_it_exists(
    tmp_path: Path,
) -> None:
    _, ran, _ = _run(tmp_path, {"base": 0o755, "native": 0o700}, native=False)
    assert ran == [("base", "install"), ("base", "dirs")]


def test_a_failing_stage_1_is_the_error_raised(tmp_path: Path) -> None:
    engine, state = FakeEngine(), State(tmp_path / "state")
    inputs = Inputs(requirements=_wheelhouse(state, tmp_path), platform="linux/arm64",
                    epoch=0, where="twin", keep_level=None)  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()

    def stage1() -> BaseImage:
        raise RuntimeError("debootstrap failed")

    with pytest.raises(RuntimeError, match="debootstrap failed"):
        second_layer(engine, state, Log(quiet=True), work, inputs, stage1=stage1,
                     native=lambda: None)  # fmt: skip


def test_a_layer_kept_at_two_levels_is_two_blobs_and_the_stored_one_is_the_tar(
    tmp_path: Path,
) -> None:
    from k3env.image.blobs import LEVEL
    from k3env.image.twin import TWIN_LEVEL

    state = State(tmp_path / "state")
    raw = b"twin layer\n" * 100_000
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    stored = keep_layer(state, raw, diff_id, level=TWIN_LEVEL)
    assert kept_layer(state, diff_id) is None  # level 6 was never kept: not this blob
    packed = keep_layer(state, raw, diff_id, level=LEVEL)
    assert stored.digest != packed.digest and stored.path != packed.path
    assert packed.size < len(raw) < stored.size < len(raw) + 1024
    assert kept_layer(state, diff_id, TWIN_LEVEL) == stored and kept_layer(state, diff_id) == packed
    assert (
        gzip.decompress(stored.path.read_bytes())
        == raw
        == gzip.decompress(packed.path.read_bytes())
    )


def test_the_archive_in_parts_is_one_tar_holding_the_layer_file_as_it_is(
    tmp_path: Path,
) -> None:
    import io
    import tarfile

    from k3env.image.blobs import LAYER_MEDIA_TYPE, Descriptor
    from k3env.image.layer import load_archive

    raw = b"x" * 1000
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    (tmp_path / "layer.tar").write_bytes(raw)
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    own = Descriptor(digest=diff_id, size=len(raw), media_type=LAYER_MEDIA_TYPE)
    names, manifest, parts = load_archive(config, [diff_id], own, tmp_path / "layer.tar", [])
    assert parts[1] == tmp_path / "layer.tar"  # sent as it is, never copied
    joined = b"".join(p.read_bytes() if isinstance(p, Path) else p for p in parts)
    assert manifest is not None and names.manifest == manifest.digest
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        assert [m.name for m in tar] == [
            f"blobs/sha256/{names.config[7:]}", f"blobs/sha256/{manifest.digest[7:]}",
            "index.json", "manifest.json", "oci-layout", f"blobs/sha256/{diff_id[7:]}",
        ]  # fmt: skip
        member = tar.extractfile(f"blobs/sha256/{diff_id[7:]}")
        assert member is not None and member.read() == raw
