"""The lockfile (``pins/*.lock.toml``): read, validate, and check against the files it pins.

Parsed at the edge into frozen dataclasses; nothing past this module sees a TOML table.
Editing the lock in place is ``lock_edit``'s job.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from k3env.config.reader import (
    COMMIT_RE,
    DIGEST_RE,
    SHA256_RE,
    Table,
    each_entry,
    env_table,
    load_toml,
)
from k3env.config.secrets import refuse_credentials
from k3env.config.shapes import (
    DEFAULT_RELEASE_TAG_RE,
    GIT_FIX,
    REF_RE,
    REPOSITORY_FIX,
    REPOSITORY_RE,
    TAG_FIX,
    TAG_RE,
    is_git_source,
    is_normal_absolute_path,
)
from k3env.errors import LockError
from k3env.hashing import canonical_sha256, file_sha256

LOCK_VERSION = 1
# Where a container patch with a `path` target may write, unless the lock says otherwise:
# Python's install trees (a `module` target is found on the image's own sys.path instead).
DEFAULT_PATCH_ROOTS = ("/usr/lib/python3", "/usr/local/lib/python3", "/opt", "/workspace")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
REGISTRY_RE = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]+)?$")
DEFAULT_LOCK = Path("pins/k3.lock.toml")

_SHA_FIX = 'write the 64-hex sha256 of the file (`sha256sum FILE`), or "unresolved"'
_DIGEST_FIX = 'write "sha256:" + 64 hex digits (`skopeo inspect docker://REF`), or "unresolved"'
_COMMIT_FIX = "write the full 40-hex commit id (`git rev-parse TAG^{commit}`)"


@dataclass(frozen=True, kw_only=True)
class BasePin:
    name: str
    kind: str  # "registry" (pulled by digest) or "twin" (built locally by k3env)
    repository: str | None
    tag: str | None
    digest: str | None  # None: unresolved
    python: str
    twin: str | None
    env: Mapping[str, str] = field(default_factory=dict)  # baked into images on this base

    @property
    def display(self) -> str:
        if self.kind == "twin":
            return f"{self.name} (CPU twin, built locally)"
        return f"{self.repository}:{self.tag}"

    @property
    def pull_reference(self) -> str | None:
        """``repository@digest``: the only way k3env pulls a registry base."""
        if self.digest is None or self.repository is None:
            return None
        return f"{self.repository}@{self.digest}"


@dataclass(frozen=True, kw_only=True)
class TwinPin:
    debian_suite: str
    debian_mirror: str
    debian_packages: tuple[str, ...]
    requirements: str
    requirements_sha256: str | None
    registry: str
    repository: str
    # What `k3env twin --resolve` resolves the requirements from (with every component's
    # pinned wheels and extras): top-level requirements, the CPU stand-ins among them (their
    # GPU pins are overridden, and requirements on them waived in the twin), and what is
    # left out (never installed; requirements on them waived in the twin).
    requires: tuple[str, ...] = ()
    stand_ins: tuple[str, ...] = ()
    omit: tuple[str, ...] = ()
    # Only releases uploaded before this instant take part in the resolution (uv
    # --exclude-newer): the same lock resolves to the same file on any day.
    resolved_before: str | None = None

    def waivers(self) -> dict[str, str]:
        """Distribution -> why the twin does not hold a requirement on it against an image."""
        from k3env.versions import canonical_name

        out = {canonical_name(n): "left out of the CPU twin ([twin].omit)" for n in self.omit}
        for n in self.stand_ins:
            out[canonical_name(n)] = "a CPU stand-in in the twin ([twin].stand_ins)"
        return out


@dataclass(frozen=True, kw_only=True)
class WheelPin:
    """One wheel file, by distribution name, version and the sha256 of the file."""

    name: str
    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        """A hash-checking pip requirement line."""
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


@dataclass(frozen=True, kw_only=True)
class ComponentPin:
    """A pinned Python component that images can carry (``components = [...]`` in a spec):
    its wheels, installed ``--no-deps --require-hashes`` into one deterministic layer, and
    the extras in use (their ``Requires-Dist`` must hold in the image too)."""

    name: str  # the lock section: "dynamo", "aiperf"
    wheels: tuple[WheelPin, ...]
    extras: tuple[str, ...]  # extras of the first wheel in use (ai-dynamo[vllm])

    @property
    def identity(self) -> list[dict[str, str]]:
        return [{"name": w.name, "version": w.version, "sha256": w.sha256} for w in self.wheels]


@dataclass(frozen=True, kw_only=True)
class VariantPin:
    """Other releases of pinned components, to verify against on the twin (``k3env matrix``)."""

    name: str
    why: str
    components: Mapping[str, ComponentPin]


@dataclass(frozen=True, kw_only=True)
class DynamoPin:
    name: str
    version: str | None  # PEP 440 form of the tag, for version-dependent rules
    git: str
    commit: str | None  # None: unresolved (the release's wheels are pinned, its commit not yet)
    component: ComponentPin | None = None


@dataclass(frozen=True, kw_only=True)
class SrtPatchPin:
    index: int
    pr: int | None
    title: str
    file: str
    range: str | None
    sha256: str | None
    provides: tuple[str, ...]
    why: str

    @property
    def label(self) -> str:
        """How reports name the patch: its PR number, else its title."""
        return f"PR #{self.pr}" if self.pr else self.title


@dataclass(frozen=True, kw_only=True)
class SrtSlurmPin:
    git: str
    version: str
    commit: str
    patches: tuple[SrtPatchPin, ...]


@dataclass(frozen=True, kw_only=True)
class ContainerPatchPin:
    name: str
    file: str
    sha256: str
    module: str | None
    path: str | None
    bases: tuple[str, ...]
    expects: str
    why: str

    @property
    def target(self) -> str:
        return f"module {self.module}" if self.module else f"path {self.path}"


@dataclass(frozen=True, kw_only=True)
class AiperfPin:
    name: str
    version: str
    component: ComponentPin | None = None


@dataclass(frozen=True, kw_only=True)
class Unresolved:
    key: str
    hint: str


@dataclass(frozen=True, kw_only=True)
class Lock:
    path: Path
    root: Path  # paths in the lock are relative to the repository root (the parent of pins/)
    version: int
    sha256: str  # canonical hash of the parsed content
    env: Mapping[str, str]
    bases: Mapping[str, BasePin]
    twin: TwinPin | None
    dynamo: DynamoPin | None
    srt_slurm: SrtSlurmPin | None
    container_patches: Mapping[str, ContainerPatchPin]
    aiperf: AiperfPin | None
    unresolved: tuple[Unresolved, ...] = field(default=())
    variants: Mapping[str, VariantPin] = field(default_factory=dict)
    # Credential-looking names the lock's [env] / [bases.NAME.env] set deliberately.
    allow_credentials: tuple[str, ...] = field(default=())

    def base(self, name: str, where: str) -> BasePin:
        try:
            return self.bases[name]
        except KeyError:
            raise LockError(
                f"base {name!r} is not pinned in {self.path}",
                where=where,
                fix=f"use one of {sorted(self.bases)} or add [bases.{name}] to the lock",
            ) from None

    def resolve_path(self, relative: str) -> Path:
        return (self.root / relative).resolve()

    def with_variant(self, variant: VariantPin) -> Lock:
        """This lock with the variant's component wheels in place of the pinned ones. Its
        content hash is its own, so nothing built from it is taken for the lock's images."""
        dynamo, aiperf = self.dynamo, self.aiperf
        for name, component in variant.components.items():
            version = component.wheels[0].version
            if name == "dynamo" and dynamo is not None:
                dynamo = dataclasses.replace(dynamo, component=component, version=version)
            elif name == "aiperf" and aiperf is not None:
                aiperf = dataclasses.replace(aiperf, component=component, version=version)
        sha = canonical_sha256(
            {
                "lock": self.sha256,
                "variant": variant.name,
                "components": {n: c.identity for n, c in sorted(variant.components.items())},
            }
        )
        return dataclasses.replace(self, dynamo=dynamo, aiperf=aiperf, sha256=sha)

    @property
    def components(self) -> dict[str, ComponentPin]:
        """The pins an image spec can bake (``components = [...]``), by lock section."""
        out = {}
        for pin in (self.dynamo, self.aiperf):
            if pin is not None and pin.component is not None:
                out[pin.component.name] = pin.component
        return out

    def pins_summary(self) -> dict[str, str]:
        """Flat ``pin -> identity`` map, for image labels and reports."""
        out: dict[str, str] = {}
        for b in self.bases.values():
            if b.kind == "registry":
                out[f"base.{b.name}"] = f"{b.repository}:{b.tag}@{b.digest or 'unresolved'}"
        if self.dynamo:
            out["dynamo"] = f"{self.dynamo.name}@{self.dynamo.commit or 'unresolved'}"
        if self.srt_slurm:
            s = self.srt_slurm
            out["srt-slurm"] = f"{s.version}@{s.commit}"
            for p in s.patches:
                label = f"pr{p.pr}" if p.pr else f"patch{p.index}"
                out[f"srt-slurm.{label}"] = p.sha256 or "unresolved"
        for cp in self.container_patches.values():
            out[f"patch.{cp.name}"] = cp.sha256
        if self.aiperf:
            out["aiperf"] = self.aiperf.version
        for c in self.components.values():
            for w in c.wheels:
                out[f"wheel.{w.name}"] = f"{w.version}@sha256:{w.sha256}"
        return out


