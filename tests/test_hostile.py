"""Hostile and broken input: nothing injected, nothing lost, no traceback, one JSON document.

A property test (hypothesis) mutates the committed lock, specs and cluster profile (and a
fake-engine project for `build`) and checks the exit-code contract on each; the named cases
below are the regressions the bad-input sweep found, kept one by one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3env.cli import main
from k3env.errors import ConfigError
from k3env.handoff.enroot import enroot_files
from k3env.image.tarstream import filter_tar

from .conftest import REPO, replace_in
from .fake_engine import FakeEngine

LOCK = Path("pins/k3.lock.toml")
SPEC = Path("images/kimi-k3-direct-f.toml")
CLUSTER = Path("clusters/b200-dgxc.toml")

# Values a file could carry to reach an image file, a command line or a tag.
CONTROL = ["x\ntouch /tmp/k3env-pwned\n#", "1\nLD_PRELOAD=/x.so", "a\rb", "nul\x00", "tab\tx"]
HOSTILE: list[Any] = [
    *CONTROL,
    "--upload-pack=touch /tmp/k3env-pwned;:",
    "/usr/lib/../../../../etc/passwd",
    "/etc/passwd",
    "not a tag; rm -rf ~",
    "$(touch /tmp/k3env-pwned)",
    "",
    " ",
    "é" * 3,
    "x" * 300,
    "hf_abcdefghijklmnopqrstuvwxyz0123",
    "https://user:secret@example.com/x",
    8.5,
    -1,
    0,
    True,
    10**20,
    [],
    {},
    ["a", 1],
]


# --- the mutation strategy ----------------------------------------------------------------------
def _leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    else:
        yield path


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[part]
    doc[path[-1]] = value


def _delete(doc: Any, path: tuple[Any, ...]) -> None:
    for part in path[:-1]:
        doc = doc[part]
    del doc[path[-1]]


def _rename(doc: Any, path: tuple[Any, ...]) -> None:
    for part in path[:-1]:
        doc = doc[part]
    if isinstance(path[-1], str):
        doc[path[-1][:-1] + "q"] = doc.pop(path[-1])


@st.composite
def mutation(draw: st.DrawFn, text: str) -> tuple[str, bool]:
    """A mutated TOML document, and whether a control character went into it."""
    doc = tomllib.loads(text)
    leaves = [p for p in _leaves(doc) if p]
    path = draw(st.sampled_from(leaves))
    kind = draw(st.sampled_from(["value", "value", "value", "delete", "rename", "extra"]))
    injected = False
    if kind == "value":
        value = draw(st.sampled_from(HOSTILE))
        injected = value in CONTROL
        _set(doc, path, value)
    elif kind == "delete":
        _delete(doc, path)
    elif kind == "rename":
        _rename(doc, path)
    else:
        _set(doc, (*path[:-1], "k3env_unknown_key"), "1")
    return tomlkit.dumps(doc), injected


def _run(
    argv: list[str], capsys: pytest.CaptureFixture[str], engine: FakeEngine | None = None
) -> tuple[int, dict[str, Any]]:
    code = main(
        [*argv, "--json"], engine=engine
    )  # a traceback would raise out of here and fail the test
    out = capsys.readouterr().out
    payload = json.loads(out)  # exactly one JSON document, success or failure
    assert isinstance(payload, dict) or code == 0
    return code, payload if isinstance(payload, dict) else {}


FILES = {"lock": LOCK, "spec": SPEC, "cluster": CLUSTER}


# Derandomized: CI sees the same corpus every run (a gate must not flip on a new draw); run
# with `--hypothesis-seed=random` here, or raise max_examples, to look for new cases.
@settings(
    max_examples=45,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), which=st.sampled_from(sorted(FILES)))
def test_mutated_inputs_keep_the_exit_contract(
    repo_with_clusters: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject, which: str
) -> None:
    target = FILES[which]
    original = (REPO / target).read_text()
    text, injected = data.draw(mutation(original))
    target.write_text(text)
    lock_before = LOCK.read_bytes()
    try:
        for argv in (["preflight"], ["lock", "--check"]):
            code, payload = _run(argv, capsys)
            assert code in (0, 2, 4), (argv, code, payload)
            if code == 2:
                where = str(payload["error"]["where"]) + str(payload["error"]["message"])
                assert str(target) in where or target.name in where, payload["error"]
            if injected and (argv[0] == "preflight" or which == "lock"):
                assert code == 2, f"a control character was accepted in {target}: {payload}"
        assert LOCK.read_bytes() == lock_before
    finally:
        (repo_with_clusters / target).write_text(original)


@settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_mutated_specs_never_tag_a_wrong_image(
    fake_project: Any,
    fake_engine: FakeEngine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data: st.DataObject,
) -> None:
    spec = fake_project.spec_path
    original = spec.read_text()
    text, injected = data.draw(mutation(original))
    spec.write_text(text)
    lock_before = fake_project.lock_path.read_bytes()
    mark = len(fake_engine.calls)
    try:
        code, payload = _run(["build", "--lock", str(fake_project.lock_path)], capsys, fake_engine)
        assert code in (0, 2, 3, 4), payload
        verbs = [verb for verb, _ in fake_engine.calls[mark:]]
        if code != 0:
            assert "tag" not in verbs, (payload, verbs)
            assert "images/probe.toml" in json.dumps(payload["error"]), payload["error"]
        else:
            assert not injected, f"a control character was built into an image: {text!r}"
            image = fake_engine.inspect(payload["images"][0]["image_id"])
            assert image is not None
            files = dict((p, d) for p, d, _ in enroot_files(image.config))
            env = image.config.get("Env") or []
            assert files["etc/environment"].decode().count("\n") == len(env)
        assert fake_project.lock_path.read_bytes() == lock_before
    finally:
        spec.write_text(original)


# --- named regressions --------------------------------------------------------------------------
NAMED = [
    # (file, old, new, command, exit, message)
    (SPEC, 'description = "', 'description = "x\\ntouch /tmp/p\\n#', ["preflight"], 2,
     "control character \\x0a"),
    (LOCK, "[env]\n", '[env]\nX = "1\\nLD_PRELOAD=/x.so"\n', ["lock", "--check"], 2,
     "control character"),
    (LOCK, 'tag = "kimi-k3"', 'tag = "x\\ny"', ["lock", "--check"], 2, "control character"),
    (LOCK, 'git = "https://github.com/NVIDIA/srt-slurm.git"',
     'git = "--upload-pack=touch /tmp/p;:"', ["lock", "--check"], 2, "is not a git source"),
    (LOCK, 'module = "vllm.v1.worker.gpu.model_states.mamba_hybrid"', 'path = "/etc/passwd"',
     ["lock", "--check"], 2, "outside the roots a container patch may touch"),
    (LOCK, 'module = "vllm.v1.worker.gpu.model_states.mamba_hybrid"',
     'path = "/usr/lib/../../../../usr/lib/os-release"', ["lock", "--check"], 2,
     "is not an absolute, normalised path"),
    (LOCK, 'version = "v1.0.36"', 'version = "not a tag; rm -rf ~"', ["lock", "--check"], 2,
     "is not a release tag"),
    (SPEC, 'description = "', 'repository = "k3env/x;touch /tmp/p"\ndescription = "',
     ["preflight"], 2, "is not an image repository"),
    (CLUSTER, "gpus_per_node = 8", "gpus_per_node = 8.5", ["preflight"], 2,
     "expected an integer"),
    # Found by the property test: a zero divided a rule by zero (a traceback).
    (CLUSTER, "gpu_memory_gib = 178", "gpu_memory_gib = 0", ["preflight"], 2,
     "must be greater than 0"),
    (LOCK, 'digest = "unresolved"', 'digst = "unresolved"', ["lock", "--check"], 2,
     "found `digst`"),
    (SPEC, "[env]\n", '[env]\nHF_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"\n', ["preflight"],
     2, "refusing HF_TOKEN"),
    (LOCK, "[env]\n", '[env]\nHF_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"\n',
     ["lock", "--check"], 2, "refusing HF_TOKEN"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("file", "old", "new", "argv", "code", "message"),
    NAMED,
    ids=[f"{f.name}:{n[:28]}" for f, _o, n, *_ in NAMED],
)
def test_named_bad_input(
    repo_with_clusters: Path,
    capsys: pytest.CaptureFixture[str],
    file: Path,
    old: str,
    new: str,
    argv: list[str],
    code: int,
    message: str,
) -> None:
    replace_in(file, old, new)
    got, payload = _run(argv, capsys)
    assert got == code, payload
    error = payload["error"]
    assert message in error["message"] + str(error["where"]), error
    assert str(file) in str(error["where"]), error


def test_git_option_injection_never_runs(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "pwned"
    code = main(["bump", "srt-slurm", "v1.0.49", "--edit-only", "--json",
                 "--source", f"--upload-pack=touch {marker};:"])  # fmt: skip
    assert code == 2 and not marker.exists()
    assert "is not a git source" in json.loads(capsys.readouterr().out)["error"]["message"]


def test_lock_path_that_is_a_directory(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, payload = _run(["lock", "--check", "--lock", "pins"], capsys)
    assert code == 2 and "cannot read the file" in payload["error"]["message"]


def test_unwritable_state_directory_is_exit_3(
    fake_project: Any,
    fake_engine: FakeEngine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("K3ENV_STATE_DIR", str(blocker / "state"))
    code, payload = _run(["build", "--lock", str(fake_project.lock_path)], capsys, fake_engine)
    assert code == 3 and payload["error"]["error"] == "StateError", payload


def test_a_full_disk_leaves_the_lock_and_no_candidate(
    repo: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    dynamo_source: tuple[Path, dict[str, str]],
) -> None:
    import errno

    from k3env.config import lock_edit

    def full(path: Path, data: bytes | str, *, mode: int | None = None) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(lock_edit, "write_atomic", full)
    before = LOCK.read_bytes()
    source = str(dynamo_source[0])
    code, payload = _run(["bump", "dynamo", "v1.6.1", "--source", source, "--edit-only"], capsys)
    assert code == 2 and "No space left on device" in payload["error"]["message"]
    assert LOCK.read_bytes() == before
    assert sorted(p.name for p in LOCK.parent.iterdir() if "candidate" in p.name) == []


def test_unknown_rule_is_an_error(
    repo_with_clusters: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, payload = _run(["preflight", "--rule", "K3-NOPE"], capsys)
    assert code == 2 and "unknown rule(s) ['K3-NOPE']" in payload["error"]["message"]


def test_a_failing_command_prints_one_json_document(
    repo_with_clusters: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replace_in(SPEC, 'PYTHONHASHSEED = "42"', "")
    code, payload = _run(["preflight", "kimi-k3-direct-f", "--rule", "K3-PYTHONHASHSEED"], capsys)
    assert code == 4 and payload["errors"] == 1 and payload["error"]["exit_code"] == 4


def test_a_tar_stream_cut_inside_a_dropped_entry_ends(tmp_path: Path) -> None:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(".dockerenv")  # an entry the export drops
        info.size = 4096
        tar.addfile(info, io.BytesIO(b"x" * 4096))
    cut = buf.getvalue()[:1024]  # the stream ends inside the dropped entry's data
    with pytest.raises(ValueError, match=re.escape("ended inside '.dockerenv'")):
        list(filter_tar([cut], lambda n: n == ".dockerenv", b""))


def test_concurrent_lock_writers_lose_nothing(
    repo: Path, dynamo_source: tuple[Path, dict[str, str]], dynamo_wheels: Path
) -> None:
    """`bump --edit-only` and `lock --update-hashes` at once: both edits survive, every time."""
    patch = Path("patches/container/mamba-hybrid-index-int64.toml")
    k3env = [sys.executable, "-m", "k3env"]
    for i in range(6):
        patch.write_text(patch.read_text() + f"# edit {i}\n")
        source, tags = dynamo_source
        commit = tags[f"v1.5.{i}"]
        a = subprocess.Popen([*k3env, "bump", "dynamo", f"v1.5.{i}", "--source", str(source),
                              "--wheels-from", str(dynamo_wheels),
                              "--edit-only", "-q"])  # fmt: skip
        b = subprocess.Popen([*k3env, "lock", "--update-hashes", "-q"])
        assert a.wait() == 0 and b.wait() == 0
        code = main(["lock", "--check", "-q"])
        assert code == 0, f"round {i}: the hash update was lost"
        assert f'commit = "{commit[:40]}"' in LOCK.read_text(), f"round {i}: the bump was lost"


def test_a_fifo_where_a_patch_file_is_pinned_is_refused_not_waited_on(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bump container_patches.X` hashed the patch file with a plain open: a FIFO blocked it
    forever. Now it is refused before a byte is read, and the lock is untouched."""
    import os

    from k3env.hashing import file_sha256

    patch = Path("patches/container/mamba-hybrid-index-int64.toml")
    lock = Path("pins/k3.lock.toml")
    before = lock.read_bytes()
    patch.unlink()
    os.mkfifo(patch)
    assert main(["bump", "container_patches.mamba-hybrid-index-int64", "--edit-only"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert lock.read_bytes() == before
    with pytest.raises(ConfigError, match="not a regular file"):
        file_sha256(patch)
