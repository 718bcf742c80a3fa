"""Pinned Python components (Dynamo, aiperf) baked into an image as one deterministic layer.

The lock pins each component as wheel files (name, version, sha256). Over a base image the
wheels come into k3env's wheelhouse (``pip download --require-hashes``) and ``image.install``
installs them with the base's own pip into a host directory (hash-checked ``.pyc``, every
file dated the base's ``created``; a release of the same distribution already in the base
whited out, as pip's uninstall would). That tree is one layer; the image
``k3env/components:<key>`` has a config digest and a manifest digest that are pure functions
of (base's config and manifest, pinned wheels), and says in its labels what it holds and
replaced.

Derived images are then built over it like over any base (patches may target its files).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from k3env import __version__, jsontext
from k3env.config.pins import ComponentPin, Lock
from k3env.config.shapes import platform_name
from k3env.config.twinreq import Pinned, parse_pinned, pinned_line
from k3env.engine.protocol import BaseImage, Engine
from k3env.errors import LockError
from k3env.files import write_atomic
from k3env.hashing import canonical_sha256
from k3env.image.bases import ResolvedBase
from k3env.image.blobs import (
    Manifest,
    keep_config,
    keep_layer,
    keep_manifest,
    kept_config,
    kept_image,
)
from k3env.image.identity import Known, know
from k3env.image.install import add_whiteouts, install_tree, load_checked
from k3env.image.layer import (
    epoch_of,
    image_config,
    image_of_config,
    load_archive,
    tree_layer,
)
from k3env.image.wheels import download_wheels
from k3env.log import Log
from k3env.state import State

# 3: the layer written by image.install + layer.tree_layer, like the twin's; 4: the config over
# the base's own config JSON (not the engine's view of it), loaded with its OCI manifest.
COMPONENTS_FORMAT = 4
REPOSITORY = "k3env/components"
LABEL = "io.k3env.components"


@dataclass(frozen=True, kw_only=True)
class Baked:
    """The components layer over a base: what provenance and reports say of it."""

    key: str
    reference: str
    image_id: str
    components: tuple[ComponentPin, ...]
    replaced: dict[str, list[str]]  # distribution -> versions the base had (whited out)
    files: int

    def as_json(self) -> dict[str, object]:
        wheels = [{"name": w.name, "version": w.version, "sha256": w.sha256}
                  for c in self.components for w in c.wheels]  # fmt: skip
        # Components built from a source commit: where their wheels came from.
        sources = {c.name: c.identity[0] for c in self.components if c.source is not None}
        return {**jsontext.plain(self, leave=("components",)), "wheels": wheels, "sources": sources}


def components_key(base: ResolvedBase, pins: Sequence[ComponentPin]) -> str:
    return canonical_sha256(
        {
            "format": COMPONENTS_FORMAT,
            "base": base.config_digest,
            "components": [{"name": c.name, "wheels": c.identity} for c in pins],
        }
    )


def closure_pins(lock: Lock, pin: ComponentPin, variant: str) -> Pinned:
    """``pin``'s closure file, read after checking it against the lock's sha256: what the
    layer installs beside the release's own wheel."""
    from k3env.config.pinned_files import closure_key, verify_pinned_file
    from k3env.files import read_input

    key = closure_key(variant, pin.name)
    if pin.closure is None or pin.closure_sha256 is None:
        raise LockError(
            f"variant {variant}'s {pin.name} closure is not resolved",
            where=f"{lock.path}: {key}",
            fix=f"run `k3env twin --resolve --variant {variant}`",
        )
    path = verify_pinned_file(lock, pin.closure, pin.closure_sha256, key=key.removesuffix(
        "_sha256"), label=f" (variant {variant})", what="closure file", sha_key=key,
        restore=f"run `k3env twin --resolve --variant {variant}`")  # fmt: skip
    return parse_pinned(read_input(path, error=LockError).decode("utf-8", errors="replace"))