def load_lock(path: Path) -> Lock:
    data = load_toml(path, LockError)
    top = Table(data, file=path, path="", error=LockError)
    version = top.integer("version")
    if version != LOCK_VERSION:
        raise top.fail(
            "version",
            f"lock version {version} is not supported by this k3env (it reads {LOCK_VERSION})",
            "upgrade k3env, or regenerate the lock with this version",
        )
    unresolved: list[Unresolved] = []
    root = path.resolve().parent.parent if path.resolve().parent.name == "pins" else Path.cwd()

    allow = top.str_list("allow_credentials")
    env_t = top.table("env", required=False)
    env = env_table(env_t)
    refuse_credentials(env_t, env, allow)
    bases = each_entry(top.table("bases"), lambda n, t: _base(n, t, unresolved, allow))
    for b in bases.values():
        if b.twin is not None and (b.twin not in bases or bases[b.twin].kind != "twin"):
            raise top.fail(
                f"bases.{b.name}.twin",
                f"{b.twin!r} is not a twin base in this lock",
                'name a [bases.NAME] with kind = "twin"',
            )
    twin = _twin(top.table("twin"), unresolved) if top.has("twin") else None
    if any(b.kind == "twin" for b in bases.values()) and twin is None:
        raise top.fail("twin", "a twin base is pinned but [twin] is missing", "add [twin]")
    dynamo = _dynamo(top.table("dynamo"), unresolved) if top.has("dynamo") else None
    srt = _srt(top.table("srt_slurm"), unresolved) if top.has("srt_slurm") else None
    roots = top.str_list("patch_roots") or DEFAULT_PATCH_ROOTS
    for i, r in enumerate(roots):
        if not is_normal_absolute_path(r):
            raise top.fail(f"patch_roots[{i}]", f"{r!r} is not a directory below /", "fix it")
    patches = each_entry(
        top.table("container_patches", required=False),
        lambda n, t: _container_patch(n, t, bases, roots),
    )
    aiperf = _aiperf(top.table("aiperf")) if top.has("aiperf") else None
    pinned = {p.component.name: p.component for p in (dynamo, aiperf) if p and p.component}
    variants = each_entry(
        top.table("variants", required=False), lambda n, t: _variant(n, t, pinned)
    )
    top.done()
    return Lock(
        path=path,
        root=root,
        version=version,
        sha256=canonical_sha256(data),
        env=env,
        bases=bases,
        twin=twin,
        dynamo=dynamo,
        srt_slurm=srt,
        container_patches=patches,
        aiperf=aiperf,
        unresolved=tuple(unresolved),
        variants=variants,
        allow_credentials=allow,
    )


