"""Pinned Python components (Dynamo, aiperf) baked into an image as one deterministic layer.

The lock pins each component as wheel files (name, version, sha256). Over a base image:

1. the wheels come into k3env's wheelhouse (``pip download --require-hashes``);
2. a throwaway container of the base runs the base's own pip, ``--no-deps --require-hashes
   --no-index --ignore-installed --root OUT``, into a host directory, then byte-compiles what
   it installed with hash-checked ``.pyc`` (valid whatever the files' mtimes; the same bytes
   every time with ``PYTHONHASHSEED=0``), and lists what the base already has of these
   distributions (replaced, like pip's uninstall, by whiteouts) and the base's own directory
   modes;
3. the host turns OUT into one layer: sorted entries, owners 0:0, the base's mtime, directory
   modes as in the base. The result is an image ``k3env/components:<key>`` whose ID is the
   sha256 of a config k3env wrote: a pure function of (base image ID, pinned wheels).

Derived images are then built over it like over any base (patches may target its files).
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env import __version__
from k3env.config.lock import ComponentPin
from k3env.engine.protocol import BaseImage, Engine
from k3env.errors import EngineError
from k3env.files import write_atomic
from k3env.hashing import canonical_sha256
from k3env.image.bases import ResolvedBase
from k3env.image.layer import LayerFile, assemble, docker_archive
from k3env.image.wheels import download_wheels
from k3env.log import Log
from k3env.state import State

COMPONENTS_FORMAT = 2  # 2: what the layer replaced and holds is in its labels
REPOSITORY = "k3env/components"
LABEL = "io.k3env.components"
OUT = "/k3env/out"
META = "/k3env/meta"

# Runs in the base with its own Python: stdlib only. argv: the distribution names installed.
_SCRIPT = r"""
import compileall, importlib.metadata as md, json, os, py_compile, re, subprocess, sys

OUT, META = "/k3env/out", "/k3env/meta"
names = set(sys.argv[1:])

def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()

# What the base already holds of these distributions: replaced, as pip would uninstall it.
replaced = {}
for dist in md.distributions():
    name = canon(dist.metadata["Name"] or "")
    if name in names:
        files = [os.path.normpath(str(dist.locate_file(f))) for f in (dist.files or [])]
        replaced.setdefault(name, []).append({"version": dist.version, "files": files})

env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1", PIP_NO_CACHE_DIR="1", HOME="/tmp")
code = subprocess.call(
    [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--require-hashes",
     "--ignore-installed", "--no-compile", "--no-warn-script-location",
     "--disable-pip-version-check", "--root", OUT, "--find-links", "/k3env/wheels",
     "-r", "/k3env/req/requirements.txt"],
    env=env,
)
if code:
    sys.exit(code)
print("byte-compiling (hash-checked .pyc)", flush=True)
compileall.compile_dir(
    OUT, quiet=1, stripdir=OUT, prependdir="/",
    invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
)
# The base's own directories keep their modes and owners in the layer: those pip wrote
# into, and the parents of what it replaces.
wanted = {"/" + os.path.relpath(root, OUT) for root, _, _ in os.walk(OUT) if root != OUT}
for installs in replaced.values():
    for install in installs:
        for path in install["files"]:
            parent = os.path.dirname(path)
            while parent not in ("/", ""):
                wanted.add(parent)
                parent = os.path.dirname(parent)
dirs = {}
for real in wanted:
    if os.path.isdir(real) and not os.path.islink(real):
        st = os.stat(real)
        dirs[real] = [st.st_mode & 0o7777, st.st_uid, st.st_gid]
with open(os.path.join(META, "meta.json"), "w") as f:
    json.dump({"replaced": replaced, "dirs": dirs}, f)
