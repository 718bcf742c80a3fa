"""Recipes in (``srt.recipe_check``), verdict by verdict: which image a recipe's container
is (each way a push, an export or a lock base is named, each said in its own words), srt-slurm's
loader as one gate (passed only where it ran; not checked, saying why; failed with its words),
the loader's errors as findings on the recipe's keys and lines, and the result's JSON."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from k3env.checks.preflight import Finding, Hit
from k3env.checks.recipe_map import ImageOf
from k3env.checks.rules import RULES
from k3env.config.cluster import load_cluster
from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.spec import load_spec
from k3env.config.srtrecipe import load_recipe
from k3env.config.yamlread import load_yaml
from k3env.errors import ConfigError, StateError
from k3env.image.records import Build, Exported, Facts, Pushed, as_reference, build_key, write
from k3env.log import Log
from k3env.srt.recipe_check import (
    LOADER_GATE,
    LOADER_RULE,
    Loader,
    check_cluster_config,
    check_recipe,
    containers_of,
    find_image,
    recorded_schema,
    srt_loader,
)
from k3env.srt.validate import RecipeError, Validation
from k3env.state import State

from .conftest import REPO
from .rules_context import FakeRule
from .test_recipes_in import line_of

RECIPES = REPO / "tests/data/recipes"
LOCK = Path("pins/k3.lock.toml")
CLUSTER = Path("clusters/b200-dgxc.toml")
IMAGES = Path("images")
F = "kimi-k3-direct-f"
IMAGE_ID = "sha256:" + "cd" * 32
DIGEST = "sha256:" + "ef" * 32
REGISTRY_REF = "127.0.0.1:5000/k3env/kimi-k3-direct-f"
BY_DIGEST = f"{REGISTRY_REF}@{DIGEST}"
AMD64 = "linux/amd64"


@pytest.fixture
def project(repo_with_clusters: Path) -> Path:
    return repo_with_clusters


def said() -> str:
    """How the recorded schema (of the project in the working directory) names itself."""
    path = Path.cwd() / "schemas/srt-slurm.schema.json"
    return f"srt-slurm v1.0.36's schema as its loader reads it ({path})"


def lock_with(**srt: Any) -> Lock:
    lock = load_lock(LOCK)
    assert lock.srt_slurm is not None
    return replace(lock, srt_slurm=replace(lock.srt_slurm, **srt))


def build(state: State, lock: Lock) -> None:
    """F built under this lock as IMAGE_ID."""
    spec = load_spec(IMAGES / f"{F}.toml", lock)
    write(state, Build(image_id=IMAGE_ID, reference=f"k3env/{F}:abc", twin=False),
          build_key(lock, spec, twin=False))  # fmt: skip


def pushed(state: State, lock: Lock, *, built: bool = True, image: str = F) -> None:
    """F built under this lock (``built``), pushed by digest, with verify's facts."""
    if built:
        build(state, lock)
    write(state, Pushed(image=image, image_id=IMAGE_ID, reference=f"{REGISTRY_REF}:abc",
                        digest=DIGEST, layers_sent=1, layers_skipped=0), IMAGE_ID)  # fmt: skip
    write(state, Facts(facts={"vllm": {"x": 1}}), IMAGE_ID)


def find(state: State, lock: Lock, container: str, base: str | None = None) -> ImageOf:
    return find_image(state, lock, IMAGES, container, base, AMD64)


# --- the image a recipe names ---------------------------------------------------------------------
def test_enroots_spelling_is_read_as_a_registry_reference() -> None:
    assert as_reference("docker://reg:5000#team/repo@sha256:1") == "reg:5000/team/repo@sha256:1"
    assert as_reference("docker://reg#a#b") == "reg/a#b"  # only the registry's separator
    assert as_reference("reg/repo:tag") == "reg/repo:tag"
    assert as_reference("docker://reg/repo:tag") == "reg/repo:tag"


