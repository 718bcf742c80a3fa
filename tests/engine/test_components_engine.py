"""Pinned components baked into real images, against the real engine and the real wheels.

The repository's lock bakes ai-dynamo / ai-dynamo-runtime 1.6.1 and aiperf 0.13.0 over the
CPU twin; its variant ``dynamo-1.4.2`` swaps in Dynamo 1.4.2, whose frontend does not load the
``kimi_k3`` tokenizer and whose ``vllm`` extra pins vLLM 0.26.0 (the twin carries 0.31.0).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.engine.dockerd import DockerEngine
from k3env.image.bases import ResolvedBase
from k3env.image.components import LABEL, bake
from k3env.log import Log
from k3env.state import State

DYNAMO = "kimi-k3-dynamo"


def _only(repo: Path, name: str) -> None:
    for spec in (repo / "images").glob("*.toml"):
        if spec.stem != name:
            spec.unlink()


def _in_image(image: str, code: str) -> str:
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "python3", "-c", code],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def test_the_pinned_components_are_baked_and_rebuild_to_the_same_ids(
    repo: Path, engine: DockerEngine, twin_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _only(repo, DYNAMO)
    assert main(["build", "--twin", "--json", "-q"]) == 0
    first = json.loads(capsys.readouterr().out)["images"][0]
    assert first["components"] == ["ai-dynamo 1.6.1", "ai-dynamo-runtime 1.6.1", "aiperf 0.13.0"]
    image = engine.inspect(first["image_id"])
    assert image is not None
    layer = image.config["Labels"][LABEL]
    # The wheels the lock pins are what the image holds, each once, with hash-checked .pyc.
    found = json.loads(_in_image(first["image_id"], (
        "import importlib.metadata as m, json, importlib.util as u\n"
        "names = ('ai-dynamo', 'ai-dynamo-runtime', 'aiperf')\n"
        "ds = [(d.metadata['Name'], d.version) for d in m.distributions()\n"
        "      if d.metadata['Name'] in names]\n"
        "pyc = u.cache_from_source(m.distribution('aiperf').locate_file('aiperf/__init__.py'))\n"
        "print(json.dumps([sorted(ds), open(pyc, 'rb').read(8)[4:8].hex()]))\n"
    )))  # fmt: skip
    assert found[0] == [["ai-dynamo", "1.6.1"], ["ai-dynamo-runtime", "1.6.1"],
                        ["aiperf", "0.13.0"]]  # fmt: skip
    assert found[1] == "03000000"  # PEP 552 flags: hash-based, checked
    # Removed from the engine (layer and image) and rebuilt on a clean state: the same IDs.
    subprocess.run(["docker", "rmi", "-f", first["image_id"], f"k3env/components:{layer[:20]}"],
                   check=True, capture_output=True)  # fmt: skip
    assert engine.lookup(f"k3env/components:{layer[:20]}") is None
    (repo / "state").rename(repo / "state.old")
    assert main(["build", "--twin", "--json", "-q"]) == 0
    again = json.loads(capsys.readouterr().out)["images"][0]
    assert again["cached"] is False
    assert again["image_id"] == first["image_id"]


def test_a_variant_without_kimi_k3_and_with_another_vllm_pin_fails_verify_for_both(
    repo: Path, engine: DockerEngine, twin_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _only(repo, DYNAMO)
    md = repo / "matrix.md"
    assert main(["matrix", "--variant", "dynamo-1.4.2", "--json", "--markdown", str(md)]) == 0
    cells = {c["variant"]: c for c in json.loads(capsys.readouterr().out)["cells"]}
    assert cells["dynamo-1.4.2"]["versions"].startswith("ai-dynamo 1.4.2, ai-dynamo-runtime 1.4.2")

    def failed(variant: str) -> dict[str, str]:
        return {f"{f['check']} {f['subject']}": f["output"] for f in cells[variant]["failed"]}

    old, pinned = failed("dynamo-1.4.2"), failed("pinned")
    # The released 1.4.2 frontend does not load kimi_k3: the verdict names what it supports.
    tokenizer = old["tokenizer model_type kimi_k3"]
    assert "kimi, kimi_k2, kimi_k25, kimi_linear, deepseek_v3" in tokenizer
    # ... and which of the lock's variants would, from each pinned runtime wheel.
    assert tokenizer.startswith(
        "lock variants whose runtime loads 'kimi_k3': dynamo-1.5.1 (ai-dynamo-runtime 1.5.1); "
        "not: dynamo-1.4.2 (ai-dynamo-runtime 1.4.2)"
    )
    assert "tokenizer model_type kimi_k3" not in pinned  # 1.6.1 loads it
    # Its vllm extra pins another vLLM: named with both packages and the installed version.
    assert old["versions requires ai-dynamo"] == (
        "ai-dynamo 1.4.2 requires vllm[flashinfer,otel,runai]==0.26.0 (extra vllm); "
        "installed vllm 0.31.0"
    )
    assert not any(k.startswith("versions requires") for k in pinned)
    assert "| `kimi-k3-dynamo` |" in md.read_text()


def test_a_base_that_already_has_another_release_keeps_only_the_pinned_one(
    repo: Path, engine: DockerEngine, dynamo_142_image: str
) -> None:
    """Like pip's uninstall: the old release's files are whited out, its metadata gone."""
    lock = load_lock(repo / "pins/k3.lock.toml")
    image = engine.inspect(dynamo_142_image)
    assert image is not None
    base = ResolvedBase(pin=lock.bases["cpu-twin"], reference=dynamo_142_image,
                        name=dynamo_142_image, digest=None, image=image)  # fmt: skip
    over, baked = bake(engine, State(repo / "state"), Log(quiet=True), base,
                       [lock.components["dynamo"]])  # fmt: skip
    assert baked.replaced == {"ai-dynamo": ["1.4.2"], "ai-dynamo-runtime": ["1.4.2"]}
    versions = json.loads(_in_image(over.image.id, (
        "import importlib.metadata as m, json\n"
        "print(json.dumps(sorted((d.metadata['Name'], d.version) for d in m.distributions()\n"
        "                        if d.metadata['Name'].startswith('ai-dynamo'))))\n"
    )))  # fmt: skip
    assert versions == [["ai-dynamo", "1.6.1"], ["ai-dynamo-runtime", "1.6.1"]]


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": "/usr/bin:/bin"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip


def test_a_component_pinned_only_by_its_source_commit_is_built_into_wheels_and_baked(
    repo: Path, engine: DockerEngine, twin_image: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The day-zero shape: a tag no release has. A small setuptools project stands in for
    the upstream; its own build backend (in the base) makes the wheel, no network."""
    import re

    src = tmp_path / "upstream"
    (src / "k3demo").mkdir(parents=True)
    _git(src, "init", "-q")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "k3demo"\nversion = "0.1.0"\n'
    )
    commits = []
    for value in (1, 2):
        (src / "k3demo/__init__.py").write_text(f"VALUE = {value}\n")
        _git(src, "add", "-A")
        _git(src, "commit", "-qm", f"value {value}")
        commits.append(_git(src, "rev-parse", "HEAD"))
    lock = repo / "pins/k3.lock.toml"
    # Variants pin wheels of the component this test builds from source: not wanted here.
    text = lock.read_text().split("\n# Variants")[0].rsplit("\n# ---", 1)[0] + "\n"
    text = re.sub(r'extras = \["vllm"\]\nwheels = \[\n.*?\n\]\n', 'build = ["."]\n', text,
                  count=1, flags=re.S)  # fmt: skip
    text = text.replace('git = "https://github.com/ai-dynamo/dynamo.git"', f'git = "{src}"')
    text = text.replace('commit = "unresolved"', f'commit = "{commits[0]}"', 1)
    lock.write_text(text)
    _only(repo, DYNAMO)
    spec = repo / f"images/{DYNAMO}.toml"
    spec.write_text(spec.read_text().replace('components = ["dynamo", "aiperf"]',
                                             'components = ["dynamo"]'))  # fmt: skip

    def build() -> dict[str, object]:
        assert main(["build", "--twin", "--json", "-q"]) == 0
        result: dict[str, object] = json.loads(capsys.readouterr().out)["images"][0]
        return result

    first = build()
    assert first["components"] == [f"dynamo @ {commits[0][:12]} (built from source)"]
    image = str(first["image_id"])
    assert _in_image(image, "import k3demo, importlib.metadata as m; "
                     "print(k3demo.VALUE, m.version('k3demo'))") == "1 0.1.0"  # fmt: skip
    provenance = json.loads(_in_image(image, "print(open('/etc/k3env/provenance.json').read())"))
    (wheel,) = provenance["components"]["wheels"]
    assert wheel["name"] == "k3demo" and len(wheel["sha256"]) == 64
    # The same commit again: the wheels come from the cache, the image is the same.
    assert build()["image_id"] == image
    # Another commit, another image carrying the other code.
    lock.write_text(lock.read_text().replace(commits[0], commits[1]))
    second = build()
    assert second["image_id"] != image
    assert _in_image(str(second["image_id"]), "import k3demo; print(k3demo.VALUE)") == "2"


