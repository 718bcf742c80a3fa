"""The lock's optional sections: each ``[twin]``, ``[smoke]``, ``[dynamo]``, ``[srt_slurm]``,
``[container_patches.NAME]``, ``[aiperf]`` and ``[variants.NAME]`` table, validated into its pin.

Pure: each function reads one ``Table`` (what ``lock.load_lock`` hands it), raises a
``LockError`` naming the key, and records what is left unresolved.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from k3env.config.pins import (
    OVERLAYS,
    AiperfPin,
    BasePin,
    ComponentPin,
    ContainerPatchPin,
    DebPin,
    DynamoPin,
    SmokePin,
    SourceBuild,
    SrtPatchPin,
    SrtSlurmPin,
    TwinPin,
    Unresolved,
    VariantPin,
    WheelPin,
)
from k3env.config.reader import COMMIT_RE, SHA256_RE, Table
from k3env.config.shapes import (
    DEFAULT_PLATFORM,
    DEFAULT_RELEASE_TAG_RE,
    GIT_FIX,
    PLATFORM_FIX,
    PLATFORM_RE,
    REF_RE,
    RELATIVE_PATH_FIX,
    REPOSITORY_FIX,
    REPOSITORY_RE,
    control_character,
    is_git_source,
    is_normal_absolute_path,
    is_normal_relative_path,
)
from k3env.config.tagpattern import (
    TAG_PATTERN_FIX,
    UnsafePattern,
    compile_tag_pattern,
    matches_tag,
)
from k3env.errors import LockError

MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
REGISTRY_RE = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]+)?$")

_SHA_FIX = 'write the 64-hex sha256 of the file (`sha256sum FILE`), or "unresolved"'
_COMMIT_FIX = "write the full 40-hex commit id (`git rev-parse TAG^{commit}`)"


def smoke_pin(t: Table) -> SmokePin:
    engine = _component("smoke", t)
    if engine is None or len(engine.wheels) != 1:
        raise t.fail("wheels", "the smoke engine is one wheel", "pin the CPU build's wheel")
    stands_in_for = t.matching("stands_in_for", re.compile(r"^[a-z0-9][a-z0-9._-]*$"), "e.g. vllm")
    debs = []
    for d in t.tables("debs"):
        file = d.matching(
            "file",
            re.compile(r"^pool/[a-z0-9][a-z0-9+._/-]*\.deb$"),
            "the .deb's path below the mirror, e.g. pool/main/n/numactl/libnuma1_2.0.16-1_amd64.deb",  # noqa: E501
        )
        if not is_normal_relative_path(str(file)):
            raise d.fail("file", f"{file!r} leaves the mirror or is not normalised",
                         "write a path below pool/, without '..', '.' or '//'")  # fmt: skip
        debs.append(
            DebPin(
                name=str(
                    d.matching("name", re.compile(r"^[a-z0-9][a-z0-9+.-]*$"), "e.g. libnuma1")
                ),
                file=str(file),
                sha256=str(d.matching("sha256", SHA256_RE, _SHA_FIX)),
            )
        )
        d.done()
    absent = t.str_list("absent")
    for i, name in enumerate(absent):
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise t.fail(
                f"absent[{i}]", f"{name!r} is not a top-level module name", "e.g. torchvision"
            )
    t.done()
    return SmokePin(
        stands_in_for=str(stands_in_for), engine=engine, debs=tuple(debs), absent=absent
    )


def twin_pin(t: Table, unresolved: list[Unresolved]) -> TwinPin:
    sha = t.matching("requirements_sha256", SHA256_RE, _SHA_FIX, allow_unresolved=True)
    req = t.relative_path("requirements")
    if sha is None:
        unresolved.append(
            Unresolved(key="twin.requirements_sha256", hint=f"k3env lock --update-hashes ({req})")
        )
    platforms = {}
    if t.has("platforms"):
        table = t.table("platforms")
        for name in table.keys():
            if not PLATFORM_RE.match(name):
                raise table.fail(name, f"{name!r} is not a platform", PLATFORM_FIX)
            if name == DEFAULT_PLATFORM:
                raise table.fail(name, f"{name} is [twin] itself", "list other platforms here")
            platforms[name] = table.entry(name, names=PLATFORM_RE)
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
        debian=t.relative_path("debian") if t.has("debian") else None,
        debian_sha256=t.matching(
            "debian_sha256", SHA256_RE, _SHA_FIX, required=False, allow_unresolved=True
        ),
        resolved_before=_cutoff(t),
    )

    _pep508(t, {key: getattr(pin, key) for key in ("requires", "omit", "stand_ins")})
    _stand_ins_required(t, pin)
    others = {name: _twin_platform(name, sub, pin, unresolved) for name, sub in platforms.items()}
    t.done()
    return dataclasses.replace(pin, platforms=others)


def _pep508(t: Table, lists: Mapping[str, tuple[str, ...]]) -> None:
    """Each line of the table's own requirement lists is a PEP 508 requirement."""
    from k3env.versions import requirement_name

    for key, lines in lists.items():
        for i, line in enumerate(lines):
            if requirement_name(line) is None:
                raise t.fail(
                    f"{key}[{i}]", f"{line!r} is not a PEP 508 requirement", "e.g. vllm==0.31.0"
                )