def test_a_pushed_image_is_found_by_digest_by_tag_or_by_its_manifest(project: Path) -> None:
    state, lock = State(), load_lock(LOCK)
    assert not state.path("pushed").exists()
    assert find(state, lock, BY_DIGEST).known is False  # no records at all
    pushed(state, lock)
    spec = load_spec(IMAGES / f"{F}.toml", lock)
    image = find(state, lock, BY_DIGEST)
    assert image == ImageOf(container=BY_DIGEST, base="vllm-kimi-k3",
                            how=f"pushed by k3env as {BY_DIGEST}", known=True, spec=spec,
                            image_id=IMAGE_ID, facts={"vllm": {"x": 1}},
                            facts_source=f"{F} ({IMAGE_ID})")  # fmt: skip
    enroot = f"docker://127.0.0.1:5000#k3env/kimi-k3-direct-f@{DIGEST}"
    assert find(state, lock, enroot).how == f"pushed by k3env as {BY_DIGEST}"
    # enroot's URI with its user (docker://USER@REGISTRY#IMAGE): the manifest is still known.
    user = f"docker://me@127.0.0.1:5000#k3env/kimi-k3-direct-f@{DIGEST}"
    assert find(state, lock, user).how == f"manifest {DIGEST} that k3env pushed (as {BY_DIGEST})"
    by_tag = find(state, lock, f"{REGISTRY_REF}:abc")
    assert by_tag.how == (f"pushed by k3env as {REGISTRY_REF}:abc (by tag: the tag can move; "
                          f"name {BY_DIGEST})")  # fmt: skip
    assert by_tag.known and by_tag.image_id == IMAGE_ID
    manifest = f"manifest {DIGEST} that k3env pushed (as {BY_DIGEST})"
    assert find(state, lock, DIGEST).how == manifest
    assert find(state, lock, f"mirror.example/other@{DIGEST}").how == manifest
    assert find(state, lock, "mirror.example/other@sha256:" + "00" * 32).known is False
    assert find(state, lock, f"{REGISTRY_REF}:abd").known is False
    # --base wins over the spec's base.
    assert find(state, lock, BY_DIGEST, base="cpu-twin").base == "cpu-twin"
    # The image's base is its spec's, not the lock's first real base.
    first = replace(lock.bases["vllm-kimi-k3"], name="other", repository="example/other")
    other_first = replace(lock, bases={"other": first, **lock.bases})
    assert find(state, other_first, "/unknown.sqsh").base == "other"
    assert find(state, other_first, BY_DIGEST).base == "vllm-kimi-k3"
    # The spec is the one built for the cluster's platform: an amd64 build is not arm64's.
    assert find_image(state, lock, IMAGES, BY_DIGEST, None, "linux/arm64").spec is None
    write(state, Build(image_id=IMAGE_ID, reference="k3env/f:arm", twin=True),
          build_key(lock, spec, twin=True, platform="linux/arm64"))  # fmt: skip
    assert find_image(state, lock, IMAGES, BY_DIGEST, None, "linux/arm64").spec == spec


def test_a_record_not_of_its_kinds_shape_is_an_error_naming_it(project: Path) -> None:
    state, lock = State(), load_lock(LOCK)
    for doc, said in (
        ({"image": F, "image_id": IMAGE_ID, "digest": DIGEST}, "'reference' is missing"),
        (["not", "a", "record"], "a JSON array where a JSON object"),
    ):
        state.write_json(doc, "pushed", "0.json")
        with pytest.raises(StateError, match=said) as e:
            find(state, lock, BY_DIGEST)  # never passed over as no record
        assert e.value.where == str(state.path("pushed", "0.json"))
    pushed(state, lock)
    state.path("pushed", "0.json").unlink()
    state.write_json(["x"], "facts", IMAGE_ID.removeprefix("sha256:") + ".json")
    with pytest.raises(StateError, match="'facts' is a JSON array, not an object"):
        find(state, lock, BY_DIGEST)  # facts that are not a mapping: said, never skipped


def test_a_push_whose_spec_no_longer_builds_it_is_said(project: Path) -> None:
    state, lock = State(), load_lock(LOCK)
    pushed(state, lock, built=False)
    image = find(state, lock, BY_DIGEST)
    assert image.how == (
        f"pushed by k3env as {BY_DIGEST}; its spec {F} under this lock no longer builds it: its "
        "patches and env are not known from here"
    )
    assert image.spec is None and image.known and image.base == "vllm-kimi-k3"
    assert image.facts == {"vllm": {"x": 1}}
    # Another build of the spec (another image ID) is not this image's.
    spec = load_spec(IMAGES / f"{F}.toml", lock)
    write(state, Build(image_id="sha256:" + "99" * 32, reference="k3env/f:other", twin=False),
          build_key(lock, spec, twin=False))  # fmt: skip
    assert find(state, lock, BY_DIGEST).spec is None
    for name in ("", "no-such-spec"):  # a record naming no spec, or one not in images/
        pushed(state, lock, built=False, image=name)
        image = find(state, lock, BY_DIGEST)
        assert image.spec is None and image.how.endswith(
            f"; its spec {name} under this lock no longer builds it: its patches and env are "
            "not known from here"
        )