def _base(name: str, t: Table, unresolved: list[Unresolved], allow: tuple[str, ...]) -> BasePin:
    kind = t.string("kind", required=False, default="registry")
    if kind not in ("registry", "twin"):
        raise t.fail("kind", f"unknown base kind {kind!r}", 'use "registry" or "twin"')
    python = t.string("python", required=False, default="python3")
    if not python.startswith("/") and not re.match(r"^[A-Za-z0-9._-]+$", python):
        raise t.fail("python", f"{python!r} is not an interpreter name or path", 'e.g. "python3"')
    env_t = t.table("env", required=False)
    env = env_table(env_t)
    refuse_credentials(env_t, env, allow)
    if kind == "twin":
        t.done()
        return BasePin(
            name=name,
            kind=kind,
            repository=None,
            tag=None,
            digest=None,
            python=python,
            twin=None,
            env=env,
        )
    repository = str(t.matching("repository", REPOSITORY_RE, REPOSITORY_FIX))
    tag = str(t.matching("tag", TAG_RE, TAG_FIX))
    digest = t.matching("digest", DIGEST_RE, _DIGEST_FIX, allow_unresolved=True)
    if digest is None:
        unresolved.append(
            Unresolved(
                key=f"bases.{name}.digest",
                hint=f"skopeo inspect docker://{repository}:{tag} --format '{{{{.Digest}}}}'",
            )
        )
    twin = t.string("twin", required=False)
    t.done()
    return BasePin(
        name=name,
        kind=kind,
        repository=repository,
        tag=tag,
        digest=digest,
        python=python,
        twin=twin,
        env=env,
    )