def test_a_vllm_variant_over_the_twin_reads_the_env_the_twins_vllm_does_not(
    repo: Path, engine: DockerEngine, twin_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Variant F bakes VLLM_PREFIX_CACHE_RETENTION_INTERVAL: vLLM 0.31.0 (the twin's) reads
    it nowhere and takes a flag instead; vLLM 0.29.0, laid over the twin as one layer, reads
    it. The same spec, one verdict apart, because of the vLLM release."""
    _only(repo, "kimi-k3-direct-f")
    assert main(["matrix", "--variant", "vllm-0.29.0", "--json"]) == 0
    cells = {c["variant"]: c for c in json.loads(capsys.readouterr().out)["cells"]}
    pinned, older = cells["pinned"], cells["vllm-0.29.0"]
    assert pinned["stack"]["vllm"] == "0.31.0" and older["stack"]["vllm"] == "0.29.0"
    env = [f for f in pinned["failed"] if f["check"] == "env"]
    assert [f["subject"] for f in env] == ["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"]
    assert "nothing in the image reads it (searched vllm 0.31.0)" in env[0]["output"]
    assert "takes --prefix-cache-retention-interval instead" in env[0]["output"]
    assert older["status"] == "passed", older["failed"]
    assert older["versions"] == "aiperf 0.13.0, vllm 0.29.0"
    # The layer holds the release once (the twin's 0.31.0 whited out) over the twin's torch.
    found = json.loads(_in_image(older["image_id"], (
        "import importlib.metadata as m, json\n"
        "v = [d.version for d in m.distributions() if d.metadata['Name'] == 'vllm']\n"
        "print(json.dumps([v, m.version('torch'), m.version('openai-harmony')]))\n"
    )))  # fmt: skip
    assert found == [["0.29.0"], "2.13.0+cpu", "0.0.8"]
    text = (repo / "pins/variants/vllm-0.29.0.requirements.txt").read_text()
    assert "openai-harmony==0.0.8 --hash=sha256:" in text  # from the closure file
