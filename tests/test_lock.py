from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.errors import LockError

from .conftest import REPO, replace_in

LOCK = Path("pins/k3.lock.toml")


def test_real_lock_loads_with_the_kimi_k3_stack() -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    assert lock.version == 1
    assert lock.dynamo is not None
    # A released Dynamo, baked from its wheels; its source commit is not known here yet.
    assert (lock.dynamo.name, lock.dynamo.version, lock.dynamo.commit) == ("v1.6.1", "1.6.1", None)
    assert "dynamo.commit" in [u.key for u in lock.unresolved]
    assert lock.dynamo.component is not None
    assert [(w.name, w.version) for w in lock.dynamo.component.wheels] == [
        ("ai-dynamo", "1.6.1"),
        ("ai-dynamo-runtime", "1.6.1"),
    ]
    assert lock.dynamo.component.extras == ("vllm",)
    assert set(lock.components) == {"dynamo", "aiperf"}
    assert lock.srt_slurm is not None
    assert lock.srt_slurm.version == "v1.0.36"
    assert lock.srt_slurm.commit == "cb651682117df129162cd276cf567ec70dc57b36"
    assert [p.pr for p in lock.srt_slurm.patches] == [278, None]
    # The multi-node patch is a back-port: the upstream commit whose change it carries.
    assert [p.backports for p in lock.srt_slurm.patches] == [
        None,
        "e32e591067fa90cae3641f46d8ff5e0f4c6e82c8",
    ]
    base = lock.bases["vllm-kimi-k3"]
    assert (base.repository, base.tag, base.digest) == (
        "docker.io/vllm/vllm-openai",
        "kimi-k3",
        None,
    )
    assert "bases.vllm-kimi-k3.digest" in [u.key for u in lock.unresolved]
    assert "mamba-hybrid-index-int64" in lock.container_patches


def test_lock_check_reports_unresolved_and_passes(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lock", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True
    keys = {u["key"] for u in out["unresolved"]}
    assert "bases.vllm-kimi-k3.digest" in keys
    assert out["stale"] == []


def test_lock_check_require_resolved_fails(repo: Path) -> None:
    assert main(["lock", "--check", "--require-resolved"]) == 4


def _run_bad(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ('tag = "kimi-k3"', 'tag = "kimi-k3', ["pins/k3.lock.toml", "not valid TOML", "line"]),
        ('tag = "kimi-k3"', 'tag = "kimi-k3"\ndigets = "x"',
         ["bases.vllm-kimi-k3.digets: unknown key", "did you mean `digest`"]),
        *(((old, new, [key, "is not a valid value", "fix:"]) for old, new, key in [
            ('digest = "unresolved"', 'digest = "sha256:1234"', "bases.vllm-kimi-k3.digest"),
            ('commit = "unresolved"', 'commit = "ba83080"', "dynamo.commit"),
            ('commit = "cb651682117df129162cd276cf567ec70dc57b36"', 'commit = "v1.0.36"',
             "srt_slurm.commit")])),
        ('"linux/arm64" = "unresolved"', '"linux/riscv64" = "unresolved"',
         ["'linux/riscv64' is not a platform"]),
        ('"linux/arm64" = "unresolved"', '"linux/arm64" = "sha256:12"',
         ["bases.vllm-kimi-k3.platforms.linux/arm64"]),
        ('omit = ["crick"]', 'omit = ["crick", "not a requirement!"]',
         ["twin.platforms.linux/arm64.omit[1]"]),
        ('[twin.platforms."linux/arm64"]', '[twin.platforms."linux/amd64"]',
         ["is [twin] itself"]),
    ],
    ids=["malformed-toml-names-file-and-line", "unknown-key-with-a-suggestion",
         "bad-base-digest", "bad-dynamo-commit", "srt-commit-a-tag", "unknown-platform",
         "bad-platform-digest", "bad-platform-omit", "platform-that-is-the-twin-itself"],
)  # fmt: skip
def test_a_bad_lock_is_refused_naming_what_and_where(
    repo: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, said: list[str]
) -> None:
    replace_in(LOCK, old, new)
    before = LOCK.read_bytes()
    code, err = _run_bad(capsys, ["lock", "--check"])
    assert code == 2
    assert [s for s in said if s not in err] == [], err
    assert LOCK.read_bytes() == before