def _twin(t: Table, unresolved: list[Unresolved]) -> TwinPin:
    sha = t.matching("requirements_sha256", SHA256_RE, _SHA_FIX, allow_unresolved=True)
    req = t.string("requirements")
    if sha is None:
        unresolved.append(
            Unresolved(key="twin.requirements_sha256", hint=f"k3env lock --update-hashes ({req})")
        )
    pin = TwinPin(
        debian_suite=t.string("debian_suite"),
        debian_mirror=t.string("debian_mirror"),
        debian_packages=t.str_list("debian_packages"),
        requirements=req,
        requirements_sha256=sha,
        registry=str(t.matching("registry", REGISTRY_RE, "write HOST:PORT, e.g. 127.0.0.1:5000")),
        repository=str(t.matching("repository", REPOSITORY_RE, REPOSITORY_FIX)),
        requires=t.str_list("requires"),
        stand_ins=t.str_list("stand_ins"),
        omit=t.str_list("omit"),
        resolved_before=t.matching(
            "resolved_before",
            re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$"),
            'write a UTC instant, e.g. "2026-11-30T00:00:00Z"',
            required=False,
        ),
    )
    from k3env.versions import requirement_name

    for key in ("requires", "omit", "stand_ins"):
        for i, line in enumerate(getattr(pin, key)):
            if requirement_name(line) is None:
                raise t.fail(
                    f"{key}[{i}]", f"{line!r} is not a PEP 508 requirement", "e.g. vllm==0.31.0"
                )
    required = {requirement_name(r) for r in pin.requires}
    for i, name in enumerate(pin.stand_ins):
        if requirement_name(name) not in required:
            raise t.fail(f"stand_ins[{i}]", f"{name!r} is not in requires",
                         "a stand-in is pinned in requires, e.g. torch==2.13.0+cpu")  # fmt: skip
    t.done()
    return pin


def _variant(name: str, t: Table, pinned: Mapping[str, ComponentPin]) -> VariantPin:
    """``[variants.NAME]``: ``why`` and, per pinned component, ``[[COMPONENT.wheels]]``."""
    components = {}
    for key in t.keys():
        if key == "why":
            continue
        if key not in pinned:
            raise t.fail(
                key,
                f"{key!r} is not a component the lock pins wheels for",
                f"use one of {sorted(pinned)}",
            )
        sub = t.table(key)
        component = _component(key, sub, extras=pinned[key].extras)
        sub.done()
        if component is None:
            raise t.fail(key, "no wheels", f"add wheels to [variants.{name}.{key}]")
        theirs = [w.name for w in component.wheels]
        ours = [w.name for w in pinned[key].wheels]
        if set(theirs) != set(ours):
            raise t.fail(
                key,
                f"the variant's wheels {theirs} are not the pinned component's {ours}",
                "pin the same distributions, at other versions",
            )
        components[key] = component
    if not components:
        raise t.fail(None, "a variant changes nothing", "pin at least one component's wheels")
    variant = VariantPin(
        name=name, why=t.string("why", required=False, default=""), components=components
    )
    t.done()
    return variant


def _component(
    name: str, t: Table, *, extras: tuple[str, ...] | None = None
) -> ComponentPin | None:
    """``[[NAME.wheels]]`` (name, version, sha256 each) and ``NAME.extras`` (or, for a
    variant, the pinned component's ``extras``)."""
    from k3env.versions import InvalidVersion, Version, canonical_name

    wheels = []
    for w in t.tables("wheels"):
        version = w.string("version")
        try:
            Version(version)
        except InvalidVersion as e:
            raise w.fail("version", f"{version!r} is not a PEP 440 version", "e.g. 1.6.1") from e
        dist = w.string("name")
        if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$", dist):
            raise w.fail("name", f"{dist!r} is not a distribution name", "e.g. ai-dynamo")
        sha = w.matching("sha256", SHA256_RE, "write the wheel file's sha256 (64 hex)")
        wheels.append(WheelPin(name=canonical_name(dist), version=version, sha256=str(sha)))
        w.done()
    names = [w.name for w in wheels]
    if len(set(names)) != len(names):
        raise t.fail("wheels", "a distribution is pinned twice", "pin each wheel once")
    if extras is None:
        extras = t.str_list("extras")
    if not wheels:
        if extras:
            raise t.fail("extras", "extras without [[wheels]]", "pin the wheels, or drop extras")
        return None
    return ComponentPin(name=name, wheels=tuple(wheels), extras=extras)


