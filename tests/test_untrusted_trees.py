"""Trees others made: an image's squashfs, a checked-out repository, names in a recipe.

Named regressions of issue 24: nothing read outside through a link, device or FIFO, nothing
copied through a repository's links, no key or line injected into a written recipe.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from k3env import untrusted
from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.errors import UntrustedFileError
from k3env.handoff.squashfs import Squashfs
from k3env.handoff.squashfs_check import check_squashfs
from k3env.log import Log
from k3env.srt.materialize import copy_checkout
from k3env.srt.recipe import to_yaml

from .conftest import REPO

QUIET = Log(quiet=True)
SECRET = "TOP-SECRET-HOST-LINE"
SQUASHFS_TOOLS = pytest.mark.skipif(
    shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None,
    reason="squashfs-tools not installed",
)
SITE = "usr/lib/python3/dist-packages"


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A FIFO read would block forever: fail the test instead."""

    def fail(*_: object) -> None:
        raise TimeoutError("hung (a FIFO or device was opened?)")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty tree to read."""
    (tmp_path / "root").mkdir()
    return tmp_path / "root"


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    """A host file outside every tree the tests read."""
    path = tmp_path / "host" / "secret.txt"
    path.parent.mkdir()
    path.write_text(f"{SECRET}\nsecond line\n")
    return path


def can_mknod() -> bool:
    return os.geteuid() == 0


def record_b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


# --- the reader ---------------------------------------------------------------------------------
def test_a_record_linked_to_a_host_file_is_named_and_not_read(root: Path, host_file: Path) -> None:
    (root / "RECORD").symlink_to(host_file)
    with pytest.raises(UntrustedFileError) as e:
        untrusted.read_text(root, "RECORD", shown_as="/")
    assert e.value.message == f"/RECORD is a symlink to {host_file}; not followed"
    assert SECRET not in e.value.render()


def test_a_directory_on_the_way_that_is_a_link_is_refused(root: Path, host_file: Path) -> None:
    (root / "usr").mkdir()
    (root / "usr/lib").symlink_to(host_file.parent)
    with pytest.raises(UntrustedFileError, match=r"^/usr/lib is a symlink to .*host; not"):
        untrusted.read_bytes(root, "usr/lib/secret.txt", shown_as="/")


def _sparse(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(2 << 30)


@pytest.mark.parametrize(
    ("name", "make", "refused", "hashed", "limit"),
    [
        ("RECORD", lambda p: p.symlink_to("/etc/shadow"), "RECORD is a symlink to /etc/shadow; not",
         "symlink to /etc/shadow", None),
        ("rc", os.mkfifo, r"^rc is a FIFO, not a regular file; not read", "is a FIFO", None),
        pytest.param(
            "zero", lambda p: os.mknod(p, 0o644 | stat.S_IFCHR, os.makedev(1, 5)),  # /dev/zero's
            r"^zero is a character device, not a regular", "is a character device", None,
            marks=pytest.mark.skipif(not can_mknod(), reason="mknod needs root")),
        ("RECORD", _sparse, "2147483648 bytes or more, over the limit",
         "over the limit of 1048576", 1 << 20),
    ],
    ids=["link-to-etc-shadow", "fifo-without-blocking", "character-device-not-read-until-memory-"
         "runs-out", "sparse-2-gib-file-by-its-size-not-read"],
)  # fmt: skip
def test_a_link_a_special_file_or_an_oversized_one_is_refused(
    root: Path,
    name: str,
    make: Callable[[Path], object],
    refused: str,
    hashed: str,
    limit: int | None,
) -> None:
    make(root / name)
    with pytest.raises(UntrustedFileError, match=refused):
        untrusted.read_bytes(root, name)
    with pytest.raises(UntrustedFileError, match=hashed):
        untrusted.file_sha256(root, name, limit=limit)


def test_hashing_is_streamed_never_a_whole_file_read(root: Path) -> None:
    size = 64 << 20
    with (root / "big.so").open("wb") as f:
        f.truncate(size)
    tracemalloc.start()
    try:
        got = untrusted.file_sha256(root, "big.so")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got is not None and got[1] == size
    h = hashlib.sha256()
    for _ in range(64):
        h.update(bytes(1 << 20))
    assert got[0] == h.digest()
    assert peak < 8 << 20  # a few 1 MiB blocks, not 64 MiB


@pytest.mark.parametrize("rel", ["../host/secret.txt", "a/../../x", "", "a\0b"])
def test_a_path_that_climbs_out_is_refused(root: Path, rel: str) -> None:
    (root / "a").mkdir()
    with pytest.raises(UntrustedFileError, match="not a path inside the tree"):
        untrusted.read_bytes(root, rel)


def test_a_regular_file_is_read_and_a_missing_one_is_none(root: Path) -> None:
    (root / "a").mkdir()
    (root / "a/f").write_bytes(b"ok\n")
    assert untrusted.read_bytes(root, "/a/f") == b"ok\n"
    assert untrusted.read_bytes(root, "a/missing") is None
    assert untrusted.read_bytes(root, "a/f/below") is None


# --- a crafted squashfs through `export --check` ------------------------------------------------
def sqsh_of(root: Path, out: Path) -> Path:
    subprocess.run(
        ["mksquashfs", str(root), str(out), "-quiet", "-no-progress", "-noappend"],
        check=True,
        capture_output=True,
    )
    return out


# The squashfs image's sparse file: 64 times the hash limit the test lowers to (mksquashfs reads
# every zero of it; a 2 GiB one cost 6 s), the size check's own 2 GiB case is unit-tested above.
HASH_LIMIT = 1 << 20
SPARSE = 64 * HASH_LIMIT


def dist(root: Path, name: str, rows: list[str]) -> Path:
    info = root / SITE / f"{name}-1.dist-info"
    info.mkdir(parents=True)
    (info / "RECORD").write_text("".join(r + "\n" for r in rows))
    return info / "RECORD"


def hostile_image(root: Path, host_file: Path) -> None:
    """An image whose RECORDs and files are links to the host, devices, FIFOs, a sparse file
    over the (lowered) hash limit; /etc/rc a FIFO, /etc/environment a link to a host file."""
    (root / "etc/k3env").mkdir(parents=True)
    (root / "etc/k3env/provenance.json").write_text(json.dumps({"config": {}, "image": "x"}))
    os.mkfifo(root / "etc/rc")
    (root / "etc/environment").symlink_to(host_file)
    dist(root, "ok", ["ok/a.py,sha256=" + record_b64(b"print(1)\n") + ",9"])
    (root / SITE / "ok").mkdir()
    (root / SITE / "ok/a.py").write_bytes(b"print(1)\n")
    linked = root / SITE / "linked-1.dist-info"
    linked.mkdir(parents=True)
    (linked / "RECORD").symlink_to(host_file)
    shadow = root / SITE / "shadow-1.dist-info"
    shadow.mkdir()
    (shadow / "RECORD").symlink_to("/etc/shadow")
    # A file linked to a host file whose hash RECORD pins: used to pass (a confirmed guess).
    data = host_file.read_bytes()
    dist(root, "guess", [f"guess/x.py,sha256={record_b64(data)},{len(data)}"])
    (root / SITE / "guess").mkdir()
    (root / SITE / "guess/x.py").symlink_to(host_file)
    dist(root, "fifo", ["fifo/pipe,sha256=AAAA,3"])
    (root / SITE / "fifo").mkdir()
    os.mkfifo(root / SITE / "fifo/pipe")
    if can_mknod():
        dist(root, "dev", ["dev/zero,sha256=AAAA,3"])
        (root / SITE / "dev").mkdir()
        os.mknod(root / SITE / "dev/zero", 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    dist(root, "sparse", [f"sparse/big,sha256=AAAA,{SPARSE}"])
    (root / SITE / "sparse").mkdir()
    with (root / SITE / "sparse/big").open("wb") as f:
        f.truncate(SPARSE)
    dist(root, "climb", ["../../../../../host/secret.txt,sha256=AAAA,3"])


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the hostile image's squashfs, the host file it links to), made once: mksquashfs
    reads the sparse file's zeros."""
    tmp = tmp_path_factory.mktemp("hostile")
    host_file = tmp / "host" / "secret.txt"
    host_file.parent.mkdir()
    host_file.write_text(f"{SECRET}\nsecond line\n")
    hostile_image(tmp / "image", host_file)
    return sqsh_of(tmp / "image", tmp / "hostile.sqsh"), host_file