def bake(
    engine: Engine,
    state: State,
    log: Log,
    base: ResolvedBase,
    pins: Sequence[ComponentPin],
    *,
    registry_form: bool = False,
    closure: Pinned | None = None,
) -> tuple[ResolvedBase, Baked]:
    """``base`` + one layer holding ``pins``' wheels (and ``closure``'s, the rest of a
    release's closure where it differs from the base's; the key holds its hash through the
    pins' identity); built once per (base ID, wheels): the engine's image under
    its content tag is a hit (and, with ``registry_form``, only when the state also keeps the
    layer and config a publish sends)."""
    key = components_key(base, pins)
    reference = f"{REPOSITORY}:{key[:20]}"
    hit = _built(engine, state, base, reference, key, registry_form)
    if hit is not None:
        known, labels = hit
        over = _over(base, reference, known.image, known.manifest)
        return over, _baked(key, reference, known.names.config, pins, labels)
    names = ", ".join(f"{w.name} {w.version}" for c in pins for w in c.wheels)
    epoch = epoch_of(base.image.created)
    with tempfile.TemporaryDirectory(prefix="k3env-components-") as tmp:
        req, out, meta = (Path(tmp) / d for d in ("req", "out", "meta"))
        for d in (req, out, meta):
            d.mkdir()
        closure = closure or {}
        lines = [w.requirement for c in pins for w in c.wheels]
        lines += [pinned_line(n, v, hs) for n, (v, hs) in sorted(closure.items())]
        write_atomic(req / "requirements.txt", "".join(x + "\n" for x in lines).encode())
        # The base's own platform: a compiled wheel's file differs by architecture.
        platform = platform_name(base.image.os, base.image.architecture)
        wheelhouse = download_wheels(req / "requirements.txt", state, log, platform)
        with log.step(f"install {names} into a throwaway {base.reference}"):
            info = install_tree(
                engine, base.image.id, base.pin.python,
                requirements=req / "requirements.txt", wheelhouse=wheelhouse, out=out,
                meta=meta, epoch=epoch, pyc="CHECKED_HASH", pip_from_wheel=False,
                replace=[*(w.name for c in pins for w in c.wheels), *sorted(closure)],
                log=log,
                where=f"components over {base.reference}",
            )  # fmt: skip
        add_whiteouts(out, info["replaced"])
        replaced = {n: [r["version"] for r in rs] for n, rs in sorted(info["replaced"].items())}
        labels = dict(base.image.config.get("Labels") or {})
        # What the layer holds is said by the image itself: a cache hit on a clean state
        # reads it back, so everything built over it is the same bytes.
        labels[LABEL] = key
        labels[f"{LABEL}.replaced"] = jsontext.dumps(replaced)
        labels[f"{LABEL}.files"] = str(sum(1 for f in out.rglob("*") if f.is_file()))
        layer = Path(tmp) / "layer.tar"
        diff_id = tree_layer(out, layer, mtime=epoch, owners=False, dirs=info["dirs"])
        config = image_config(
            base.image,
            diff_id=diff_id,
            env=list(base.image.config.get("Env") or []),
            labels=labels,
            created_by=f"k3env components {names}",
            comment=f"k3env {__version__}",
        )
        config_json = jsontext.canonical(config)
        # The engine is sent the registry form (gzip): the blob a publish sends, and the one
        # the manifest names.
        blob = keep_layer(state, layer, diff_id)
        keep_config(state, config_json)
        image_names, manifest, parts = load_archive(
            config_json, [*base.image.diff_ids, diff_id], blob, blob.path,
            base.manifest.layers if base.manifest is not None else None,
        )  # fmt: skip
        if manifest is not None:
            keep_manifest(state, manifest)
        loaded = load_checked(engine, parts, image_names, reference, log)
    image = image_of_config(config_json, loaded, reference)
    return _over(base, reference, image, manifest), _baked(
        key, reference, image_names.config, pins, labels
    )


def _built(
    engine: Engine, state: State, base: ResolvedBase, reference: str, key: str, registry_form: bool
) -> tuple[Known, Mapping[str, str]] | None:
    """The components image the engine holds under ``reference`` for ``key``, as k3env wrote
    it, with its labels; ``None`` (made again, the same bytes): none; its config (what images
    over it are built on) or its manifest lost here, rather than built on from the engine's
    view of it; or, for a publish, its registry form not kept."""
    found = engine.lookup(reference)
    known = know(engine, state, reference) if found and found.labels.get(LABEL) == key else None
    if found is None or known is None or kept_config(state, known.names.config) is None:
        return None
    if known.manifest is None and base.manifest is not None:
        return None
    if registry_form and not kept_image(state, known.names.config):
        return None
    return known, found.labels


def _baked(
    key: str,
    reference: str,
    image_id: str,
    pins: Sequence[ComponentPin],
    labels: Mapping[str, str],
) -> Baked:
    return Baked(
        key=key,
        reference=reference,
        image_id=image_id,
        components=tuple(pins),
        replaced=json.loads(labels.get(f"{LABEL}.replaced") or "{}"),
        files=int(labels.get(f"{LABEL}.files") or 0),
    )


def _over(
    base: ResolvedBase, reference: str, image: BaseImage, manifest: Manifest | None
) -> ResolvedBase:
    return dataclasses.replace(base, reference=reference, image=image, manifest=manifest)
