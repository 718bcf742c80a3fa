"""What a file names is data with a shape and a size (issue 24): paths stay in the repository,
writers never replace a special file, readers never block on one, patterns and numbers are
bounded. Each case runs the real command (or the real function) on a throwaway project,
checks the exit code and the error, and that nothing was written or left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.config.patchfile import load_patch_file
from k3env.config.tagpattern import UnsafePattern, compile_tag_pattern, matches_tag
from k3env.errors import ConfigError, SpecError
from k3env.files import read_input, write_atomic

from .conftest import REPO, replace_in

LOCK = Path("pins/k3.lock.toml")
SPEC = Path("images/kimi-k3-direct-f.toml")
CLUSTER = Path("clusters/b200-dgxc.toml")
PATCH = Path("patches/container/mamba-hybrid-index-int64.toml")
TWIN_REQUIREMENTS = 'requirements = "pins/cpu-twin.requirements.txt"'


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the block takes longer than ``seconds``: a
    blocking open of a FIFO or a runaway regex is interrupted by SIGALRM."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s: it would hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    """The command's exit code, its one JSON document, and everything it printed."""
    with deadline(30):
        code = main([*argv, "--json"])
    captured = capsys.readouterr()
    payload = json.loads(captured.out)
    return code, payload, captured.out + captured.err


def leftovers(directory: Path) -> list[str]:
    """Temporary files a failed or refused write would leave behind."""
    return sorted(
        p.name for p in directory.iterdir() if p.name.endswith((".partial", ".candidate"))
    )


@pytest.fixture
def project(repo_with_clusters: Path) -> Path:
    """The committed lock, specs, patches and cluster profiles in a temporary repository."""
    return repo_with_clusters


# --- 1. every path a file names goes through one check ------------------------------------------
BAD_PATHS = ["/etc/passwd", "../outside.txt", "pins/../../outside.txt", "pins//x.txt", "./pins/x"]
PATH_FIELDS = [
    # (key as the error names it, the line in the lock, the value to replace)
    ("twin.requirements", TWIN_REQUIREMENTS, "pins/cpu-twin.requirements.txt"),
    ('twin.platforms."linux/arm64".requirements', 'requirements = "pins/cpu-twin.arm64.',
     "pins/cpu-twin.arm64.requirements.txt"),
    ("twin.debian", 'debian = "pins/cpu-twin.debian.txt"', "pins/cpu-twin.debian.txt"),
    ("srt_slurm.requirements", 'requirements = "pins/srtctl', "pins/srtctl.requirements.txt"),
    ("srt_slurm.patches[0].file", 'file = "patches/srt-slurm/pr278-direct-aggregate',
     "patches/srt-slurm/pr278-direct-aggregate-serving.patch"),
    ("container_patches.mamba-hybrid-index-int64.file", f'file = "{PATCH}"', str(PATCH)),
]  # fmt: skip


@pytest.mark.parametrize("bad", BAD_PATHS)
@pytest.mark.parametrize(("key", "line", "value"), PATH_FIELDS, ids=[f[0] for f in PATH_FIELDS])
def test_a_pinned_path_outside_the_repository_is_refused(
    project: Path, capsys: pytest.CaptureFixture[str], key: str, line: str, value: str, bad: str
) -> None:
    """`[twin].requirements` was the one pinned path read unchecked: `lock --check` read and
    printed from /etc/passwd, `twin --resolve` wrote there. Now every path key is checked."""
    text = LOCK.read_text()
    start = text.index(line)
    end = text.index("\n", start)
    LOCK.write_text(text[:start] + text[start:end].replace(value, bad) + text[end:])
    before = LOCK.read_bytes()
    for argv in (["lock", "--check"], ["twin", "--resolve"], ["lock", "--update-hashes"]):
        code, payload, _ = run(argv, capsys)
        error = payload["error"]
        assert code == 2, payload
        assert "is not a path inside the repository" in error["message"], error
        assert f"{LOCK}: {key.replace(chr(34), '')}" in error["where"].replace('"', ""), error
        assert "relative to the repository root" in error["fix"]
    assert LOCK.read_bytes() == before
    assert not (project.parent / "outside.txt").exists()
    assert leftovers(project / "pins") == []