@SQUASHFS_TOOLS
def test_export_check_never_follows_what_the_image_holds(
    repo: Path, hostile: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sqsh, host_file = hostile
    # The sparse file's RECORD size is right: hashing it is bounded by the limit.
    monkeypatch.setattr(untrusted, "HASH_LIMIT", HASH_LIMIT)
    items = check_squashfs(sqsh, load_lock(Path("pins/k3.lock.toml")), {}, QUIET)
    shown = "\n".join(f"{i.name}: {i.detail}" for i in items)
    assert SECRET not in shown and "second line" not in shown
    by = {i.name: i for i in items}
    assert by["etc/rc"].detail == "/etc/rc is a FIFO, not a regular file; not read"
    assert by["etc/environment"].detail == (
        f"/etc/environment is a symlink to {host_file}; not followed"
    )
    assert f"/{SITE}/linked-1.dist-info/RECORD is a symlink to {host_file}; not followed" in (
        by["python linked-1"].detail
    )
    assert "RECORD is a symlink to /etc/shadow; not followed" in by["python shadow-1"].detail
    assert by["python guess-1"].detail == (
        f"/{SITE}/guess/x.py is a symlink to {host_file}; not followed"
    )
    assert (
        by["python fifo-1"].detail == f"/{SITE}/fifo/pipe is a FIFO, not a regular file; not read"
    )
    if can_mknod():
        assert "dev/zero is a character device, not a regular file" in by["python dev-1"].detail
    assert f"sparse/big is {SPARSE} bytes or more, over the limit" in by["python sparse-1"].detail
    assert by["python climb-1"].detail.endswith("is missing")
    assert "python ok-1" not in by
    assert not any(i.status == "passed" for i in items if i.name.startswith("python "))


@SQUASHFS_TOOLS
def test_extraction_creates_no_link_device_or_fifo(
    tmp_path: Path, hostile: tuple[Path, Path]
) -> None:
    sqsh, _ = hostile
    work = tmp_path / "work"
    work.mkdir()
    fs = Squashfs(sqsh, QUIET, work)
    dest = fs.fresh()
    fs.extract(dest, fs.listing())
    kinds = {untrusted.kind(os.lstat(p).st_mode) for p in dest.rglob("*")}
    assert kinds == {"a directory", "a regular file"}
    with pytest.raises(UntrustedFileError, match="is a symlink to /etc/shadow"):
        fs.read(f"{SITE}/shadow-1.dist-info/RECORD")
    assert fs.read("etc/k3env/provenance.json") is not None and fs.read("nope") is None


@SQUASHFS_TOOLS
def test_a_provenance_file_linked_out_fails_the_check_naming_it(
    repo: Path, tmp_path: Path, host_file: Path
) -> None:
    root = tmp_path / "image"
    (root / "etc/k3env").mkdir(parents=True)
    (root / "etc/k3env/provenance.json").symlink_to(host_file)
    sqsh = sqsh_of(root, tmp_path / "p.sqsh")
    with pytest.raises(UntrustedFileError) as e:
        check_squashfs(sqsh, load_lock(Path("pins/k3.lock.toml")), {}, QUIET)
    assert e.value.message == (
        f"/etc/k3env/provenance.json is a symlink to {host_file}; not followed"
    )
    assert e.value.where == str(sqsh) and e.value.return_code == 4


@SQUASHFS_TOOLS
@pytest.mark.parametrize(
    "doc",
    [
        {"config": {"Env": "A=1"}},
        {"config": {"Labels": ["a"]}},
        {"config": {"Cmd": [1]}},
        {"config": {}, "files": ["etc/x"]},
        {"config": {}, "lock": "sha256"},
        {"config": {}, "patches": [1]},
        {"config": {}, "patches": [{"name": 1, "status": "applied"}]},
        {"config": {}, "image": ["x"]},
        {"config": {}, "base": {"pin": 7}},
    ],
    ids=["env-str", "labels-list", "cmd-ints", "files-list", "lock-str", "patch-int",
         "patch-name-int", "image-list", "base-pin-int"],
)  # fmt: skip
def test_a_provenance_with_fields_of_the_wrong_type_is_refused_not_a_traceback(
    repo: Path, tmp_path: Path, doc: dict[str, Any]
) -> None:
    from k3env.errors import ConfigError

    root = tmp_path / "image"
    (root / "etc/k3env").mkdir(parents=True)
    (root / "etc/k3env/provenance.json").write_text(json.dumps(doc))
    sqsh = sqsh_of(root, tmp_path / "p.sqsh")
    with pytest.raises(ConfigError, match=r"is not valid provenance \(its ") as e:
        check_squashfs(sqsh, load_lock(Path("pins/k3.lock.toml")), {}, QUIET)
    assert e.value.return_code == 2


# --- a repository's links through `srt materialize`'s copy ---------------------------------------
def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": os.environ["PATH"]}  # fmt: skip
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout


def tagged_checkout(tmp_path: Path, links: dict[str, str]) -> Path:
    """A clone, at its tag, of a repository whose tagged commit holds ``links``."""
    upstream = tmp_path / "upstream"
    (upstream / "sub").mkdir(parents=True)
    (upstream / "a.txt").write_text("a\n")
    (upstream / "sub/b.txt").write_text("b\n")
    for name, target in links.items():
        os.symlink(target, upstream / name)
    git(upstream, "init", "-q")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-qm", "v1")
    git(upstream, "tag", "v1")
    src = tmp_path / "src"
    git(tmp_path, "clone", "--quiet", "--no-checkout", "--", str(upstream), str(src))
    git(src, "checkout", "--quiet", "--detach", "v1")
    return src


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "host-secret").write_text(SECRET)
    return d


