"""Spec + lock -> derived image, reproducibly: a pipeline of small steps.

resolve base -> check inputs (patch hashes, secrets) -> inputs hash (the tag) -> cache hit?
-> read patch targets -> apply patches -> assemble layer + config -> load -> check ID -> tag.

The tag is the content hash of the inputs, so a rebuild with nothing changed is answered by
one inspect. Nothing is tagged until the loaded image's ID is what we wrote: the config's
digest, or on a containerd image store the manifest's (``engine.naming``).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3env import __version__, jsontext
from k3env.config.patchfile import PatchFile, load_patch_file
from k3env.config.pinned_files import verify_patch_file
from k3env.config.pins import BasePin, ComponentPin, Lock
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec
from k3env.engine.naming import ImageNames
from k3env.engine.protocol import Engine, ImageFile, Tagged
from k3env.errors import ConfigError, EngineError, PatchError
from k3env.hashing import canonical_sha256, digest_hex, file_sha256, sha256_digest
from k3env.image import records
from k3env.image.bases import ResolvedBase, registry_base, select_base
from k3env.image.blobs import keep_config, keep_layer, keep_manifest, kept_image
from k3env.image.envpolicy import baked_env, merge_env
from k3env.image.identity import identify
from k3env.image.install import load_checked
from k3env.image.layer import Assembled, LayerFile, assemble, load_archive, runtime_config
from k3env.image.patches import APPLIED, SKIPPED, PatchResult, apply_patch
from k3env.image.records import Build, build_key
from k3env.log import Log
from k3env.state import State

if TYPE_CHECKING:
    from k3env.image.components import Baked

# Bump when the layout of what we write changes: it is part of every inputs hash.
# 4: pinned components baked below (wheels or source-built), in provenance; 5: the config over
# the base's own config JSON (not the engine's view of it), loaded with its OCI manifest; 6: every
# directory above the layer's files named in it (an export no longer carries a load time).
BUILD_FORMAT = 6
PROVENANCE_PATH = "/etc/k3env/provenance.json"
PROVENANCE_LABEL = "io.k3env.provenance.sha256"
# The parts of an image config a job runs with (enroot turns them into /etc files).
RUNTIME_KEYS = ("Env", "Entrypoint", "Cmd", "WorkingDir", "Volumes", "Labels")
LABEL_PREFIX = "io.k3env"


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    image: str
    reference: str  # repository:tag
    image_id: str  # the config digest: what records and provenance name it by, on any store
    inputs: str
    cached: bool
    base: str
    base_id: str
    twin: bool
    patches: tuple[PatchResult, ...]
    env: tuple[str, ...]
    components: tuple[str, ...] = ()  # "name version" of each baked wheel
    seconds: float = 0.0
    platform: str = DEFAULT_PLATFORM
    manifest: str | None = None  # its OCI manifest's digest (None: its base's is not known)
    # What this engine calls it and its base (engine.naming: image_id or manifest): every
    # call that hands the engine the image (run, inspect, tag, export) names it so.
    engine_id: str
    base_engine_id: str

    def as_json(self) -> dict[str, object]:
        patches = [{"name": p.name, "target": p.target, "status": p.status, "detail": p.detail}
                   for p in self.patches]  # fmt: skip
        return {**jsontext.plain(self, leave=("base_engine_id", "patches")), "patches": patches,
                "seconds": round(self.seconds, 3)}  # fmt: skip


def _patch_plan(
    lock: Lock, spec: ImageSpec, base: BasePin
) -> tuple[list[tuple[PatchFile, str | None, str | None]], list[PatchResult]]:
    """Patch files to apply (checked against the lock) and patches skipped on this base."""
    todo: list[tuple[PatchFile, str | None, str | None]] = []
    skipped: list[PatchResult] = []
    for name in spec.patches:
        pin = lock.container_patches[name]
        path = verify_patch_file(lock, pin)
        if base.name not in pin.bases:
            skipped.append(
                PatchResult(
                    name=name,
                    target=pin.target,
                    status=SKIPPED,
                    detail=f"written for base(s) {list(pin.bases)}, not {base.name}",
                    new_text=None,
                )
            )
            continue
        todo.append((load_patch_file(pin, path), pin.module, pin.path))
    return todo, skipped


def find_modules_script() -> str:
    """A ``python -c`` script printing ``{module: file}`` for the modules in argv, found on
    the image's own sys.path without importing them: the probe's own lookup
    (``k3env/probes/probe/locate.py``), so the builder and ``k3env verify`` agree on where a
    module lives."""
    return (resources.files("k3env.probes.probe") / "locate.py").read_text()


def resolve_modules(
    engine: Engine, state: State, base: ResolvedBase, modules: list[str], log: Log
) -> dict[str, str | None]:
    """Module -> file in the image, found on the image's own sys.path without importing. The
    same container reads each found file (``locate.py --read``): it lands in the cache
    ``read_base_files`` answers from, so a cold build starts one container, not two."""
    key = digest_hex(base.config_digest)
    cached: dict[str, str | None] = state.read_json("images", key, "modules.json") or {}
    missing = [m for m in modules if m not in cached]
    if missing:
        with log.step(f"locate {len(missing)} module(s) in {base.reference}"):
            result = engine.run(
                base.image.id,
                [base.pin.python, "-c", find_modules_script(), "--read", *missing],
                timeout=120,
            )
        if result.exit_code != 0:
            raise EngineError(
                f"could not run {base.pin.python} in the base image (exit {result.exit_code}): "
                f"{result.stderr.strip()[-2000:]}",
                where=f"bases.{base.pin.name}.python",
                fix="set `python` in the base pin to the image's interpreter",
            )
        found, files = _located(result.stdout, missing, base.reference)
        cached.update(found)
        _remember_files(state, key, files)
        state.write_json(cached, "images", key, "modules.json")
    return {m: cached.get(m) for m in modules}


def _located(
    stdout: str, asked: list[str], where: str
) -> tuple[dict[str, str | None], dict[str, ImageFile]]:
    """``locate.py --read``'s answer, its shape checked: each module asked for, a file or
    none; each file's bytes and stat (a file it did not read is read through the engine)."""
    try:
        doc = jsontext.parse(stdout.strip().splitlines()[-1], limit=256 << 20)
        found, read = doc["modules"], doc["files"]
        if not isinstance(found, dict) or sorted(found) != sorted(asked):
            raise ValueError("modules")
        if not all(f is None or (isinstance(f, str) and f.startswith("/")) for f in found.values()):
            raise ValueError("files")
        files = {}
        for path, meta in read.items() if isinstance(read, dict) else ():
            if meta is None or path not in found.values():
                continue
            content = base64.b64decode(meta["b64"], validate=True)
            mode, uid, gid = (int(meta[k]) for k in ("mode", "uid", "gid"))
            files[path] = ImageFile(path=path, content=content, mode=mode, uid=uid, gid=gid)
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as e:
        raise EngineError(
            f"unexpected module probe output: {stdout[-500:]!r}",
            where=where,
            fix="report this as a k3env bug",
        ) from e
    return found, files