def _dynamo(t: Table, unresolved: list[Unresolved]) -> DynamoPin:
    version = t.string("version", required=False)
    if version is not None:
        from k3env.versions import InvalidVersion, Version

        try:
            Version(version)
        except InvalidVersion as e:
            raise t.fail(
                "version", f"{version!r} is not a PEP 440 version", 'e.g. "1.4.0.dev1"'
            ) from e
    name = t.string("name")
    component = _component("dynamo", t)
    commit = t.matching("commit", COMMIT_RE, _COMMIT_FIX, allow_unresolved=component is not None)
    if commit is None:
        unresolved.append(
            Unresolved(key="dynamo.commit", hint=f"git ls-remote {_git(t)} refs/tags/{name}")
        )
    pin = DynamoPin(name=name, version=version, git=_git(t), commit=commit, component=component)
    t.done()
    return pin


def _git(t: Table) -> str:
    git = str(t.string("git"))
    if not is_git_source(git):
        raise t.fail("git", f"{git!r} is not a git source", GIT_FIX)
    return git


def _srt(t: Table, unresolved: list[Unresolved]) -> SrtSlurmPin:
    git = _git(t)
    pattern = t.string("tag_pattern", required=False, default=DEFAULT_RELEASE_TAG_RE.pattern)
    try:
        tag_re = re.compile(pattern)
    except re.error as e:
        raise t.fail("tag_pattern", f"not a regular expression: {e}", "fix the pattern") from e
    version = str(t.string("version"))
    if not tag_re.match(version) or not REF_RE.match(version):
        raise t.fail(
            "version",
            f"{version!r} is not a release tag (pattern {pattern})",
            "write the srt-slurm release tag, e.g. v1.0.36 (or set tag_pattern)",
        )
    commit = str(t.matching("commit", COMMIT_RE, _COMMIT_FIX))
    patches = []
    for i, p in enumerate(t.tables("patches")):
        sha = p.matching("sha256", SHA256_RE, _SHA_FIX, allow_unresolved=True)
        rng = p.string("range", required=False)
        if rng is not None:
            ends = rng.split("..")
            if len(ends) != 2 or not all(COMMIT_RE.match(e) for e in ends):
                raise p.fail("range", f"{rng!r} is not BASE..HEAD", "write two 40-hex commits")
        pr = p.integer("pr", required=False)
        if sha is None:
            hint = f"git format-patch --stdout {rng}" if rng else "write the patch file"
            unresolved.append(
                Unresolved(
                    key=f"srt_slurm.patches[{i}].sha256", hint=f"{hint} > {p.string('file')}"
                )
            )
        patches.append(
            SrtPatchPin(
                index=i,
                pr=pr,
                title=p.string("title"),
                file=_relative_file(p, "file"),
                range=rng,
                sha256=sha,
                provides=p.str_list("provides"),
                why=p.string("why"),
            )
        )
        p.done()
    t.done()
    return SrtSlurmPin(git=git, version=version, commit=commit, patches=tuple(patches))


def _relative_file(t: Table, key: str) -> str:
    """A path relative to the repository root that stays inside it."""
    rel = str(t.string(key))
    norm = posixpath.normpath(rel)
    if rel.startswith("/") or norm.startswith("..") or norm != rel.rstrip("/"):
        raise t.fail(key, f"{rel!r} leaves the repository or is not normalised",
                     "write a path relative to the repository root, without '..'")  # fmt: skip
    return rel


def _check_target_path(t: Table, path: str, roots: tuple[str, ...]) -> None:
    """An absolute, normalised path inside one of the roots a patch may touch."""
    if not is_normal_absolute_path(path):
        raise t.fail("path", f"{path!r} is not an absolute, normalised path",
                     "write the absolute path in the image, without '..' or '//'")  # fmt: skip
    if not any(path.startswith(root.rstrip("/") + "/") for root in roots):
        raise t.fail(
            "path",
            f"{path} is outside the roots a container patch may touch {list(roots)}",
            "patch a Python module (module = ...), or add its directory to the lock's "
            "top-level patch_roots if patching it is deliberate",
        )