def test_an_export_is_found_by_its_path_or_by_an_sqsh_files_name(project: Path) -> None:
    state, lock = State(), load_lock(LOCK)
    build(state, lock)
    sqsh = "k3env+kimi-k3-direct-f+abc.sqsh"
    export = Exported(image=F, image_id=IMAGE_ID, sha256="0" * 64, path=f"out/{sqsh}", size=1,
                      mksquashfs="4.6.1", options=())  # fmt: skip
    write(state, export, IMAGE_ID)
    exact = find(state, lock, f"out/{sqsh}")
    assert exact.how == f"exported by k3env to out/{sqsh} (sha256 {'0' * 64})"
    assert exact.known and exact.image_id == IMAGE_ID and exact.spec is not None
    copy = find(state, lock, f"/lustre/containers/{sqsh}")
    assert copy.how == (
        f"by file name, the enroot image k3env exported to out/{sqsh} (sha256 {'0' * 64}): "
        f"check the cluster's copy with `k3env export --check /lustre/containers/{sqsh}`"
    )
    assert copy.known
    # Only an enroot image is matched by its file name, and only by the whole name.
    write(state, replace(export, path="out/image.tar"), IMAGE_ID)
    assert find(state, lock, "/lustre/containers/image.tar").known is False


def test_a_lock_base_is_named_by_its_tag_or_digests(project: Path) -> None:
    state, lock = State(), load_lock(LOCK)
    base = lock.bases["vllm-kimi-k3"]
    said = ("the lock's base vllm-kimi-k3 itself (docker.io/vllm/vllm-openai:kimi-k3): no k3env "
            "layer")  # fmt: skip
    for container in ("vllm/vllm-openai:kimi-k3", "docker.io/vllm/vllm-openai:kimi-k3",
                      "docker://docker.io#vllm/vllm-openai:kimi-k3"):  # fmt: skip
        image = find(state, lock, container)
        assert image == ImageOf(container=container, base="vllm-kimi-k3", how=said, known=False)
    assert find(state, lock, "vllm/vllm-openai:other").placed is False
    # Its digests (unresolved in the committed lock) name it once the lock pins them.
    index, amd, arm = ("sha256:" + c * 64 for c in "abc")
    assert find(state, lock, f"vllm/vllm-openai@{index}").placed is False
    resolved = replace(
        lock,
        bases={
            **lock.bases,
            "vllm-kimi-k3": replace(
                base, digest=index, platforms={AMD64: amd, "linux/arm64": arm, "linux/s390x": None}
            ),
        },
    )
    for d in (index, amd, arm):
        assert find(state, resolved, f"vllm/vllm-openai@{d}").how == said
    # A base without a tag is named by its digests only.
    untagged = replace(resolved, bases={"vllm-kimi-k3": replace(
        resolved.bases["vllm-kimi-k3"], tag=None)})  # fmt: skip
    assert find(state, untagged, "vllm/vllm-openai:None").placed is False
    assert find(state, untagged, f"vllm/vllm-openai@{amd}").base == "vllm-kimi-k3"
    assert find(state, untagged, f"vllm/vllm-openai@{amd}").placed is True


def test_a_twin_or_a_base_without_a_repository_is_never_the_container(project: Path) -> None:
    state, lock = State(), load_lock(LOCK)
    base = lock.bases["vllm-kimi-k3"]
    twin = replace(base, name="twin", kind="twin")
    nameless = replace(base, name="nameless", repository=None)
    for bases in (
        {"twin": twin, "vllm-kimi-k3": base},
        {"nameless": nameless, "vllm-kimi-k3": base},
    ):
        image = find(state, replace(lock, bases=bases), "vllm/vllm-openai:kimi-k3")
        assert image.base == "vllm-kimi-k3" and image.placed
        assert image.how.startswith("the lock's base vllm-kimi-k3 itself")
    # The first real base (not a twin) is what an unknown container is mapped over.
    image = find(state, replace(lock, bases={"twin": twin, "nameless": nameless}), "x/y:z")
    assert image.base == "nameless" and image.placed is False
    with pytest.raises(ConfigError) as e:
        find(state, replace(lock, bases={"twin": twin}), "x/y:z")
    assert e.value.message == "the lock pins no base image"
    assert e.value.where == str(LOCK) and e.value.fix == "add [bases.NAME]"