def _remember_files(state: State, key: str, files: Mapping[str, ImageFile | None]) -> None:
    """Record a base image's files (None: not there) where ``read_base_files`` finds them."""
    if not files:
        return
    index: dict[str, Any] = state.read_json("images", key, "files.json") or {}
    for p, f in files.items():
        if f is None:
            index[p] = None
            continue
        sha = digest_hex(sha256_digest(f.content))
        state.write_bytes(f.content, "blobs", sha)
        index[p] = {"sha256": sha, "mode": f.mode, "uid": f.uid, "gid": f.gid}
    state.write_json(index, "images", key, "files.json")


def read_base_files(
    engine: Engine, state: State, base: ResolvedBase, paths: list[str]
) -> dict[str, ImageFile | None]:
    """Files of the base image; cached by its config digest (an image never changes)."""
    key = digest_hex(base.config_digest)
    index: dict[str, dict[str, int | str] | None] = (
        state.read_json("images", key, "files.json") or {}
    )
    out: dict[str, ImageFile | None] = {}
    missing = []
    for p in paths:
        meta = index.get(p, "absent-from-cache")
        if meta == "absent-from-cache":
            missing.append(p)
        elif meta is None:
            out[p] = None
        else:
            assert isinstance(meta, dict)
            content = state.read_bytes("blobs", str(meta["sha256"]))
            if content is None:
                missing.append(p)
                continue
            out[p] = ImageFile(
                path=p,
                content=content,
                mode=int(meta["mode"]),
                uid=int(meta["uid"]),
                gid=int(meta["gid"]),
            )
    if missing:
        read = engine.read_files(base.image.id, missing)
        out.update(read)
        _remember_files(state, key, read)
    return out


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return path.name