def _stand_ins_required(t: Table, pin: TwinPin) -> None:
    from k3env.versions import requirement_name

    required = {requirement_name(r) for r in pin.requires}
    for i, name in enumerate(pin.stand_ins):
        if requirement_name(name) not in required:
            raise t.fail(f"stand_ins[{i}]", f"{name!r} is not in requires",
                         "a stand-in is pinned in requires, e.g. torch==2.13.0+cpu")  # fmt: skip


def _twin_platform(platform: str, t: Table, top: TwinPin, unresolved: list[Unresolved]) -> TwinPin:
    """``[twin.platforms."linux/arm64"]``: its own generated files; what it resolves from."""
    key = f"twin.platforms.{platform}"
    req = t.relative_path("requirements")
    sha = t.matching("requirements_sha256", SHA256_RE, _SHA_FIX, allow_unresolved=True)
    if sha is None:
        unresolved.append(
            Unresolved(key=f"{key}.requirements_sha256",
                       hint=f"k3env twin --resolve --platform {platform}")
        )  # fmt: skip
    debian = t.relative_path("debian") if t.has("debian") else None
    debian_sha = t.matching(
        "debian_sha256", SHA256_RE, _SHA_FIX, required=False, allow_unresolved=True
    )
    if debian is not None and debian_sha is None:
        unresolved.append(
            Unresolved(key=f"{key}.debian_sha256",
                       hint=f"k3env twin --resolve --platform {platform}")
        )  # fmt: skip
    # Its own lists (the rest are [twin]'s, checked there): requires / stand_ins replace
    # [twin]'s, omit adds to them.
    own = {key: t.str_list(key) for key in ("requires", "stand_ins", "omit") if t.has(key)}
    _pep508(t, own)
    requires = own.get("requires", top.requires)
    stand_ins = own.get("stand_ins", top.stand_ins)
    omit = (*top.omit, *own.get("omit", ()))
    pin = dataclasses.replace(
        top, requirements=req, requirements_sha256=sha, debian=debian,
        debian_sha256=debian_sha, requires=requires, stand_ins=stand_ins, omit=omit,
        platform=platform, key=key, platforms={},
    )  # fmt: skip
    _stand_ins_required(t, pin)
    t.done()
    return pin