def test_an_unknown_container_is_judged_as_the_base_named_or_not_at_all(project: Path) -> None:
    state, lock = State(), load_lock(LOCK)
    unknown = find(state, lock, "/shared/someones.sqsh")
    assert unknown == ImageOf(
        container="/shared/someones.sqsh",
        base="vllm-kimi-k3",
        how="an image k3env cannot place: not pushed or exported by k3env (no record on this "
        "host) and not a lock base; what it carries is not checked (`--base NAME` to judge it "
        "as that base)",
        known=False,
        placed=False,
    )
    named = find(state, lock, "/shared/someones.sqsh", base="cpu-twin")
    assert named == ImageOf(
        container="/shared/someones.sqsh",
        base="cpu-twin",
        how="not an image k3env pushed or exported (no record on this host): judged as lock "
        "base cpu-twin (--base)",
        known=False,
    )
    # The lock's base itself, with --base naming it or another.
    said = find(state, lock, "vllm/vllm-openai:kimi-k3", base="vllm-kimi-k3")
    assert said.how.startswith("the lock's base vllm-kimi-k3 itself") and said.placed
    other = find(state, lock, "vllm/vllm-openai:kimi-k3", base="cpu-twin")
    assert other.base == "cpu-twin" and other.how.endswith("judged as lock base cpu-twin (--base)")


def test_each_alias_of_a_cluster_config_is_found(project: Path) -> None:
    state, lock = State(), load_lock(LOCK)
    pushed(state, lock)
    aliases = {"mine": BY_DIGEST, "vendor": "vllm/vllm-openai:kimi-k3"}
    found = list(containers_of(state, lock, IMAGES, aliases, AMD64))
    assert [(a, v, i.known, i.container) for a, v, i in found] == [
        ("mine", BY_DIGEST, True, BY_DIGEST),
        ("vendor", "vllm/vllm-openai:kimi-k3", False, "vllm/vllm-openai:kimi-k3"),
    ]
    assert found[0][2].base == "vllm-kimi-k3" and found[1][2].placed
    assert found[0][2].spec is not None and found[0][2].spec.name == F  # the amd64 build's
    (arm,) = containers_of(state, lock, IMAGES, {"mine": BY_DIGEST}, "linux/arm64")
    assert arm[2].known and arm[2].spec is None  # no arm64 build of it


# --- srt-slurm's recorded schema and a cluster's srtslurm.yaml ------------------------------------
def test_the_recorded_schema_is_the_pinned_srt_slurms_or_none_said_why(project: Path) -> None:
    schema, why = recorded_schema(load_lock(LOCK))
    assert schema is not None and why == "" and schema.said() == said()
    lock = load_lock(LOCK)
    no_srt = replace(lock, srt_slurm=None)
    none = f"the lock records no srt-slurm schema ({LOCK} [srt_slurm] schema)"
    assert recorded_schema(no_srt) == (None, none)
    assert recorded_schema(lock_with(schema=None)) == (None, none)
    assert recorded_schema(lock_with(version="v1.0.49")) == (None, (
        "schemas/srt-slurm.schema.json was recorded from srt-slurm v1.0.36 (cb651682117d), not "
        "the pinned v1.0.49 and its patches: run `k3env srt schema`"))  # fmt: skip


def test_a_recorded_schema_that_is_not_the_pinned_file_is_refused(project: Path) -> None:
    from k3env.errors import LockError

    schema = project / "schemas/srt-slurm.schema.json"
    pinned = load_lock(LOCK)
    assert pinned.srt_slurm is not None
    schema.write_text(schema.read_text() + " ")
    with pytest.raises(LockError) as e:
        recorded_schema(pinned)
    assert e.value.message.startswith(
        "srt-slurm schema schemas/srt-slurm.schema.json has sha256 "
    ) and e.value.message.endswith(f", the lock pins {pinned.srt_slurm.schema_sha256}")
    assert e.value.where == f"{LOCK}: srt_slurm.schema_sha256"
    schema.unlink()
    with pytest.raises(LockError) as e:
        recorded_schema(pinned)
    assert e.value.message == "srt-slurm schema schemas/srt-slurm.schema.json is missing"
    assert e.value.where == f"{LOCK}: srt_slurm.schema"


SRTSLURM = 'default_account: "gpu"\ncontainers:\n  kimi-k3: "vllm/vllm-openai:kimi-k3"\n'