def _container_patch(
    name: str, t: Table, bases: Mapping[str, BasePin], roots: tuple[str, ...]
) -> ContainerPatchPin:
    module = t.string("module", required=False)
    path = t.string("path", required=False)
    if (module is None) == (path is None):
        raise t.fail(
            None,
            "a container patch needs exactly one target: `module` or `path`",
            'set module = "pkg.mod" (found on the image\'s sys.path) or path = "/abs/file"',
        )
    if module is not None and not MODULE_RE.match(module):
        raise t.fail("module", f"{module!r} is not a dotted module name", 'e.g. "vllm.version"')
    if path is not None:
        _check_target_path(t, path, roots)
    pin_bases = t.str_list("bases", required=True)
    for b in pin_bases:
        if b not in bases:
            raise t.fail("bases", f"unknown base {b!r}", f"use one of {sorted(bases)}")
    pin = ContainerPatchPin(
        name=name,
        file=_relative_file(t, "file"),
        sha256=str(t.matching("sha256", SHA256_RE, _SHA_FIX)),
        module=module,
        path=path,
        bases=pin_bases,
        expects=t.string("expects"),
        why=t.string("why"),
    )
    t.done()
    return pin


def _aiperf(t: Table) -> AiperfPin:
    pin = AiperfPin(
        name=t.string("name"), version=t.string("version"), component=_component("aiperf", t)
    )
    t.done()
    return pin


# ---------------------------------------------------------------------------------------------
# lock --check: the lock against the files it pins
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class FileCheck:
    key: str
    file: str
    expected: str | None
    actual: str | None  # None: the file is missing

    @property
    def ok(self) -> bool:
        return self.expected is not None and self.expected == self.actual


def pinned_files(lock: Lock) -> list[tuple[str, str, str | None]]:
    """``(key, file, sha256)`` for every file the lock pins by hash."""
    out: list[tuple[str, str, str | None]] = []
    for cp in lock.container_patches.values():
        out.append((f"container_patches.{cp.name}.sha256", cp.file, cp.sha256))
    if lock.srt_slurm:
        for p in lock.srt_slurm.patches:
            out.append((f"srt_slurm.patches[{p.index}].sha256", p.file, p.sha256))
    if lock.twin:
        out.append(
            ("twin.requirements_sha256", lock.twin.requirements, lock.twin.requirements_sha256)
        )
    return out


def _sha256_or_none(path: Path, key: str, lock: Lock) -> str | None:
    """The file's sha256; None when it is not there; a LockError naming the key when the
    path itself cannot be used (too long, a directory, no permission)."""
    try:
        return file_sha256(path) if path.is_file() else None
    except OSError as e:
        raise LockError(
            f"cannot read the pinned file {path.name[:80]}: {e.strerror}",
            where=f"{lock.path}: {key}",
            fix="fix the file path in the lock",
        ) from e


def check_files(lock: Lock) -> list[FileCheck]:
    results = []
    for key, rel, expected in pinned_files(lock):
        actual = _sha256_or_none(lock.resolve_path(rel), key, lock)
        results.append(FileCheck(key=key, file=rel, expected=expected, actual=actual))
    return results


def verify_pinned_file(lock: Lock, rel: str, sha256: str, *, key: str, label: str) -> Path:
    """``rel``'s path, after checking the file exists and has the sha256 the lock pins."""
    path = lock.resolve_path(rel)
    where = f"{lock.path}: {key}"
    actual = _sha256_or_none(path, key, lock)
    if actual is None:
        raise LockError(
            f"patch file {rel}{label} is missing",
            where=where,
            fix="restore the file, or fix `file` in the lock",
        )
    if actual != sha256:
        raise LockError(
            f"patch file {rel}{label} has sha256 {actual}, the lock pins {sha256}",
            where=f"{where}.sha256",
            fix="if deliberate, run `k3env lock --update-hashes`; else restore the file",
        )
    return path


def verify_patch_file(lock: Lock, pin: ContainerPatchPin) -> Path:
    """The container patch file's path, after checking its sha256 against the lock."""
    return verify_pinned_file(
        lock, pin.file, pin.sha256, key=f"container_patches.{pin.name}", label=""
    )