def variant_pin(
    name: str, t: Table, pinned: Mapping[str, ComponentPin], unresolved: list[Unresolved]
) -> VariantPin:
    """``[variants.NAME]``: ``why`` and, per pinned component, ``[[COMPONENT.wheels]]``; a
    ``[variants.NAME.vllm]`` is a vLLM release laid over the twin (``_overlay``)."""
    components = {}
    for key in t.keys():
        if key == "why":
            continue
        if key in OVERLAYS:
            components[key] = _overlay(name, key, t.table(key), unresolved)
            continue
        if key == "smoke":  # the CPU build of the variant's vLLM, for `smoke --variant`
            sub = t.table(key)
            engine = _component("smoke", sub, extras=())
            sub.done()
            if engine is None or len(engine.wheels) != 1:
                raise t.fail(key, "the smoke engine is one wheel",
                             "pin the CPU build of the variant's vLLM")  # fmt: skip
            components[key] = engine
            continue
        if key not in pinned:
            raise t.fail(
                key,
                f"{key!r} is not a component the lock pins wheels for",
                f"use one of {sorted([*pinned, *OVERLAYS])}",
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


def _overlay(variant: str, name: str, t: Table, unresolved: list[Unresolved]) -> ComponentPin:
    """``[variants.NAME.vllm]``: the release's one wheel by sha256; ``closure``, the rest of
    its closure where it differs from the twin's (generated by ``k3env twin --resolve``,
    pinned by ``closure_sha256``); ``requires``, what that resolution adds or overrides
    (another CPU torch where the release cannot import over the twin's)."""
    component = _component(name, t, extras=())
    if component is None or [w.name for w in component.wheels] != [name]:
        raise t.fail(
            "wheels", f"a {name} variant pins exactly one wheel, {name}'s",
            f'wheels = [{{ name = "{name}", version = "...", sha256 = "..." }}]',
        )  # fmt: skip
    if component.wheels[0].platforms:
        raise t.fail("wheels", f"a {name} variant is laid over the linux/amd64 twin only",
                     "drop the wheel's platforms")  # fmt: skip
    key = f'variants."{variant}".{name}'
    closure = t.string("closure", required=False)
    if closure is not None and not is_normal_relative_path(closure):
        raise t.fail("closure", f"{closure!r} is not a path inside the repository",
                     RELATIVE_PATH_FIX)  # fmt: skip
    sha = (
        t.matching("closure_sha256", SHA256_RE, _SHA_FIX, required=False, allow_unresolved=True)
        if closure is not None
        else None
    )
    if closure is None or sha is None:
        unresolved.append(
            Unresolved(key=f"{key}.closure_sha256",
                       hint=f"k3env twin --resolve (writes {closure or 'the closure file'})")
        )  # fmt: skip
    requires = t.str_list("requires")
    cutoff = _cutoff(t)
    t.done()
    return dataclasses.replace(component, closure=closure, closure_sha256=sha, requires=requires,
                               resolved_before=cutoff)  # fmt: skip


def _cutoff(t: Table) -> str | None:
    """``resolved_before``: the package index's cut-off of a resolution (a UTC instant, a
    real date)."""
    from k3env.config.cutoff import INSTANT_FIX, INSTANT_RE, parse_instant

    value = t.matching("resolved_before", INSTANT_RE, INSTANT_FIX, required=False)
    if value is not None:
        try:
            parse_instant(value, where="resolved_before")
        except LockError as e:
            raise t.fail("resolved_before", e.message, INSTANT_FIX) from e
    return value


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
        others = {}
        if w.has("platforms"):
            table = w.table("platforms")
            for platform in table.keys():
                if not PLATFORM_RE.match(platform) or platform == DEFAULT_PLATFORM:
                    raise table.fail(platform, f"{platform!r} is not another platform",
                                     'write "linux/arm64"')  # fmt: skip
                others[platform] = str(table.matching(platform, SHA256_RE, _SHA_FIX))
            table.done()
        wheels.append(
            WheelPin(name=canonical_name(dist), version=version, sha256=str(sha),
                     platforms=others)
        )  # fmt: skip
        w.done()
    names = [w.name for w in wheels]
    if len(set(names)) != len(names):
        raise t.fail("wheels", "a distribution is pinned twice", "pin each wheel once")
    if extras is None:
        extras = t.str_list("extras")
    if not wheels:
        if extras and not t.has("build"):
            raise t.fail("extras", "extras without [[wheels]]", "pin the wheels, or drop extras")
        return None
    return ComponentPin(name=name, wheels=tuple(wheels), extras=extras)


def dynamo_pin(t: Table, unresolved: list[Unresolved]) -> DynamoPin:
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
    projects = t.str_list("build")
    if projects and component is not None:
        raise t.fail("build", "both wheels and a source build", "pin one: wheels, or build")
    for i, d in enumerate(projects):
        if d != "." and (not is_normal_relative_path(d) or control_character(d)):
            raise t.fail(f"build[{i}]", f"{d!r} is not a directory inside the repository",
                         'write a relative path, e.g. "." or "lib/bindings/python"')  # fmt: skip
    commit = t.matching("commit", COMMIT_RE, _COMMIT_FIX, allow_unresolved=component is not None)
    if projects:
        assert commit is not None
        component = ComponentPin(
            name="dynamo",
            wheels=(),
            extras=t.str_list("extras"),
            source=SourceBuild(git=_git(t), commit=commit, projects=projects),
        )
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


def srt_slurm_pin(t: Table, unresolved: list[Unresolved]) -> SrtSlurmPin:
    git = _git(t)
    pattern = t.string("tag_pattern", required=False, default=DEFAULT_RELEASE_TAG_RE.pattern)
    try:
        tag_re = compile_tag_pattern(pattern)
    except UnsafePattern as e:
        raise t.fail("tag_pattern", f"refusing {pattern[:80]!r}: {e}", TAG_PATTERN_FIX) from e
    version = str(t.string("version"))
    # The fixed grammar first: the pattern only ever sees a short, plain ref name.
    if not REF_RE.match(version) or not matches_tag(tag_re, version):
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
        # A back-port: the upstream commit whose change it carries (its fate by ancestry).
        backports = p.matching("backports", COMMIT_RE, _COMMIT_FIX, required=False)
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
                file=p.relative_path("file"),
                range=rng,
                backports=None if backports is None else str(backports),
                sha256=sha,
                provides=p.str_list("provides"),
                why=p.string("why"),
            )
        )
        p.done()
    requirements = t.relative_path("requirements") if t.has("requirements") else None
    req_sha = t.matching(
        "requirements_sha256", SHA256_RE, _SHA_FIX, required=False, allow_unresolved=True
    )
    if requirements is not None and req_sha is None:
        unresolved.append(
            Unresolved(
                key="srt_slurm.requirements_sha256",
                hint=f"k3env lock --update-hashes ({requirements})",
            )
        )
    # srt-slurm's recipe and cluster-config schema, recorded from its own loader
    # (`k3env srt schema`): what preflight checks keys and types against without it.
    schema = t.relative_path("schema") if t.has("schema") else None
    schema_sha = t.matching(
        "schema_sha256", SHA256_RE, _SHA_FIX, required=False, allow_unresolved=True
    )
    if schema is not None and schema_sha is None:
        unresolved.append(
            Unresolved(key="srt_slurm.schema_sha256", hint=f"k3env lock --update-hashes ({schema})")
        )
    t.done()
    return SrtSlurmPin(git=git, version=version, commit=commit, patches=tuple(patches),
                       requirements=requirements, requirements_sha256=req_sha,
                       schema=schema, schema_sha256=schema_sha)  # fmt: skip


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


def container_patch_pin(
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
        file=t.relative_path("file"),
        sha256=str(t.matching("sha256", SHA256_RE, _SHA_FIX)),
        module=module,
        path=path,
        bases=pin_bases,
        expects=t.string("expects"),
        why=t.string("why"),
    )
    t.done()
    return pin


def aiperf_pin(t: Table) -> AiperfPin:
    pin = AiperfPin(
        name=t.string("name"), version=t.string("version"), component=_component("aiperf", t)
    )
    t.done()
    return pin