def test_a_cluster_config_is_checked_key_by_key_or_said_unchecked(project: Path) -> None:
    cfg = project / "srtslurm.yaml"
    cfg.write_text(SRTSLURM)
    lock, SCHEMA = load_lock(LOCK), said()
    assert check_cluster_config(load_yaml(cfg), lock) == f"every key and type is one {SCHEMA} takes"
    assert check_cluster_config(load_yaml(cfg), replace(lock, srt_slurm=None)) == (
        f"keys not checked: the lock records no srt-slurm schema ({LOCK} [srt_slurm] schema)"
    )
    cfg.write_text(SRTSLURM + "colour: blue\ngpus_per_node: many\n")
    with pytest.raises(ConfigError) as e:
        check_cluster_config(load_yaml(cfg), lock)
    assert e.value.message == (
        f"2 refusal(s) by {SCHEMA}: colour (line 4): Unknown field., gpus_per_node (line 5): Not "
        "a valid integer.. srt-slurm would only log a warning and then ignore the whole file "
        "(every default and alias in it)"
    )
    assert e.value.where == f"{cfg}:4: colour"
    schema = recorded_schema(lock)[0]
    assert schema is not None
    fields = ", ".join(sorted(schema.cluster["fields"]))
    assert e.value.fix == f"remove or fix each; the keys it takes: {fields}"
    assert e.value.fix.startswith("remove or fix each; the keys it takes: cloud, cluster, ")


def test_a_refused_key_the_file_does_not_have_is_named_without_a_line(project: Path) -> None:
    """A field the schema requires and the file lacks has no line to point at."""
    import json

    from k3env.hashing import file_sha256

    path = project / "schemas/srt-slurm.schema.json"
    doc = json.loads(path.read_text())
    doc["cluster"]["fields"]["default_partition"]["required"] = True
    path.write_text(json.dumps(doc))
    lock = lock_with(schema_sha256=file_sha256(path))
    cfg = project / "srtslurm.yaml"
    cfg.write_text(SRTSLURM + "colour: blue\n")
    with pytest.raises(ConfigError) as e:
        check_cluster_config(load_yaml(cfg), lock)
    assert e.value.message.startswith(
        f"2 refusal(s) by {said()}: colour (line 4): Unknown field., default_partition: Missing "
        "data for required field.. srt-slurm would only log"
    )


# --- srt-slurm's loader, as one gate --------------------------------------------------------------
def test_a_loader_is_one_gate_named_srt_slurm() -> None:
    loader = Loader.of("failed", "why", (("k", "m", "load"),))
    assert loader.gate.name == LOADER_GATE == "srt-slurm"
    assert (loader.verdict, loader.detail, loader.errors) == (
        "failed",
        "why",
        (("k", "m", "load"),),
    )
    assert loader.gate.as_json() == {"gate": "srt-slurm", "status": "failed", "seconds": 0.0,
                                     "detail": "why"}  # fmt: skip
    assert Loader.of("passed", "ok").errors == ()


def recipes(project: Path) -> tuple[Path, Path]:
    good, bad = project / "d.yaml", project / "bad.yaml"
    shutil.copy(RECIPES / "d.yaml", good)
    bad.write_text((RECIPES / "d.yaml").read_text() + "colour: blue\nslurm:\n  nodes: two\n")
    return good, bad


def loaders(lock: Lock, paths: Iterable[Path]) -> dict[Path, tuple[str, str, tuple[Any, ...]]]:
    out = srt_loader(lock, State(), Log(quiet=True), list(paths))
    return {p: (v.verdict, v.detail, v.errors) for p, v in out.items()}


def test_where_srt_slurm_is_not_materialized_its_schema_judges_and_never_passes(
    project: Path,
) -> None:
    good, bad = recipes(project)
    lock, SCHEMA = load_lock(LOCK), said()
    why = ("the pinned srt-slurm v1.0.36 is not materialized on this host (run `k3env srt "
           "materialize`)")  # fmt: skip
    assert loaders(lock, [good, bad]) == {
        good: ("not checked", f"keys and types as {SCHEMA}; its loader's own checks, lookups "
               f"and dry-run not run: {why}", ()),
        bad: ("failed", f"{SCHEMA}; {why}", (("colour", "Unknown field.", "schema"),
                                             ("slurm.nodes", "Unknown field.", "schema"))),
    }  # fmt: skip
    # Without a recorded schema, nothing of it is checked, and both reasons are said.
    unrecorded = f"the lock records no srt-slurm schema ({LOCK} [srt_slurm] schema)"
    assert loaders(lock_with(schema=None), [bad]) == {
        bad: ("not checked", f"{why}; {unrecorded}", ())
    }
    assert loaders(replace(lock, srt_slurm=None), [good, bad]) == {
        p: ("not checked", f"the lock pins no srt-slurm ({LOCK}); {unrecorded}", ())
        for p in (good, bad)
    }
    assert loaders(lock, []) == {}
    # Another pin's srt-slurm materialized here is not this one.
    State().path("srt", "0" * 20).mkdir(parents=True)
    assert loaders(lock, [good])[good][0] == "not checked"