class Builder:
    def __init__(
        self,
        *,
        lock: Lock,
        engine: Engine,
        state: State,
        log: Log,
        resolve_base: Callable[[BasePin, str], ResolvedBase],
        twin: bool = False,
        platform: str = DEFAULT_PLATFORM,
        registry_form: bool = False,
    ) -> None:
        self.lock = lock
        self.engine = engine
        self.state = state
        self.log = log
        self._resolve_base = resolve_base
        self._bases: dict[str, ResolvedBase] = {}
        self.twin = twin
        self.platform = platform
        # The engine is the cache: an image it holds under its content tag is a hit. Only a
        # publish needs the registry form (the layers and config kept in the state) as well;
        # where that is gone the image is made again, the same bytes, checked by ID.
        self.registry_form = registry_form

    def resolve_base(self, pin: BasePin) -> ResolvedBase:
        """Each base once per run (pull or twin build included)."""
        if pin.name not in self._bases:
            self._bases[pin.name] = self._resolve_base(pin, self.platform)
        return self._bases[pin.name]

    def inputs_hash(self, spec: ImageSpec, base: ResolvedBase, patches: list[PatchFile]) -> str:
        return canonical_sha256(
            {
                "format": BUILD_FORMAT,
                "base": {"id": base.config_digest, "name": base.name, "digest": base.digest},
                "lock": self.lock.sha256,
                "spec": spec.sha256,
                "spec_name": spec.name,
                # The provenance file names both files by their path in the project: the same
                # spec read from another directory is another image, so another tag (else its
                # cache hit would answer with the other path's bytes).
                "lock_path": _relative(self.lock.path, self.lock.root),
                "spec_path": _relative(spec.path, self.lock.root),
                "patches": {p.name: file_sha256(p.path) for p in patches},
                # How the components layer is made is part of what this image is.
                "components": [
                    {"name": c, "wheels": self._component(c).identity} for c in spec.components
                ],
                "components_format": _components_format() if spec.components else None,
                "twin": self.twin,
            }
        )

    def build(self, spec: ImageSpec) -> BuildResult:
        start = time.monotonic()
        pin = select_base(self.lock, spec, self.twin)
        env = baked_env(self.lock, spec, pin)  # refuses credentials before anything else happens
        todo, skipped = _patch_plan(self.lock, spec, pin)
        base = self.resolve_base(pin)
        inputs = self.inputs_hash(spec, base, [p for p, _, _ in todo])
        tag = inputs[:20]
        reference = f"{spec.repository}:{tag}"

        def result(
            names: ImageNames, engine_id: str, cached: bool, patches: list[PatchResult]
        ) -> BuildResult:
            return BuildResult(
                image=spec.name,
                reference=reference,
                image_id=names.config,
                manifest=names.manifest,
                engine_id=engine_id,
                inputs=inputs,
                cached=cached,
                base=base.name,
                base_id=base.config_digest,
                base_engine_id=base.image.id,
                twin=self.twin,
                patches=tuple(patches),
                env=tuple(sorted(env)),
                components=tuple(
                    describe for c in spec.components for describe in _described(self.lock, c)
                ),
                seconds=time.monotonic() - start,
                platform=self.platform,
            )

        hit = self._cached(reference, inputs, base)
        if hit is not None:
            self.log.info(f"    {spec.name}: cache hit {reference}")
            existing, names = hit
            return result(names, existing.id, True, _cached_patches(existing.labels, spec, skipped))

        # The pinned components first, as their own layer: patches may target their files.
        under, baked = base, None
        if spec.components:
            from k3env.image.components import bake
            from k3env.image.sources import source_wheels

            pins = [
                source_wheels(self.engine, self.state, self.log, base, self._component(c))
                for c in spec.components
            ]
            under, baked = bake(
                self.engine, self.state, self.log, base, pins, registry_form=self.registry_form
            )
        results, files = self._apply_patches(spec, under, todo)
        results = [*results, *skipped]
        labels = self._labels(spec, base, inputs, results)
        config_env = merge_env(list(under.image.config.get("Env") or []), env)
        runtime = runtime_config(under.image, env=config_env, labels=labels)
        provenance = self._provenance(spec, base, inputs, results, env, runtime, files, baked)
        # The provenance file is itself checked: its hash rides in the config (a label,
        # which enroot writes into /etc/rc), and it lists every other file of this layer.
        labels[PROVENANCE_LABEL] = digest_hex(sha256_digest(provenance))
        files.append(LayerFile(path="/etc/k3env", is_dir=True, mode=0o755))
        files.append(LayerFile(path=PROVENANCE_PATH, content=provenance, mode=0o644))
        assembled = assemble(
            under.image,
            files,
            env=config_env,
            labels=labels,
            created_by=f"k3env build {spec.name} (inputs {inputs[:20]})",
            comment=f"k3env {__version__}",
        )
        names, loaded = self._load(assembled, under, reference)
        return result(names, loaded, False, results)

    def _cached(
        self, reference: str, inputs: str, base: ResolvedBase
    ) -> tuple[Tagged, ImageNames] | None:
        """The image the engine holds under ``reference`` from these inputs, with its names
        (``None``, built again, the same bytes: none; one k3env cannot name on this engine's
        store; one whose manifest this state lost while its base's is known; or, for a
        publish, one whose registry form is not kept)."""
        existing = self.engine.lookup(reference)
        if existing is None or existing.labels.get(f"{LABEL_PREFIX}.inputs") != inputs:
            return None
        named = identify(self.engine.image_store(), self.state, existing.id)
        if named is None or (named[0].manifest is None and base.manifest is not None):
            return None
        if self.registry_form and not kept_image(self.state, named[0].config):
            return None
        return existing, named[0]

    def _load(
        self, assembled: Assembled, under: ResolvedBase, reference: str
    ) -> tuple[ImageNames, str]:
        """Keep the registry form (a publish sends these very bytes), and load the same blob,
        named by the same manifest; the image's names and the engine's ID for it."""
        blob = keep_layer(self.state, assembled.layer_tar, assembled.diff_id)
        keep_config(self.state, assembled.config_json)
        names, manifest, parts = load_archive(
            assembled.config_json, [*under.image.diff_ids, assembled.diff_id], blob,
            blob.path, under.manifest.layers if under.manifest else None,
        )  # fmt: skip
        if manifest is not None:
            keep_manifest(self.state, manifest)
        return names, load_checked(self.engine, parts, names, reference, self.log)

    def _component(self, name: str) -> ComponentPin:
        """The component's pin with its wheels' files for this builder's platform."""
        return self.lock.components[name].for_platform(self.platform)

    def _apply_patches(
        self,
        spec: ImageSpec,
        base: ResolvedBase,
        todo: list[tuple[PatchFile, str | None, str | None]],
    ) -> tuple[list[PatchResult], list[LayerFile]]:
        if not todo:
            return [], []
        modules = [m for _, m, _ in todo if m]
        located = (
            resolve_modules(self.engine, self.state, base, modules, self.log) if modules else {}
        )
        targets: list[tuple[PatchFile, str]] = []
        for patch, module, path in todo:
            target = located.get(module) if module else path
            if target is None:
                raise PatchError(
                    f"target module {module} is not on the image's sys.path",
                    where=f"container patch {patch.name} ({patch.path}) in {base.reference}",
                    fix=(
                        "the upstream layout changed: find where the code moved, update `module` "
                        f"in {self.lock.path} [container_patches.{patch.name}], or drop the patch"
                    ),
                )
            targets.append((patch, target))
        contents = read_base_files(self.engine, self.state, base, sorted({t for _, t in targets}))
        texts: dict[str, str] = {}
        results: list[PatchResult] = []
        for patch, target in targets:
            f = contents.get(target)
            if f is None:
                raise PatchError(
                    f"target file {target} does not exist in the image",
                    where=f"container patch {patch.name} ({patch.path}) in {base.reference}",
                    fix=f"update the target in {self.lock.path}, or drop the patch",
                )
            text = texts.get(target, f.content.decode("utf-8"))
            result = apply_patch(patch, target, text, image=base.reference)
            if result.new_text is not None:
                texts[target] = result.new_text
            results.append(result)
        files = [
            LayerFile(
                path=t,
                content=texts[t].encode("utf-8"),
                mode=contents[t].mode,  # type: ignore[union-attr]
                uid=contents[t].uid,  # type: ignore[union-attr]
                gid=contents[t].gid,  # type: ignore[union-attr]
            )
            for t in sorted(texts)
        ]
        return results, files

    def _provenance(
        self,
        spec: ImageSpec,
        base: ResolvedBase,
        inputs: str,
        patches: list[PatchResult],
        env: dict[str, str],
        runtime: Mapping[str, Any],
        files: Sequence[LayerFile],
        baked: Baked | None,
    ) -> bytes:
        doc = {
            "k3env_build_format": BUILD_FORMAT,
            "image": spec.name,
            "inputs": inputs,
            "lock": {"path": _relative(self.lock.path, self.lock.root), "sha256": self.lock.sha256},
            "spec": {"path": _relative(spec.path, self.lock.root), "sha256": spec.sha256},
            "base": {
                "pin": base.pin.name,
                "name": base.name,
                "digest": base.digest,
                "image_id": base.config_digest,
                "twin": self.twin,
            },
            "pins": self.lock.pins_summary(),
            "patches": [
                {
                    "name": p.name,
                    "target": p.target,
                    "status": p.status,
                    "sha256": self.lock.container_patches[p.name].sha256,
                }
                for p in patches
            ],
            "env": env,
            # The pinned wheels baked in the layer below this one (checked in the image
            # against each distribution's own RECORD).
            "components": baked.as_json() if baked else None,
            # What the image runs with (its config, as enroot writes it into /etc/rc and
            # /etc/environment), and the sha256 of every other file of this layer.
            "config": {k: runtime.get(k) for k in RUNTIME_KEYS},
            "files": {f.path: digest_hex(sha256_digest(f.content)) for f in files if not f.is_dir},
        }
        return (jsontext.dumps(doc, indent=2) + "\n").encode()

    def _labels(
        self, spec: ImageSpec, base: ResolvedBase, inputs: str, patches: list[PatchResult]
    ) -> dict[str, str]:
        labels = {
            "org.opencontainers.image.title": spec.name,
            "org.opencontainers.image.description": spec.description,
            "org.opencontainers.image.version": inputs[:20],
            "org.opencontainers.image.base.name": base.name,
            f"{LABEL_PREFIX}.inputs": inputs,
            f"{LABEL_PREFIX}.lock.sha256": self.lock.sha256,
            f"{LABEL_PREFIX}.lock.path": _relative(self.lock.path, self.lock.root),
            f"{LABEL_PREFIX}.spec.sha256": spec.sha256,
            f"{LABEL_PREFIX}.base.id": base.config_digest,
            f"{LABEL_PREFIX}.base.pin": base.pin.name,
            f"{LABEL_PREFIX}.twin": str(self.twin).lower(),
            f"{LABEL_PREFIX}.provenance": PROVENANCE_PATH,
        }
        if base.digest:
            labels["org.opencontainers.image.base.digest"] = base.digest
        for key, value in self.lock.pins_summary().items():
            labels[f"{LABEL_PREFIX}.pin.{key}"] = value
        for p in patches:
            labels[f"{LABEL_PREFIX}.patch.{p.name}"] = p.status
        return labels


