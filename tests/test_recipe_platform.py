"""Each platform its own image: `k3env srt recipe` and the printed enroot lines name the
manifest of the cluster's platform, by its digest (never the index)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.config.spec import load_spec
from k3env.image.records import Build, Pushed, build_key, write
from k3env.state import State

from .conftest import REPO

F = Path("images/kimi-k3-direct-f.toml")
LOCK = Path("pins/k3.lock.toml")
REG = "127.0.0.1:5000/k3env/kimi-k3-direct-f"
DIGESTS = {"linux/amd64": "sha256:" + "1" * 64, "linux/arm64": "sha256:" + "2" * 64}


@pytest.fixture
def pushed(repo: Path) -> State:
    """Both platforms of variant F built over the twin and published under one index."""
    shutil.copytree(REPO / "clusters", repo / "clusters")
    state, lock = State(), load_lock(LOCK)
    spec = load_spec(F, lock)
    for n, (platform, digest) in enumerate(DIGESTS.items()):
        image_id = f"sha256:{str(n) * 64}"
        write(state, Build(image_id=image_id, reference=f"k3env/kimi-k3-direct-f:{n}", twin=True),
              build_key(lock, spec, twin=True, platform=platform))  # fmt: skip
        write(state, Pushed(image=spec.name, image_id=image_id, reference=f"{REG}:idx",
                            digest=digest, layers_sent=1, layers_skipped=0, platform=platform,
                            index="sha256:" + "9" * 64), image_id)  # fmt: skip
    return state


def recipe(capsys: pytest.CaptureFixture[str], cluster: str) -> str:
    code = main(["srt", "recipe", "kimi-k3-direct-f", "--cluster", cluster, "--json", "-q"])
    assert code == 0
    return str(json.loads(capsys.readouterr().out)["recipe"])


def test_each_cluster_gets_its_own_platforms_manifest(
    pushed: State, capsys: pytest.CaptureFixture[str]
) -> None:
    b200 = recipe(capsys, "clusters/b200-dgxc.toml")
    assert f'container: "{REG}@{DIGESTS["linux/amd64"]}"' in b200
    assert "# For b200-dgxc: linux/amd64 nodes (x86_64)" in b200
    gb200 = recipe(capsys, "clusters/gb200-nvl72.toml")
    assert f'container: "{REG}@{DIGESTS["linux/arm64"]}"' in gb200
    assert "# For gb200-nvl72: linux/arm64 nodes (aarch64)" in gb200
    assert 'gpu_type: "gb200"' in gb200 and "gpus_per_node: 4" in gb200
    assert "sha256:" + "9" * 64 not in gb200  # never the index: pyxis imports a manifest


def test_a_platform_never_pushed_is_an_error_naming_the_push(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(REPO / "clusters", repo / "clusters")
    code = main(["srt", "recipe", "kimi-k3-direct-f", "--cluster", "clusters/gb300-nvl72.toml"])
    assert code != 0
    err = capsys.readouterr().err
    assert "has not been pushed for linux/arm64 (the platform of gb300-nvl72)" in err
    assert "k3env push --platform linux/arm64 kimi-k3-direct-f" in err


def test_the_printed_enroot_lines_name_each_platforms_manifest(repo: Path) -> None:
    from k3env.handoff.enroot import cluster_commands

    spec = load_spec(F, load_lock(LOCK))
    lines = {}
    for platform, digest in DIGESTS.items():
        pushed = Pushed(image=spec.name, image_id="i", reference=f"{REG}:idx", digest=digest,
                        layers_sent=1, layers_skipped=0, platform=platform,
                        index="sha256:" + "9" * 64)  # fmt: skip
        lines[platform] = cluster_commands(spec, pushed, None).splitlines()
    assert lines["linux/arm64"][:2] == [
        "# kimi-k3-direct-f (linux/arm64, for aarch64 nodes)",
        "ENROOT_ALLOW_HTTP=y enroot import -o kimi-k3-direct-f.arm64.sqsh "
        f"'docker://127.0.0.1:5000#k3env/kimi-k3-direct-f@{DIGESTS['linux/arm64']}'",
    ]
    assert lines["linux/amd64"][1].startswith(
        "ENROOT_ALLOW_HTTP=y enroot import -o kimi-k3-direct-f.amd64.sqsh"
    )
    assert (
        f'  "{REG}@{DIGESTS["linux/amd64"]}": /path/to/kimi-k3-direct-f.amd64.sqsh'
        in lines["linux/amd64"]
    )


def test_a_platform_named_with_its_variant_is_the_same_machine(repo: Path) -> None:
    from k3env.handoff.enroot import cluster_commands

    spec = load_spec(F, load_lock(LOCK))
    pushed = Pushed(image=spec.name, image_id="i", reference=f"{REG}:idx",
                    digest=DIGESTS["linux/arm64"], layers_sent=1, layers_skipped=0,
                    platform="linux/arm64/v8", index="sha256:" + "9" * 64)  # fmt: skip
    first = cluster_commands(spec, pushed, None).splitlines()[0]
    assert first == "# kimi-k3-direct-f (linux/arm64/v8, for aarch64 nodes)"