def test_a_link_to_a_host_directory_is_refused_not_copied(tmp_path: Path, outside: Path) -> None:
    src = tagged_checkout(tmp_path, {"leak": str(outside)})
    dest = tmp_path / "pkg"
    with pytest.raises(UntrustedFileError) as e:
        copy_checkout(src, dest, where="srt-slurm v1")
    assert f"leak is a symlink to {outside}, an absolute path; not followed" in e.value.message
    assert e.value.where == "srt-slurm v1"
    assert not dest.exists()


def test_a_relative_link_climbing_out_is_refused(tmp_path: Path, outside: Path) -> None:
    src = tagged_checkout(tmp_path, {"sub/up": "../../outside"})
    with pytest.raises(
        UntrustedFileError, match=r"sub/up is a symlink to \.\./\.\./outside, outside"
    ):
        copy_checkout(src, tmp_path / "pkg", where="srt-slurm v1")


def test_links_to_dot_are_refused_not_copied_exponentially(tmp_path: Path) -> None:
    src = tagged_checkout(tmp_path, {"loop1": ".", "sub/loop2": ".."})
    with pytest.raises(UntrustedFileError) as e:
        copy_checkout(src, tmp_path / "pkg", where="srt-slurm v1")
    assert "2 symlink(s)" in e.value.message
    assert "loop1 is a symlink to ., a directory holding it (a loop)" in e.value.message
    assert "sub/loop2 is a symlink to .., a directory holding it (a loop)" in e.value.message