def _components_format() -> int:
    """The components layer's format (part of an inputs hash), read where a spec bakes
    components: the components module is imported only by builds that bake."""
    from k3env.image.components import COMPONENTS_FORMAT

    return COMPONENTS_FORMAT


def _described(lock: Lock, name: str) -> list[str]:
    """How a component shows in results: its wheels, or its source commit."""
    pin = lock.components[name]
    if pin.source is not None:
        return [f"{name} @ {pin.source.commit[:12]} (built from source)"]
    return [f"{w.name} {w.version}" for w in pin.wheels]


def _cached_patches(
    labels: Mapping[str, str], spec: ImageSpec, skipped: list[PatchResult]
) -> list[PatchResult]:
    skipped_names = {s.name for s in skipped}
    out = [
        PatchResult(
            name=name,
            target="",
            status=str(labels.get(f"{LABEL_PREFIX}.patch.{name}", APPLIED)),
            detail="from the cached image's labels",
            new_text=None,
        )
        for name in spec.patches
        if name not in skipped_names
    ]
    return [*out, *skipped]


def make_builder(
    lock: Lock,
    engine: Engine,
    state: State,
    log: Log,
    twin: bool,
    platform: str = DEFAULT_PLATFORM,
    *,
    registry_form: bool = False,
) -> Builder:
    """A Builder whose bases come by digest from a registry, or as the locally built twin,
    for ``platform`` (another architecture's containers run under qemu-user emulation)."""
    registry = registry_base(engine, log, state)

    def resolve(pin: BasePin, on: str) -> ResolvedBase:
        if pin.kind != "twin":
            return registry(pin, on)
        from k3env.image.components import bake, closure_pins
        from k3env.image.twin import twin_base

        base = twin_base(lock, engine, state, log, pin, on)
        if lock.overlay is None:
            return base
        # A variant's vLLM release, laid over the twin under every image.
        if on != DEFAULT_PLATFORM:
            raise ConfigError(
                f"variant {lock.variant} lays {lock.overlay.name} over the {DEFAULT_PLATFORM} "
                f"twin only, not {on}",
                where=f'{lock.path}: variants."{lock.variant}"',
                fix=f"run it with --platform {DEFAULT_PLATFORM}",
            )
        assert lock.variant is not None
        closure = closure_pins(lock, lock.overlay, lock.variant)
        over, _ = bake(engine, state, log, base, [lock.overlay], registry_form=registry_form,
                       closure=closure)  # fmt: skip
        return over

    return Builder(lock=lock, engine=engine, state=state, log=log, resolve_base=resolve,
                   twin=twin, platform=platform, registry_form=registry_form)  # fmt: skip


def build_all(builder: Builder, specs: Sequence[ImageSpec]) -> list[BuildResult]:
    """Build each spec in order, recording each image under its ``build_key`` (where
    preflight and ``srt recipe`` find the image, and so the facts verify learned)."""
    results = []
    for spec in specs:
        with builder.log.step(
            f"build {spec.name}"
            + (" (over the CPU twin)" if builder.twin else "")
            + (f" for {builder.platform}" if builder.platform != DEFAULT_PLATFORM else "")
        ):
            result = builder.build(spec)
        records.write(builder.state, Build(image_id=result.image_id, reference=result.reference,
                      twin=result.twin, platform=builder.platform, manifest=result.manifest,
                      engine_id=result.engine_id),
                      build_key(builder.lock, spec, builder.twin, builder.platform))  # fmt: skip
        results.append(result)
    return results