def test_a_pinned_file_linked_out_of_the_repository_is_neither_read_nor_written(
    project: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A symlink committed in the repository (git keeps them) at a pinned path: the lock's
    path is fine, the file it leads to is outside. Nothing is read through it."""
    outside = tmp_path_factory.mktemp("host") / "secret.txt"
    outside.write_text("k3env-host-secret==1.0 --hash=sha256:" + "0" * 64 + "\n")
    pinned = Path("pins/cpu-twin.requirements.txt")
    pinned.unlink()
    pinned.symlink_to(outside)
    code, payload, printed = run(["lock", "--check"], capsys)
    assert code == 2, payload
    assert "leads out of the repository through a symbolic link" in payload["error"]["message"]
    assert "twin.requirements" in payload["error"]["where"]
    assert "k3env-host-secret" not in printed
    assert outside.read_text().startswith("k3env-host-secret")


def test_a_mirror_path_is_checked_by_the_same_rule(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replace_in(LOCK, 'file = "pool/main/n/numactl/', 'file = "pool/main/n/../../../numactl/')
    code, payload, _ = run(["lock", "--check"], capsys)
    assert code == 2 and "leaves the mirror" in payload["error"]["message"], payload
    assert "smoke.debs[0].file" in payload["error"]["where"]


# --- 2. writers never replace a special file; readers never block on one ------------------------
def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def test_a_lock_that_is_a_fifo_is_refused_before_it_blocks(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nobody writes to this FIFO: a plain open() would wait forever."""
    fifo = _fifo(project / "lock.fifo")
    code, payload, _ = run(["lock", "--check", "--lock", str(fifo)], capsys)
    assert code == 2, payload
    assert "it is a FIFO" in payload["error"]["message"]
    assert payload["error"]["where"] == str(fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.parametrize("link", [False, True], ids=["dev-zero", "link-to-dev-zero"])
def test_a_lock_that_is_a_device_is_refused_before_it_fills_memory(
    project: Path, capsys: pytest.CaptureFixture[str], link: bool
) -> None:
    path = Path("/dev/zero")
    if link:
        path = project / "pins" / "zero.lock.toml"
        path.symlink_to("/dev/zero")
    code, payload, _ = run(["lock", "--check", "--lock", str(path)], capsys)
    assert code == 2, payload
    assert "it is a character device" in payload["error"]["message"]


def test_an_oversized_lock_is_refused_without_reading_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = project / "pins" / "big.lock.toml"
    with big.open("wb") as f:
        f.truncate(64 << 30)  # sparse: 64 GiB that take no disk
    code, payload, _ = run(["lock", "--check", "--lock", str(big)], capsys)
    assert code == 2, payload
    assert "larger than the 16 MiB" in payload["error"]["message"]


def test_a_cluster_profile_that_is_a_fifo_is_refused(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = _fifo(project / "clusters" / "fifo.toml")
    code, payload, _ = run(["preflight", "--cluster", str(fifo)], capsys)
    assert code == 2 and "FIFO" in payload["error"]["message"], payload


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_container_patch_file_that_is_special_is_refused(
    project: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """The patch file as the builder reads it (load_patch_file), and as `lock --check` hashes
    it: refused as what it is, neither blocking nor read."""
    lock = load_lock(LOCK)
    pin = lock.container_patches["mamba-hybrid-index-int64"]
    PATCH.unlink()
    if kind == "fifo":
        _fifo(PATCH)
        inside = "a FIFO"
    else:
        PATCH.symlink_to("/dev/zero")
        inside = "a character device"
    with deadline(10), pytest.raises(SpecError, match=re.escape(f"it is {inside}")):
        load_patch_file(pin, PATCH)
    code, payload, _ = run(["lock", "--check"], capsys)
    assert code == 2, payload
    message = payload["error"]["message"]
    if kind == "fifo":
        assert f"is {inside}, not a regular file" in message
    else:  # the link itself leads out of the repository, to /dev/zero
        assert "leads out of the repository through a symbolic link" in message


def test_read_input_bounds_a_file_that_grows(tmp_path: Path) -> None:
    path = tmp_path / "f.toml"
    path.write_bytes(b"x" * 1025)
    with pytest.raises(ConfigError, match="larger than"):
        read_input(path, limit=1024)
    assert read_input(path, limit=1025) == b"x" * 1025


def _socket(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory", "link-to-fifo"])
def test_out_never_replaces_a_special_file(
    project: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """`--out` (and `--markdown`, the same writer): the atomic rename used to replace the
    node itself; now a special file is refused and stays what it was."""
    out = project / "out"
    out.mkdir()
    target = out / "schema.json"
    held = None
    if kind == "fifo":
        _fifo(target)
    elif kind == "socket":
        held = _socket(target)
    elif kind == "directory":
        target.mkdir()
    else:
        _fifo(out / "real.fifo")
        target.symlink_to("real.fifo")
    try:
        before = os.lstat(target).st_mode
        code, payload, _ = run(["schema", "lock", "--out", str(target)], capsys)
        assert code == 2, payload
        assert "refusing to write" in payload["error"]["message"]
        assert "k3env replaces only regular files" in payload["error"]["message"]
        assert os.lstat(target).st_mode == before
        assert leftovers(out) == []
    finally:
        if held is not None:
            held.close()


def test_write_atomic_through_a_symlink_updates_the_target(tmp_path: Path) -> None:
    real = tmp_path / "real.md"
    real.write_text("old")
    link = tmp_path / "link.md"
    link.symlink_to(real.name)
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert leftovers(tmp_path) == []


def test_a_symlinked_lock_is_edited_at_its_target(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lock --update-hashes` (and bump, twin --resolve: the same writer) through a symlinked
    lock: the real lock behind the link gets the edit, the link stays a link."""
    real = Path("pins/k3.real.lock.toml")
    LOCK.rename(real)
    LOCK.symlink_to(real.name)
    PATCH.write_text(PATCH.read_text() + "# an edit\n")
    code, payload, _ = run(["lock", "--update-hashes"], capsys)
    assert code == 0, payload
    assert LOCK.is_symlink() and os.readlink(LOCK) == real.name
    assert [c["key"] for c in payload["changes"]] == [
        "container_patches.mamba-hybrid-index-int64.sha256"
    ]
    assert payload["changes"][0]["new"] in real.read_text()
    assert leftovers(project / "pins") == []
    code, payload, _ = run(["lock", "--check"], capsys)
    assert code == 0, payload


def test_a_lock_linked_to_a_fifo_is_not_edited(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = _fifo(project / "pins" / "real.fifo")
    LOCK.unlink()
    LOCK.symlink_to(fifo.name)
    code, payload, _ = run(["lock", "--update-hashes"], capsys)
    assert code == 2 and "FIFO" in payload["error"]["message"], payload
    assert LOCK.is_symlink() and stat.S_ISFIFO(fifo.stat().st_mode)
    assert leftovers(project / "pins") == []


# --- 3. bounded patterns and numbers -------------------------------------------------------------
UNSAFE_PATTERNS = [
    (r"^(a+)+$", "nested quantifiers backtrack exponentially"),
    (r"^([a-z0-9.-]+)*$", "nested quantifiers backtrack exponentially"),
    (r"^v([.-]?[0-9]+)+$", "nested quantifiers backtrack exponentially"),  # optional separator
    (r"^(a|aa)+$", "holds an alternation"),
    (r"^(v)\1$", "a backreference"),
    (r"^(?=v)v[0-9.]+$", "a lookahead or lookbehind"),
    (r"^(?!x)v[0-9.]+$", "a negative lookahead"),
    (r"(?i)^V[0-9.]+$", "inline flags"),
    (r"^v[0-9]*[0-9]*[0-9]*[0-9]*[0-9]*[0-9]*$", "6 quantifiers"),
    ("^v" + "[0-9]" * 60 + "$", "characters long"),
    (r"^v[0-9", "not a regular expression"),
]


@pytest.mark.parametrize(("pattern", "why"), UNSAFE_PATTERNS, ids=[p for p, _ in UNSAFE_PATTERNS])
def test_an_unsafe_tag_pattern_is_refused_at_load(
    project: Path, capsys: pytest.CaptureFixture[str], pattern: str, why: str
) -> None:
    """`^(a+)+$` against a version of 40 `a` and a `-` took 2^40 steps in every command that
    read the lock. The pattern is refused before it ever runs, saying which construct."""
    quoted = json.dumps(pattern)
    replace_in(LOCK, 'version = "v1.0.36"', f'version = "{"a" * 40}-"\ntag_pattern = {quoted}')
    before = LOCK.read_bytes()
    started = time.monotonic()
    code, payload, _ = run(["lock", "--check"], capsys)
    assert time.monotonic() - started < 10
    assert code == 2, payload
    assert why in payload["error"]["message"], payload["error"]
    assert payload["error"]["where"].endswith("srt_slurm.tag_pattern")
    assert LOCK.read_bytes() == before


@pytest.mark.parametrize(
    "pattern", [r"^v[0-9]+(\.[0-9]+)*$", r"^v\d+\.\d+\.\d+(-rc\d+)?$", r"^v[0-9]+([.-][0-9]+)*$"]
)
def test_a_plain_tag_pattern_still_loads(project: Path, pattern: str) -> None:
    replace_in(
        LOCK, 'version = "v1.0.36"', f'version = "v1.0.36"\ntag_pattern = {json.dumps(pattern)}'
    )
    assert load_lock(LOCK).srt_slurm is not None


def test_a_tag_longer_than_the_oci_grammar_never_reaches_the_pattern(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    compiled = compile_tag_pattern(r"^v[0-9]+$")
    assert matches_tag(compiled, "v" + "1" * 127)
    assert not matches_tag(compiled, "v" + "1" * 128)  # 129 characters: not a tag
    replace_in(LOCK, 'version = "v1.0.36"', f'version = "v{"1" * 200}"')
    code, payload, _ = run(["lock", "--check"], capsys)
    assert code == 2 and "is not a release tag" in payload["error"]["message"], payload


def test_compile_tag_pattern_says_why() -> None:
    with pytest.raises(UnsafePattern, match=re.escape("(a+)+")):
        compile_tag_pattern(r"(x+)*")


BAD_NUMBERS = [
    ("gpu_memory_gib = 178", "gpu_memory_gib = nan", "nan is not a finite number"),
    ("gpu_memory_gib = 178", "gpu_memory_gib = inf", "inf is not a finite number"),
    ("gpu_memory_gib = 178", "gpu_memory_gib = -178", "must be greater than 0"),
    ("gpu_memory_gib = 178", "gpu_memory_gib = 5e-324", "must be greater than 0 (at least 1e-06)"),
    ("gpu_memory_gib = 178", "gpu_memory_gib = 1e400", "inf is not a finite number"),
    ("gpu_memory_gib = 178", "gpu_memory_gib = 1e7", "must be at most 1e+06"),
    ("dram_per_node_gb = 2998.75", "dram_per_node_gb = nan", "nan is not a finite number"),
    ("outside_pool_overhead_gib = 7.55", "outside_pool_overhead_gib = -inf",
     "-inf is not a finite number"),
    ("outside_pool_overhead_gib = 7.55", "outside_pool_overhead_gib = 0", None),
    ("nodes = 2", "nodes = " + "9" * 5000, "a number too long to read"),
    ("nodes = 2", "nodes = " + "9" * 4000, "must be at most 1000000, got an integer of about 40"),
    ("gpus_per_node = 8", "gpus_per_node = 10000000", "must be at most 1000000"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "message"), BAD_NUMBERS, ids=[n[:40] for _, n, _ in BAD_NUMBERS]
)
def test_a_physical_quantity_is_finite_positive_and_bounded(
    project: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, message: str | None
) -> None:
    """NaN compared false with every threshold: `gpu_memory_gib = nan` passed the memory rule
    silently; a 5000-digit integer was a traceback."""
    replace_in(CLUSTER, old, new)
    code, payload, _ = run(["preflight", "kimi-k3-direct-f"], capsys)
    if message is None:  # 0 is a real overhead figure
        assert code in (0, 4), payload
        return
    assert code == 2, payload
    assert message in payload["error"]["message"], payload["error"]
    assert str(CLUSTER) in payload["error"]["where"]


@pytest.mark.parametrize("value", ["nan", "inf", "-0.5", "1.5", "0"])
def test_a_gpu_memory_utilization_that_is_not_a_fraction_is_an_error(
    project: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    replace_in(SPEC, '"--gpu-memory-utilization", "0.90"', f'"--gpu-memory-utilization", "{value}"')
    code, payload, _ = run(["preflight", "kimi-k3-direct-f"], capsys)
    assert code == 4, payload
    assert f"--gpu-memory-utilization {value} is not a fraction in (0, 1]" in json.dumps(payload)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-1", "1e999"])
def test_an_offload_byte_count_that_is_not_finite_is_an_error(
    project: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """JSON (vLLM's --kv-transfer-config) allows NaN and Infinity; `int(inf)` was a
    traceback and NaN passed the DRAM budget."""
    replace_in(
        SPEC, '"cpu_bytes_to_use_per_rank":299875000000', f'"cpu_bytes_to_use_per_rank":{value}'
    )
    code, payload, _ = run(["preflight", "kimi-k3-direct-f"], capsys)
    assert code == 4, payload
    assert "is not a finite byte count" in json.dumps(payload)


def test_a_usage_error_with_json_is_one_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    from k3env.cli import main

    assert main(["lock", "--no-such-option", "--json"]) == 2
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["error"]["error"] == "UsageError"
    assert document["error"]["exit_code"] == 2
    assert "unrecognized arguments: --no-such-option" in document["error"]["message"]
    assert "usage: k3env" in captured.err


def test_json_into_a_full_stdout_is_an_error_not_a_traceback() -> None:
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "k3env", "lock", "--check", "--json"],
            stdout=full, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "cannot write the JSON result to stdout: No space left on device" in proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