def test_links_inside_the_repository_are_copied_as_links(tmp_path: Path, outside: Path) -> None:
    src = tagged_checkout(tmp_path, {"alias": "a.txt", "docs": "sub", "sub/back": "../a.txt"})
    dest = tmp_path / "pkg"
    copy_checkout(src, dest, where="srt-slurm v1")
    assert os.readlink(dest / "alias") == "a.txt" and os.readlink(dest / "docs") == "sub"
    assert os.readlink(dest / "sub/back") == "../a.txt"
    assert (dest / "sub/b.txt").read_text() == "b\n" and not (dest / ".git").exists()


# --- a recipe gets no key it never had ----------------------------------------------------------
def test_a_cluster_file_name_with_a_newline_adds_no_key_to_the_recipe(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "clusters").mkdir()
    evil = repo / "clusters" / "b200\nsetup_script: evil.toml"
    shutil.copy(REPO / "clusters/b200-dgxc.toml", evil)
    container = "x.sqsh\nsetup_script: evil2"
    code = main(["srt", "recipe", "kimi-k3-direct-f", "--cluster", str(evil), "--container",
                 container, "--model-path", "/m\n#", "--json", "-q"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    text = str(json.loads(capsys.readouterr().out)["recipe"])
    doc: dict[str, Any] = yaml.safe_load(text)
    assert "setup_script" not in doc
    assert doc["model"]["container"] == container and doc["model"]["path"] == "/m\n#"
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert "# For b200\\nsetup_script: evil: linux/amd64 nodes (x86_64)." in head
    assert not any(line.startswith("setup_script") for line in text.splitlines())


@pytest.mark.parametrize(
    "value", ["a\nsetup_script: evil", "true", "1e-05", "- x", "#", "\u2028x", 1e-05,
              float("inf"), True, None, 3, ["a\nb: c", 1.5], {"k\n: v": "x"}],
)  # fmt: skip
def test_every_key_and_value_round_trips_through_the_written_yaml(value: object) -> None:
    data = {"backend": {"aggregated_environment": {"A\nsetup_script": value, "true": "x"}}}
    assert yaml.safe_load(to_yaml(data)) == data


def test_cluster_commands_quote_names_as_shell_words_and_yaml_scalars() -> None:
    from k3env.config.spec import load_spec
    from k3env.handoff.enroot import cluster_commands
    from k3env.image.records import Exported, Pushed

    spec = load_spec(REPO / "images/kimi-k3-direct-f.toml", load_lock(REPO / "pins/k3.lock.toml"))
    pushed = Pushed(image=spec.name, image_id="i", reference="r.io/k3env/x:1",
                    digest="sha256:" + "1" * 64, layers_sent=1, layers_skipped=0)  # fmt: skip
    name = "x $(touch owned); y: z.sqsh"
    exported = Exported(image=spec.name, image_id="i", path=f"/o/{name}", sha256="0" * 64,
                        size=1, mksquashfs="m", options=())  # fmt: skip
    lines = cluster_commands(spec, pushed, exported).splitlines()
    (enroot,) = [line for line in lines if "enroot import" in line]
    assert shlex.split(enroot) == ["ENROOT_ALLOW_HTTP=y", "enroot", "import", "-o", name,
                                   pushed.enroot_uri]  # fmt: skip
    (check,) = [line for line in lines if line.startswith("k3env export")]
    assert shlex.split(check, comments=True) == ["k3env", "export", "--check", name]
    mapping = lines[lines.index("containers:") :][:2]
    assert yaml.safe_load("\n".join(mapping)) == {
        "containers": {pushed.by_digest: f"/path/to/{name}"}
    }


@SQUASHFS_TOOLS
def test_a_directory_of_many_wanted_files_is_extracted_whole_without_its_links(
    tmp_path: Path, host_file: Path
) -> None:
    """unsquashfs matches a directory's entries against the extract list one by one: a
    directory of WHOLE_DIR or more wanted files is named whole (linear in files), and its
    link, FIFO and the link in its subdirectory are excluded by name: never created."""
    from k3env.handoff.squashfs import WHOLE_DIR, Squashfs, _extract_lists

    tree = tmp_path / "tree"
    flat = tree / "site" / "flat"
    (flat / "sub").mkdir(parents=True)
    for i in range(WHOLE_DIR):
        (flat / f"f{i}[1].py").write_text(str(i))
    (flat / "sub" / "x.py").write_text("x")
    (flat / "link").symlink_to(host_file)
    (flat / "sub" / "link").symlink_to(host_file)
    os.mkfifo(flat / "fifo")
    (tree / "site" / "few.py").write_text("few")
    fs = Squashfs(sqsh_of(tree, tmp_path / "t.sqsh"), QUIET, tmp_path / "work")
    wanted = [f"site/flat/f{i}[1].py" for i in range(WHOLE_DIR)] + ["site/few.py"]
    extract, exclude = _extract_lists(fs.entries(), sorted(wanted))
    assert extract == ["site/few.py", "site/flat"]
    assert exclude == ["site/flat/fifo", "site/flat/link", "site/flat/sub/link"]
    (tmp_path / "work").mkdir()
    dest = fs.fresh()
    fs.extract(dest, wanted)
    assert (dest / "site/flat/f7[1].py").read_text() == "7"
    assert (dest / "site/few.py").read_text() == "few"
    assert (dest / "site/flat/sub/x.py").is_file()  # the subtree comes along
    made = {p.name for p in dest.rglob("*")}
    assert not {"link", "fifo"} & made
    # One file fewer is named file by file; a directory crowded with links never whole.
    assert _extract_lists(fs.entries(), sorted(wanted[1:])) == (sorted(wanted[1:]), [])
    crowded = {**fs.entries()}
    crowded.update({f"site/flat/sub/l{i}": crowded["site/flat/link"] for i in range(WHOLE_DIR)})
    assert _extract_lists(crowded, sorted(wanted)) == (sorted(wanted), [])


def test_hashing_many_files_walks_each_path_as_one_file_is_walked(
    tmp_path: Path, host_file: Path
) -> None:
    """files_sha256 keeps the directories it shares between paths open, and answers each path
    exactly as file_sha256 does: its hash, None when missing, the same refusal."""
    from k3env import untrusted

    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "one").write_text("1")
    (tree / "a" / "two").write_text("22")
    (tree / "c").mkdir()
    (tree / "c" / "three").write_text("333")
    (tree / "a" / "link").symlink_to(host_file)
    (tree / "dirlink").symlink_to(tree / "c")
    os.mkfifo(tree / "a" / "fifo")
    rels = ["a/b/one", "a/b/gone", "a/fifo", "a/link", "a/two", "a/two/under", "c/three",
            "dirlink/three", "a/b/one", "/c/./three"]  # fmt: skip
    got = list(untrusted.files_sha256(tree, rels, shown_as="/"))
    assert [r for r, _ in got] == rels
    for rel, answer in got:
        try:
            alone: object = untrusted.file_sha256(tree, rel, shown_as="/")
        except UntrustedFileError as e:
            alone = e
        if isinstance(alone, UntrustedFileError):
            assert isinstance(answer, UntrustedFileError) and answer.message == alone.message
        else:
            assert answer == alone, rel
    answers = dict(got)
    assert answers["a/b/gone"] is None and answers["a/two/under"] is None
    assert answers["c/three"] == (hashlib.sha256(b"333").digest(), 3)
    assert "symlink" in str(answers["dirlink/three"]) and "FIFO" in str(answers["a/fifo"])
    with pytest.raises(UntrustedFileError, match="not a path inside"):
        untrusted.file_sha256(tree, "../x")
    assert isinstance(dict(untrusted.files_sha256(tree, ["../x"]))["../x"], UntrustedFileError)