"""


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
        return {
            "key": self.key,
            "reference": self.reference,
            "image_id": self.image_id,
            "wheels": [
                {"name": w.name, "version": w.version, "sha256": w.sha256}
                for c in self.components
                for w in c.wheels
            ],
            # Components built from a source commit: where their wheels came from.
            "sources": {c.name: c.identity[0] for c in self.components if c.source is not None},
            "replaced": self.replaced,
            "files": self.files,
        }


def components_key(base: ResolvedBase, pins: Sequence[ComponentPin]) -> str:
    return canonical_sha256(
        {
            "format": COMPONENTS_FORMAT,
            "base": base.image.id,
            "components": [{"name": c.name, "wheels": c.identity} for c in pins],
        }
    )


def requirements_text(pins: Sequence[ComponentPin]) -> str:
    return "".join(w.requirement + "\n" for c in pins for w in c.wheels)


def bake(
    engine: Engine, state: State, log: Log, base: ResolvedBase, pins: Sequence[ComponentPin]
) -> tuple[ResolvedBase, Baked]:
    """``base`` + one layer holding ``pins``' wheels; built once per (base ID, wheels)."""
    key = components_key(base, pins)
    reference = f"{REPOSITORY}:{key[:20]}"
    found = engine.lookup(reference)
    if found is not None and found.labels.get(LABEL) == key:
        image = engine.inspect(found.id)
        assert image is not None
        return _over(base, reference, image), _baked(key, reference, found.id, pins, found.labels)
    names = ", ".join(f"{w.name} {w.version}" for c in pins for w in c.wheels)
    with tempfile.TemporaryDirectory(prefix="k3env-components-") as tmp:
        req = Path(tmp) / "req"
        req.mkdir()
        write_atomic(req / "requirements.txt", requirements_text(pins).encode())
        wheelhouse = download_wheels(req / "requirements.txt", state, log)
        out, meta = Path(tmp) / "out", Path(tmp) / "meta"
        out.mkdir()
        meta.mkdir()
        with log.step(f"install {names} into a throwaway {base.reference}"):
            result = engine.run(
                base.image.id,
                [base.pin.python, "-c", _SCRIPT, *(w.name for c in pins for w in c.wheels)],
                timeout=1800,
                env={"PYTHONHASHSEED": "0", "SOURCE_DATE_EPOCH": "0"},
                mounts={str(wheelhouse): "/k3env/wheels", str(req): "/k3env/req"},
                writable={str(out): OUT, str(meta): META},
                user=f"{os.getuid()}:{os.getgid()}",
            )
        if result.exit_code != 0:
            raise EngineError(
                f"installing the pinned wheels ({names}) failed (exit {result.exit_code}): "
                f"{(result.stdout + result.stderr).strip()[-3000:]}",
                where=f"components over {base.reference}",
                fix="the base needs `python -m pip` and wheels that fit its Python; "
                "pin wheels built for it in the lock",
            )
        info = json.loads((meta / "meta.json").read_text())
        files = layer_files(out, info)
    replaced = {n: [r["version"] for r in rs] for n, rs in sorted(info["replaced"].items())}
    labels = dict(base.image.config.get("Labels") or {})
    # What the layer holds is said by the image itself: a cache hit on a clean state reads it
    # back, so everything built over it is the same bytes.
    labels[LABEL] = key
    labels[f"{LABEL}.replaced"] = json.dumps(replaced, sort_keys=True)
    labels[f"{LABEL}.files"] = str(sum(1 for f in files if not f.is_dir))
    assembled = assemble(
        base.image,
        files,
        env=list(base.image.config.get("Env") or []),
        labels=labels,
        created_by=f"k3env components {names}",
        comment=f"k3env {__version__}",
    )
    with log.step(f"load the components layer ({len(assembled.layer_tar)} bytes)"):
        loaded = engine.load(docker_archive(assembled, base.image.diff_ids))
    if loaded != assembled.image_id:
        engine.remove(loaded)
        raise EngineError(
            f"the engine stored {loaded}, expected {assembled.image_id}",
            where=reference,
            fix="the engine rewrote the config (a containerd image store?); report it",
        )
    engine.tag(assembled.image_id, *reference.split(":"))
    image = engine.inspect(assembled.image_id)
    assert image is not None
    return _over(base, reference, image), _baked(key, reference, image.id, pins, labels)


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


def _over(base: ResolvedBase, reference: str, image: BaseImage) -> ResolvedBase:
    return dataclasses.replace(base, reference=reference, image=image)


def layer_files(out: Path, info: Mapping[str, Any]) -> list[LayerFile]:
    """OUT's tree as layer entries (owners 0:0; directories that exist in the base keep its
    mode), plus a whiteout for each file of a replaced distribution that OUT does not hold
    (a replaced ``.dist-info`` directory goes whole). ``info``: what the install script
    wrote (``dirs``: path -> [mode, uid, gid]; ``replaced``: name -> [{version, files}])."""
    dirs: dict[str, list[int]] = dict(info.get("dirs") or {})
    files: list[LayerFile] = []
    present: set[str] = set()
    for root, subdirs, names in os.walk(out):
        subdirs.sort()
        rel = "/" + os.path.relpath(root, out) if Path(root) != out else "/"
        if rel != "/":
            mode, uid, gid = dirs.get(rel, [0o755, 0, 0])
            files.append(LayerFile(path=rel, is_dir=True, mode=mode, uid=uid, gid=gid))
            present.add(rel)
        for name in sorted(names):
            path = Path(root) / name
            st = path.lstat()
            target = f"{rel.rstrip('/')}/{name}"
            if not stat.S_ISREG(st.st_mode):
                raise EngineError(
                    f"pip wrote {target}, which is not a regular file",
                    where="components layer",
                    fix="report this as a k3env bug, with the wheel that carries it",
                )
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            files.append(LayerFile(path=target, content=path.read_bytes(), mode=mode))
            present.add(target)
    gone: set[str] = set()
    for installs in dict(info.get("replaced") or {}).values():
        for install in installs:
            for removed in install["files"]:
                parent = os.path.dirname(str(removed))
                if parent.endswith(".dist-info") and parent not in present:
                    gone.add(parent)
                elif str(removed) not in present:
                    gone.add(str(removed))
    parents: set[str] = set()
    for whited in sorted(gone):
        if any(whited.startswith(g + "/") for g in gone):
            continue
        parent = os.path.dirname(whited)
        files.append(LayerFile(path=f"{parent}/.wh.{os.path.basename(whited)}", content=b""))
        while parent not in ("/", "") and parent not in present:
            parents.add(parent)
            parent = os.path.dirname(parent)
    for d in sorted(parents):
        mode, uid, gid = dirs.get(d, [0o755, 0, 0])
        files.append(LayerFile(path=d, is_dir=True, mode=mode, uid=uid, gid=gid))
    return files