def test_patch_file_sha256_differs_from_the_lock(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    patch = Path("patches/container/mamba-hybrid-index-int64.toml")
    patch.write_text(patch.read_text() + "\n# edited\n")
    before = LOCK.read_bytes()
    code, err = _run_bad(capsys, ["lock", "--check"])
    assert code == 4
    assert "container_patches.mamba-hybrid-index-int64.sha256" in err
    assert "--update-hashes" in err
    assert LOCK.read_bytes() == before


def test_update_hashes_edits_only_the_leaf_and_keeps_comments(repo: Path) -> None:
    patch = Path("patches/container/mamba-hybrid-index-int64.toml")
    patch.write_text(patch.read_text() + "\n# edited\n")
    before = LOCK.read_text().splitlines()
    assert main(["lock", "--update-hashes"]) == 0
    after = LOCK.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith("sha256 = ")
    assert main(["lock", "--check"]) == 0


def test_unsupported_version(repo: Path) -> None:
    replace_in(LOCK, "version = 1", "version = 2")
    with pytest.raises(LockError, match="version 2 is not supported"):
        load_lock(LOCK)


def test_container_patch_needs_one_target(repo: Path) -> None:
    replace_in(LOCK, 'module = "vllm.v1', 'path = "/x.py"\nmodule = "vllm.v1')
    with pytest.raises(LockError, match="exactly one target"):
        load_lock(LOCK)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        ('build = ["."]', "both wheels and a source build"),
        ('build = ["../outside"]', "is not a directory inside the repository"),
    ],
)
def test_a_source_build_is_one_or_the_other_and_stays_in_the_repository(
    repo: Path, build: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    replace_in(LOCK, 'extras = ["vllm"]\n', f'extras = ["vllm"]\n{build}\n')
    if "outside" in build:  # a source build alone: no wheels, a resolved commit
        import re

        text = re.sub(r"wheels = \[\n.*?\n\]\n", "", LOCK.read_text(), count=1, flags=re.S)
        LOCK.write_text(text.replace('commit = "unresolved"', 'commit = "' + "a" * 40 + '"', 1))
    assert main(["lock", "--check"]) == 2
    err = capsys.readouterr().err
    assert message in err and "dynamo" in err


def test_each_platform_of_a_base_and_the_grace_twin_are_pinned_or_listed_unresolved(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = load_lock(LOCK)
    base = lock.bases["vllm-kimi-k3"]
    assert base.platforms == {"linux/amd64": None, "linux/arm64": None}
    assert base.platform_reference("linux/arm64") is None
    assert lock.twin is not None and lock.twin.all_platforms == ("linux/amd64", "linux/arm64")
    grace = lock.twin.for_platform("linux/arm64")
    # requires / stand_ins replace [twin]'s; omit adds to it.
    assert "torch==2.13.0" in grace.requires and grace.stand_ins == ()
    assert grace.omit[-1] == "crick" and set(lock.twin.omit) < set(grace.omit)
    runtime = lock.components["dynamo"].for_platform("linux/arm64").wheels[1]
    assert runtime.sha256.startswith("a9fc4744")  # the aarch64 wheel, not the x86_64 one
    replace_in(LOCK, '"linux/arm64" = "unresolved"', f'"linux/arm64" = "sha256:{"a" * 64}"')
    assert main(["lock", "--check", "--json"]) == 0
    keys = {u["key"] for u in json.loads(capsys.readouterr().out)["unresolved"]}
    assert "bases.vllm-kimi-k3.platforms.linux/amd64" in keys
    assert "bases.vllm-kimi-k3.platforms.linux/arm64" not in keys


def test_a_platform_the_twin_lacks_is_a_clear_error(repo: Path) -> None:
    lock = load_lock(LOCK)
    assert lock.twin is not None
    with pytest.raises(LockError, match="no CPU twin for linux/arm64/v8"):
        lock.twin.for_platform("linux/arm64/v8")


def test_a_backport_names_a_full_commit(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    replace_in(
        LOCK, 'backports = "e32e591067fa90cae3641f46d8ff5e0f4c6e82c8"', 'backports = "e32e5910"'
    )
    assert main(["lock", "--check"]) == 2
    err = capsys.readouterr().err
    assert "backports" in err and "40-hex" in err