def test_unresolved_patches_are_named_as_why_it_cannot_be_materialized(project: Path) -> None:
    good, _ = recipes(project)
    lock = load_lock(LOCK)
    assert lock.srt_slurm is not None
    first, second = lock.srt_slurm.patches
    unresolved = lock_with(patches=(first, replace(second, sha256=None)))
    (verdict, detail, errors) = loaders(unresolved, [good])[good]
    # The schema's identity names the patches: the recorded one is not this pin's.
    assert (verdict, errors) == ("not checked", ())
    assert detail.startswith(
        "the pinned srt-slurm v1.0.36 cannot be materialized here: patch(es) ['direct vllm "
        "frontend: vLLM-native multi-node serve'] unresolved (see docs/recipes.md: srt-slurm "
        "against the real upstream); schemas/srt-slurm.schema.json was recorded from"
    )
    both = lock_with(patches=(replace(first, sha256=None), replace(second, sha256=None)))
    assert "patch(es) ['PR #278', 'direct vllm" in loaders(both, [good])[good][1]


def test_where_srt_slurm_is_materialized_its_loader_decides_pass_or_fail(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from k3env.srt import materialize as srt
    from k3env.srt import validate as srt_validate

    good, bad = recipes(project)
    lock = load_lock(LOCK)
    assert lock.srt_slurm is not None
    State().path("srt", srt.cache_key(lock.srt_slurm)[:20]).mkdir(parents=True)
    asked: list[Any] = []
    m = SimpleNamespace(version="v1.0.36", patches=("PR #278", "multi-node"))

    def materialize(lock: Lock, state: State, log: Log) -> SimpleNamespace:
        asked.append((lock, state, log))
        return m

    monkeypatch.setattr(srt, "materialize", materialize)
    found = [
        RecipeError(file=str(bad.resolve()), key="colour", message="Unknown field."),
        RecipeError(file=str(bad.resolve()), key="", message="no run", stage="dry-run"),
    ]
    validation = Validation(errors=found, not_checked=["benchmark runner", "frontend"])

    def validate(m_: object, paths: list[Path], log: Log) -> Validation:
        asked.append((m_, paths, log))
        return validation

    monkeypatch.setattr(srt_validate, "validate", validate)
    what = ("srt-slurm v1.0.36 + ['PR #278', 'multi-node']; not checked: benchmark runner; not "
            "checked: frontend")  # fmt: skip
    log = Log(quiet=True)
    verdicts = srt_loader(lock, State(), log, [good, bad])
    assert {p: (v.verdict, v.detail, v.errors) for p, v in verdicts.items()} == {
        good: ("passed", what, ()),
        bad: ("failed", what, (("colour", "Unknown field.", "load"), ("", "no run", "dry-run"))),
    }
    (lock_asked, state_asked, log_asked), validated = asked
    assert lock_asked is lock and state_asked.root == State().root and log_asked is log
    assert validated == (m, [good, bad], log)
    validation.not_checked.clear()
    assert loaders(lock, [good])[good] == ("passed", "srt-slurm v1.0.36 + ['PR #278', "
                                           "'multi-node']", ())  # fmt: skip


# --- one recipe -----------------------------------------------------------------------------------
def checked(
    project: Path, loader: Loader, rules: Iterable[Any], name: str = "d.yaml"
) -> tuple[Any, Path]:
    path = project / name
    if not path.exists():
        shutil.copy(RECIPES / name, path)
    recipe, lock = load_recipe(path), load_lock(LOCK)
    image = find(State(), lock, recipe.container)
    cluster = load_cluster(CLUSTER)
    return check_recipe(recipe, lock, cluster, image, list(rules), loader), path


def test_the_loaders_errors_are_findings_on_the_recipes_keys_and_lines(project: Path) -> None:
    errors = (("benchmark.aiperf_package", "Unknown field.", "load"),
              ("", "srtctl.core.config: ImportError", "load"),
              ("backend.vllm_config", "not rendered", "dry-run"))  # fmt: skip
    loader = Loader.of("failed", "srt-slurm v1.0.36", errors)
    result, path = checked(project, loader, [])
    assert [f.as_json() for f in result.findings] == [
        Finding(rule=LOADER_RULE, severity="error", image="vllm/vllm-openai:kimi-k3",
                profile="kimi-k3-d-agg", file=str(path), line=line, key=key,
                message=f"srt-slurm's {stage} (srt-slurm v1.0.36): {message}",
                fix="fix the key as srt-slurm's own message says").as_json()
        for key, line, message, stage in [
            ("(recipe)", None, "srtctl.core.config: ImportError", "load"),
            ("backend.vllm_config", line_of(path, "vllm_config:"), "not rendered", "dry-run"),
            ("benchmark.aiperf_package", line_of(path, "aiperf_package:"), "Unknown field.",
             "load"),
        ]
    ]  # fmt: skip
    assert (result.errors, result.warnings) == (3, 0) and result.lacked == ()
    assert LOADER_RULE == "SRT-LOADER"


def test_a_recipes_findings_sort_errors_first_then_file_line_key_rule(project: Path) -> None:
    lock_file = str(LOCK)
    rules = [
        FakeRule(id="R-B", hits=(Hit(key="benchmark.type", message="b"),
                             Hit(key="name", message="n"),
                             Hit(key="srt_slurm.patches[0]", message="l", file=lock_file))),
        FakeRule(id="R-A", hits=(Hit(key="benchmark.type", message="a"),
                             Hit(key="benchmark", message="x", severity="error"),
                             Hit(key="model.path", message="p", severity="error"))),
    ]  # fmt: skip
    loader = Loader.of("failed", "srt", (("resources.gpu_type", "bad", "load"),))
    result, path = checked(project, loader, rules)
    got = [(f.severity, f.file, f.line, f.key, f.rule) for f in result.findings]
    assert str(path) < lock_file  # an absolute path sorts before the lock's relative one
    assert got == [
        ("error", str(path), line_of(path, "path:"), "model.path", "R-A"),
        ("error", str(path), line_of(path, "gpu_type:"), "resources.gpu_type", LOADER_RULE),
        ("error", str(path), line_of(path, "benchmark:"), "benchmark", "R-A"),
        ("warning", str(path), line_of(path, "name:"), "name", "R-B"),
        ("warning", str(path), line_of(path, "type: mooncake"), "benchmark.type", "R-A"),
        ("warning", str(path), line_of(path, "type: mooncake"), "benchmark.type", "R-B"),
        ("warning", lock_file, None, "srt_slurm.patches[0]", "R-B"),
    ]
    assert (result.errors, result.warnings) == (3, 4)


def test_a_finding_without_a_line_comes_before_the_recipes_first_line(project: Path) -> None:
    bare = project / "bare.yaml"  # d.yaml without its comment header: name: on line 1
    bare.write_text("name:" + (RECIPES / "d.yaml").read_text().split("name:", 1)[1])
    rules = [
        FakeRule(
            id="R",
            hits=(
                Hit(key="name", message="m", severity="error"),
                Hit(key="slurm.time_limit", message="m", severity="error"),
            ),
        )
    ]
    result = checked(project, Loader.of("not checked", "n"), rules, name="bare.yaml")[0]
    assert [(f.line, f.key) for f in result.findings] == [(None, "slurm.time_limit"), (1, "name")]


def test_a_dropped_patch_on_a_recipe_says_to_run_an_image_that_carries_it(project: Path) -> None:
    rules = [FakeRule(id="K3-P", hits=(Hit(key="patches", message="dropped", fix="spec fix"),
                                   Hit(key="patches", message="lock's", fix="lock fix",
                                       file=str(LOCK))))]  # fmt: skip
    result, path = checked(project, Loader.of("not checked", "n"), rules)
    on_recipe, on_lock = result.findings
    # A key of the lock is never pointed at the recipe's line of the same name.
    named = [FakeRule(id="K3-N", hits=(Hit(key="name", message="m", file=str(LOCK)),))]
    (lock_name,) = checked(project, Loader.of("not checked", "n"), named)[0].findings
    assert (lock_name.file, lock_name.key, lock_name.line) == (str(LOCK), "name", None)
    assert (on_lock.file, on_lock.key, on_lock.line, on_lock.fix) == (
        str(LOCK), "patches", None, "lock fix"
    )  # fmt: skip
    assert (on_recipe.key, on_recipe.line) == ("model.container", line_of(path, "container:"))
    assert on_recipe.fix == (
        f"run an image that carries it: `k3env adopt {path}` (the spec bakes the lock's "
        "patches), build and push it, and name its digest in model.container"
    )


def test_a_model_type_given_is_taken_not_guessed(project: Path) -> None:
    path = project / "d.yaml"
    shutil.copy(RECIPES / "d.yaml", path)
    recipe, lock = load_recipe(path), load_lock(LOCK)
    image, cluster = find(State(), lock, recipe.container), load_cluster(CLUSTER)
    loader = Loader.of("not checked", "n")
    guessed = check_recipe(recipe, lock, cluster, image, [], loader)
    assert guessed.notes == (
        "tokenizer model_type 'kimi_k3' taken from backend.vllm_config.aggregated."
        "tool-call-parser (the model's config.json is on the cluster; --model-type to say "
        "otherwise)",
    )
    given = check_recipe(recipe, lock, cluster, image, [], loader, model_type="kimi_k3")
    assert given.notes == () and given.loader is loader and given.recipe is recipe
    assert given.image is image and given.env == guessed.env and given.findings == ()


def test_a_recipe_result_says_everything_in_its_json(project: Path) -> None:
    loader = Loader.of("not checked", "not materialized")
    result, path = checked(project, loader, [*RULES, FakeRule(id="R-LACK", lacks=("x.y", "a.b"))])
    out = result.as_json()
    assert list(out) == ["recipe", "name", "image", "findings", "env", "env_changed", "notes",
                         "srt_slurm_loader", "lacked_facts", "not_checked", "errors",
                         "warnings"]  # fmt: skip
    assert out["recipe"] == str(path) and out["name"] == "kimi-k3-d-agg"
    assert list(out["image"]) == ["container", "base", "how", "known", "image_id",
                                  "facts_source", "placed", "spec"]  # fmt: skip
    assert out["image"] == {
        "container": "vllm/vllm-openai:kimi-k3", "base": "vllm-kimi-k3",
        "how": "the lock's base vllm-kimi-k3 itself (docker.io/vllm/vllm-openai:kimi-k3): no "
        "k3env layer", "known": False, "image_id": None, "facts_source": None, "placed": True,
        "spec": None,
    }  # fmt: skip
    assert out["findings"] == [f.as_json() for f in result.findings]
    # By line on the recipe (its key sorts after), then the lock's own key (no line).
    assert [(f["rule"], f["severity"], f["key"], f["line"]) for f in out["findings"]] == [
        ("K3-DROPPED-PATCH", "warning", "model.container", 7),
        ("K3-ALLOC-FRAGMENTATION", "warning",
         "backend.aggregated_environment.PYTORCH_CUDA_ALLOC_CONF", 19),
        ("K3-IMAGE-PLATFORM", "warning", "bases.vllm-kimi-k3.platforms.linux/amd64", None),
    ]  # fmt: skip
    assert out["env"] == [e.as_json() for e in result.env] and out["env"]
    assert out["env_changed"] == [] and out["notes"] == list(result.notes) and out["notes"]
    assert out["srt_slurm_loader"] == {"gate": "srt-slurm", "status": "not checked",
                                       "seconds": 0.0, "detail": "not materialized"}  # fmt: skip
    assert out["lacked_facts"] == ["a.b", "x.y"] and result.lacked == ("a.b", "x.y")
    # ... and what each rule could not check, by rule (R-LACK's facts among them).
    assert out["not_checked"] == [n.as_json() for n in result.not_checked]
    assert {"rule": "R-LACK", "what": "with verify's fact(s) a.b, x.y of this image",
            "why": "no verify record of this image has them; the rule went on with the lock's "
            "versions and k3env's recorded tables (a warning where those say nothing)",
            } in out["not_checked"]  # fmt: skip
    assert (out["errors"], out["warnings"]) == (result.errors, result.warnings) == (0, 3)
    # A spec the image was built from is named by its name.
    spec = load_spec(IMAGES / f"{F}.toml", load_lock(LOCK))
    named = replace(result, image=replace(result.image, spec=spec, facts={"a": 1}))
    assert named.as_json()["image"]["spec"] == F and "facts" not in named.as_json()["image"]
