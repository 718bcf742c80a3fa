"""The lockfile (``pins/*.lock.toml``): read and validate it into ``pins``' dataclasses.

``load_lock`` reads the file, checks its top level and ``[bases]`` (the one required section,
which the others name), and hands each optional section to ``lock_sections``. Parsed at the
edge: nothing past this module sees a TOML table. Editing the lock in place is ``lock_edit``'s
job; checking the files it pins, ``pinned_files``'.
"""

from __future__ import annotations

import re
from pathlib import Path

from k3env.config.lock_sections import (
    aiperf_pin,
    container_patch_pin,
    dynamo_pin,
    smoke_pin,
    srt_slurm_pin,
    twin_pin,
    variant_pin,
)
from k3env.config.pins import BasePin, Lock, Unresolved
from k3env.config.reader import DIGEST_RE, Table, each_entry, env_table, load_toml
from k3env.config.secrets import refuse_credentials
from k3env.config.shapes import (
    DEFAULT_PLATFORM,
    PLATFORM_FIX,
    PLATFORM_RE,
    REPOSITORY_FIX,
    REPOSITORY_RE,
    TAG_FIX,
    TAG_RE,
    is_normal_absolute_path,
)
from k3env.errors import LockError
from k3env.hashing import canonical_sha256

LOCK_VERSION = 1
# Where a container patch with a `path` target may write, unless the lock says otherwise:
# Python's install trees (a `module` target is found on the image's own sys.path instead).
DEFAULT_PATCH_ROOTS = ("/usr/lib/python3", "/usr/local/lib/python3", "/opt", "/workspace")
DEFAULT_LOCK = Path("pins/k3.lock.toml")

_DIGEST_FIX = 'write "sha256:" + 64 hex digits (`skopeo inspect docker://REF`), or "unresolved"'


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
    twin = twin_pin(top.table("twin"), unresolved) if top.has("twin") else None
    if any(b.kind == "twin" for b in bases.values()) and twin is None:
        raise top.fail("twin", "a twin base is pinned but [twin] is missing", "add [twin]")
    dynamo = dynamo_pin(top.table("dynamo"), unresolved) if top.has("dynamo") else None
    srt = srt_slurm_pin(top.table("srt_slurm"), unresolved) if top.has("srt_slurm") else None
    roots = top.str_list("patch_roots") or DEFAULT_PATCH_ROOTS
    for i, r in enumerate(roots):
        if not is_normal_absolute_path(r):
            raise top.fail(f"patch_roots[{i}]", f"{r!r} is not a directory below /", "fix it")
    patches = each_entry(
        top.table("container_patches", required=False),
        lambda n, t: container_patch_pin(n, t, bases, roots),
    )
    aiperf = aiperf_pin(top.table("aiperf")) if top.has("aiperf") else None
    pinned = {p.component.name: p.component for p in (dynamo, aiperf) if p and p.component}
    variants = each_entry(
        top.table("variants", required=False), lambda n, t: variant_pin(n, t, pinned, unresolved)
    )
    smoke = smoke_pin(top.table("smoke")) if top.has("smoke") else None
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
        smoke=smoke,
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
    platforms: dict[str, str | None] = {DEFAULT_PLATFORM: digest}
    if t.has("platforms"):
        table = t.table("platforms")
        platforms = {}
        for platform in table.keys():
            if not PLATFORM_RE.match(platform):
                raise table.fail(platform, f"{platform!r} is not a platform", PLATFORM_FIX)
            platforms[platform] = table.matching(
                platform, DIGEST_RE, _DIGEST_FIX, allow_unresolved=True
            )
            if platforms[platform] is None:
                unresolved.append(
                    Unresolved(
                        key=f"bases.{name}.platforms.{platform}",
                        hint=f"skopeo inspect --raw docker://{repository}:{tag} (the "
                        f"manifests[] entry whose platform is {platform})",
                    )
                )
        table.done()
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
        platforms=platforms,
    )
