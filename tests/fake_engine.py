"""An in-memory ``Engine`` for unit tests: the builder, verify, bump and handoff without Docker.

``FakeEngine`` implements every verb of ``k3env.engine.protocol.Engine`` structurally (no
inheritance) over dictionaries, close enough to dockerd that k3env's real code paths run
against it unchanged:

- images are stored by ID with their config (a ``BaseImage``), tags and digest references
  point at IDs, and each image's filesystem is the union of its layers (a layer store keyed by
  diff ID, with the chain IDs the engine holds, like dockerd's);
- ``load`` really parses the docker-archive k3env writes (``manifest.json``, the config JSON,
  the layer tars); the image ID is ``sha256:`` + the sha256 of the config bytes, a layer that
  is neither in the archive nor in the layer store fails the load as dockerd does, and a layer
  whose sha256 is not the config's diff ID is refused;
- ``pull`` and ``push`` talk to an in-memory registry (``publish`` seeds it); a push returns a
  digest derived from the image ID and records what was sent;
- nothing runs: ``run`` asks the handlers a test registers (``on_run``), and answers the
  builder's module lookup (``python -c SCRIPT MODULE...``) from the image's files;
- every call is logged in ``calls`` as ``(verb, args)``, so a test can assert what did *not*
  happen (a cache hit makes no ``load``).

Below the engine: ``write_project``, a lock + spec + container patch pinning published bases
by digest (the unit-test twin of ``tests/engine/conftest.py``'s ``write_project``).
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import io
import json
import posixpath
import tarfile
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3env.engine.naming import CLASSIC
from k3env.engine.protocol import (
    BaseImage,
    Engine,
    HistoryEntry,
    ImageFile,
    Progress,
    PushResult,
    RunResult,
    Tagged,
)
from k3env.errors import EngineError, K3envError
from k3env.hashing import sha256_digest

from .project import MODULE_FILE

CREATED = "2024-05-06T07:08:09Z"
SYS_PATH = ("/usr/lib/python3/dist-packages",)
# What `docker create` adds to a container's filesystem (its init layer), which `docker
# export` streams with the image's files, with the container's creation time as mtime.
CONTAINER_FILES = ("/.dockerenv", "/dev/console", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf")
CONTAINER_DIRS = ("/dev", "/dev/pts", "/dev/shm", "/etc", "/proc", "/sys")
CONTAINER_LINKS = {"/etc/mtab": "/proc/mounts"}

FileLike = bytes | str | ImageFile
# handler(image reference as passed, argv, env, mounts) -> a result, or None: not mine.
RunHandler = Callable[[str, list[str], dict[str, str], dict[str, str]], RunResult | None]


# --- layers and images (pure) --------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Layer:
    diff_id: str
    files: Mapping[str, ImageFile]
    dirs: frozenset[str] = frozenset()
    links: Mapping[str, str] = field(default_factory=dict)  # symlink path -> target
    whiteouts: frozenset[str] = frozenset()  # paths this layer deletes (.wh.NAME)
    mtimes: Mapping[str, int] = field(default_factory=dict)  # path -> mtime, as in the tar


@dataclass(frozen=True, kw_only=True)
class FakeImage:
    """An image as the fake stores it: its config and its layers, base first."""

    image: BaseImage
    layers: tuple[Layer, ...]
    config_json: bytes

    @property
    def id(self) -> str:
        return self.image.id


@dataclass(kw_only=True)
class Filesystem:
    files: dict[str, ImageFile] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)
    mtimes: dict[str, int] = field(default_factory=dict)

    def realpath(self, path: str) -> str | None:
        """``path`` with every symlink resolved (``None``: a loop)."""
        parts = [p for p in path.split("/") if p]
        cur = "/"
        hops = 0
        i = 0
        while i < len(parts):
            nxt = posixpath.join(cur, parts[i])
            if nxt in self.links:
                hops += 1
                if hops > 40:
                    return None
                target = posixpath.normpath(posixpath.join(cur, self.links[nxt]))
                parts = [p for p in target.split("/") if p] + parts[i + 1 :]
                cur, i = "/", 0
                continue
            cur = nxt
            i += 1
        return posixpath.normpath(cur)

    def file(self, path: str) -> ImageFile | None:
        real = self.realpath(path)
        return self.files.get(real) if real else None


def _norm(path: str) -> str:
    return "/" + path.removeprefix("./").strip("/")


def _image_file(path: str, value: FileLike) -> ImageFile:
    if isinstance(value, ImageFile):
        return dataclasses.replace(value, path=path)
    content = value.encode() if isinstance(value, str) else value
    return ImageFile(path=path, content=content, mode=0o644, uid=0, gid=0)


def layer_tar(files: Mapping[str, FileLike], *, mtime: int = 0) -> bytes:
    """A deterministic layer tar of ``files`` (absolute paths), parents included."""
    entries = {_norm(p): _image_file(_norm(p), v) for p, v in files.items()}
    dirs = {d for p in entries for d in _parents(p)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(dirs | set(entries)):
            info = tarfile.TarInfo(path.lstrip("/") + ("/" if path in dirs else ""))
            info.mtime = mtime
            info.uname = info.gname = ""
            if path in dirs:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            f = entries[path]
            info.mode, info.uid, info.gid, info.size = f.mode, f.uid, f.gid, len(f.content)
            tar.addfile(info, io.BytesIO(f.content))
    return buf.getvalue()


def _parents(path: str) -> list[str]:
    out = []
    d = posixpath.dirname(path)
    while d not in ("/", ""):
        out.append(d)
        d = posixpath.dirname(d)
    return out


def parse_layer(data: bytes, diff_id: str | None = None) -> Layer:
    """A layer tar as a ``Layer`` (regular files, directories, symlinks, hard links, whiteouts)."""
    files: dict[str, ImageFile] = {}
    dirs: set[str] = set()
    links: dict[str, str] = {}
    whiteouts: set[str] = set()
    mtimes: dict[str, int] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for m in tar:
                path = _norm(m.name)
                if path == "/":
                    continue
                name = posixpath.basename(path)
                if name.startswith(".wh."):
                    whiteouts.add(posixpath.join(posixpath.dirname(path), name[4:]))
                    continue
                mtimes[path] = int(m.mtime)
                if m.isdir():
                    dirs.add(path)
                elif m.issym():
                    links[path] = m.linkname
                elif m.islnk():
                    files[path] = dataclasses.replace(files[_norm(m.linkname)], path=path)
                elif m.isfile():
                    f = tar.extractfile(m)
                    files[path] = ImageFile(
                        path=path,
                        content=f.read() if f else b"",
                        mode=m.mode,
                        uid=m.uid,
                        gid=m.gid,
                    )
    except (tarfile.TarError, KeyError) as e:
        raise EngineError(f"docker load failed: bad layer tar: {e}", where="docker load") from e
    return Layer(
        diff_id=diff_id or sha256_digest(data),
        files=files,
        dirs=frozenset(dirs),
        links=links,
        whiteouts=frozenset(whiteouts),
        mtimes=mtimes,
    )


def merge(layers: Iterable[Layer]) -> Filesystem:
    fs = Filesystem()
    for layer in layers:
        for gone in layer.whiteouts:
            for table in (fs.files, fs.links):
                for p in [p for p in table if p == gone or p.startswith(gone + "/")]:
                    del table[p]
            fs.dirs = {d for d in fs.dirs if d != gone and not d.startswith(gone + "/")}
        for table in (fs.files, fs.links):
            for p in [p for p in table if p in layer.dirs]:
                del table[p]
        fs.dirs |= layer.dirs
        for p in layer.files:
            fs.links.pop(p, None)
        for p in layer.links:
            fs.files.pop(p, None)
        fs.files.update(layer.files)
        fs.links.update(layer.links)
        fs.mtimes.update(layer.mtimes)
    return fs


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The OCI chain ID of each layer prefix: how dockerd's layer store finds a layer."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else sha256_digest(f"{out[-1]} {d}".encode()))
    return out


def config_json(config: Mapping[str, Any]) -> bytes:
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def base_image_of(raw: bytes, image_id: str | None = None) -> BaseImage:
    """What ``inspect`` answers for an image whose config JSON is ``raw``."""
    doc = json.loads(raw)
    return BaseImage(
        id=image_id or sha256_digest(raw),
        created=doc.get("created") or CREATED,
        architecture=doc.get("architecture") or "amd64",
        os=doc.get("os") or "linux",
        variant=doc.get("variant") or None,
        config=doc.get("config") or {},
        diff_ids=tuple(doc.get("rootfs", {}).get("diff_ids") or ()),
        history=tuple(
            HistoryEntry(
                created=h.get("created", ""),
                created_by=h.get("created_by", ""),
                comment=h.get("comment", ""),
                empty_layer=bool(h.get("empty_layer", False)),
            )
            for h in doc.get("history") or ()
        ),
    )


def make_image(
    *layers: Mapping[str, FileLike],
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
    cmd: Sequence[str] | None = ("python3",),
    entrypoint: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
    workdir: str = "",
    volumes: Sequence[str] = (),
    created: str = CREATED,
) -> FakeImage:
    """A deterministic image: one layer per mapping of ``{absolute path: content}``.

    Same arguments, same bytes, same diff IDs and image ID, on any engine."""
    tars = [layer_tar(files) for files in layers]
    parsed = tuple(parse_layer(t) for t in tars)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Env": list(env),
            "Cmd": list(cmd) if cmd else None,
            "Entrypoint": list(entrypoint) if entrypoint else None,
            "Labels": dict(labels) if labels else None,
            "WorkingDir": workdir,
            "Volumes": {v: {} for v in volumes} or None,
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in parsed]},
        "history": [
            {"created": created, "created_by": f"fake layer {i}"} for i in range(len(parsed))
        ],
    }
    raw = config_json(config)
    return FakeImage(image=base_image_of(raw), layers=parsed, config_json=raw)


def manifest_digest(image_id: str) -> str:
    """The registry digest the fake gives an image: a function of its ID only."""
    return sha256_digest(f"fake-manifest {image_id}".encode())


# --- the engine ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Published:
    """An image in the fake registry, as a lock pins it."""

    repository: str
    tag: str
    digest: str
    image: FakeImage

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"


@dataclass(frozen=True, kw_only=True)
class PushRecord:
    repository: str
    tag: str
    image_id: str
    digest: str


def _normalize_ref(ref: str) -> str:
    if ref.startswith("sha256:") or "@" in ref:
        return ref
    return ref if ":" in ref.rsplit("/", 1)[-1] else f"{ref}:latest"


def _repository_of(ref: str) -> str:
    if "@" in ref:
        return ref.split("@", 1)[0]
    head, _, name = ref.rpartition("/")
    return (f"{head}/" if head else "") + name.split(":", 1)[0]


class FakeEngine:
    """Dockerd in dictionaries. See the module docstring."""

    def __init__(self, *, sys_path: Sequence[str] = SYS_PATH) -> None:
        self.images: dict[str, FakeImage] = {}
        self.refs: dict[str, str] = {}  # "repo:tag" and "repo@digest" -> image ID
        self.layers: dict[str, Layer] = {}  # diff ID -> layer
        self.chains: set[str] = set()  # chain IDs in the layer store
        self.registry: dict[str, FakeImage] = {}  # "repo:tag" and "repo@digest" -> image
        self.registry_layers: set[tuple[str, str]] = set()  # (repository, diff ID) pushed
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.pushes: list[PushRecord] = []
        self.archives: list[bytes] = []  # every archive handed to load, in order
        self.sys_path = tuple(sys_path)
        # An engine that re-serializes the config: the loaded ID is not our digest.
        self.rewrite_configs = False
        self.store = CLASSIC  # the image store it plays: IDs are config digests
        self.container_created = 1_700_000_000  # mtime of a container's init layer in exports
        self._run_handlers: list[RunHandler] = []
        self._failures: dict[str, K3envError] = {}

    # -- test helpers ----------------------------------------------------------------------
    def add(self, image: FakeImage, *refs: str) -> BaseImage:
        """Put ``image`` in the engine (as if loaded), under ``refs``."""
        self._store(image)
        for ref in refs:
            self.refs[_normalize_ref(ref)] = image.id
        return image.image

    def publish(self, repository: str, image: FakeImage, tag: str = "1") -> Published:
        """Put ``image`` in the fake registry as ``repository:tag``; the engine lacks it."""
        digest = manifest_digest(image.id)
        self.registry[f"{repository}:{tag}"] = image
        self.registry[f"{repository}@{digest}"] = image
        self.registry_layers |= {(repository, layer.diff_id) for layer in image.layers}
        return Published(repository=repository, tag=tag, digest=digest, image=image)

    def on_run(self, handler: RunHandler) -> None:
        """Answer ``run`` calls: the latest handler first; one returning None passes."""
        self._run_handlers.append(handler)

    def fail_next(self, verb: str, error: K3envError | None = None) -> None:
        """Make the next call of ``verb`` raise ``error`` (an ``EngineError`` by default)."""
        self._failures[verb] = error or EngineError(f"{verb} failed (injected)", where="fake")

    @property
    def verbs(self) -> list[str]:
        return [verb for verb, _ in self.calls]

    def mark(self) -> int:
        """A point in the call log; ``verbs_since(mark)`` lists the calls after it."""
        return len(self.calls)

    def verbs_since(self, mark: int) -> list[str]:
        return [verb for verb, _ in self.calls[mark:]]

    def resolve(self, ref: str) -> str | None:
        """The image ID ``ref`` names here (ID, short ID, repo:tag, repo@digest)."""
        if ref in self.images:
            return ref
        hexpart = ref.removeprefix("sha256:")
        if len(hexpart) >= 12 and all(c in "0123456789abcdef" for c in hexpart):
            found = [i for i in self.images if i.removeprefix("sha256:").startswith(hexpart)]
            if len(found) == 1:
                return found[0]
            if ref.startswith("sha256:"):
                return None
        return self.refs.get(_normalize_ref(ref))

    def filesystem(self, ref: str) -> Filesystem:
        image_id = self.resolve(ref)
        if image_id is None:
            raise KeyError(ref)
        return merge(self.images[image_id].layers)

    def text(self, ref: str, path: str) -> str | None:
        f = self.filesystem(ref).file(path)
        return f.content.decode() if f else None

    def tags(self, repository: str) -> list[str]:
        """The ``repository:tag`` references the engine holds for ``repository``."""
        return sorted(
            r for r in self.refs if "@" not in r and _repository_of(r) == repository.rstrip("/")
        )

    # -- internals -------------------------------------------------------------------------
    def _call(self, verb: str, *args: Any) -> None:
        self.calls.append((verb, args))
        error = self._failures.pop(verb, None)
        if error is not None:
            raise error

    def _store(self, image: FakeImage) -> None:
        for layer in image.layers:
            self.layers.setdefault(layer.diff_id, layer)
        self.chains |= set(chain_ids([layer.diff_id for layer in image.layers]))
        self.images[image.id] = image

    def _require(self, ref: str, what: str) -> FakeImage:
        image_id = self.resolve(ref)
        if image_id is None:
            raise EngineError(
                f"{what}: No such image: {ref}", where=ref, fix="build or pull it first"
            )
        return self.images[image_id]

    def _drop_image(self, image_id: str) -> None:
        del self.images[image_id]
        for ref in [r for r, i in self.refs.items() if i == image_id]:
            del self.refs[ref]
        # Layers no image uses any more leave the layer store, as with dockerd.
        used = [chain_ids(i.image.diff_ids) for i in self.images.values()]
        self.chains = {c for chain in used for c in chain}
        kept = {d for i in self.images.values() for d in i.image.diff_ids}
        self.layers = {d: layer for d, layer in self.layers.items() if d in kept}

    # -- reading ---------------------------------------------------------------------------
    def describe(self) -> str:
        self._call("describe")
        return f"fake engine (in memory, {len(self.images)} images)"

    def image_store(self) -> str:
        return self.store

    def inspect(self, ref: str) -> BaseImage | None:
        self._call("inspect", ref)
        image_id = self.resolve(ref)
        return self.images[image_id].image if image_id else None

    def lookup(self, ref: str) -> Tagged | None:
        self._call("lookup", ref)
        image_id = self.resolve(ref)
        if image_id is None:
            return None
        labels = self.images[image_id].image.config.get("Labels") or {}
        return Tagged(id=image_id, labels=dict(labels))

    def read_files(self, image: str, paths: Sequence[str]) -> dict[str, ImageFile | None]:
        self._call("read_files", image, tuple(paths))
        fs = merge(self._require(image, "read_files").layers)
        out: dict[str, ImageFile | None] = {}
        for path in paths:
            out[path] = fs.file(path)
        return out

    # -- running ---------------------------------------------------------------------------
    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        mounts: Mapping[str, str] | None = None,
        writable: Mapping[str, str] | None = None,
        user: str | None = None,
        progress: Progress | None = None,
        shm_bytes: int | None = None,
    ) -> RunResult:
        self._call("run", image, tuple(argv))
        self._require(image, "cannot create a container")
        for handler in reversed(self._run_handlers):
            # Read-write mounts too: a handler playing an installer writes into them.
            both = {**(mounts or {}), **(writable or {})}
            result = handler(image, list(argv), dict(env or {}), both)
            if result is not None:
                return result
        result = self._module_lookup(image, list(argv))
        if result is not None:
            return result
        return RunResult(
            exit_code=127, stdout="", stderr=f"fake engine: no run handler for {list(argv)!r}"
        )

    def _module_lookup(self, image: str, argv: list[str]) -> RunResult | None:
        """The builder's ``python -c FIND_MODULES_SCRIPT [--read] MODULE...``, answered from the
        files (with ``--read``: each found file's bytes and stat too, as the script prints)."""
        if len(argv) < 3 or argv[1] != "-c" or "def find_module_file" not in argv[2]:
            return None
        fs = self.filesystem(image)
        found: dict[str, str | None] = {}
        read = argv[3:4] == ["--read"]
        for module in argv[4:] if read else argv[3:]:
            found[module] = None
            for d in self.sys_path:
                stem = posixpath.join(d, *module.split("."))
                for cand in (stem + ".py", posixpath.join(stem, "__init__.py")):
                    real = fs.realpath(cand)
                    if real is not None and real in fs.files:
                        found[module] = real
                        break
                if found[module]:
                    break
        if not read:
            return RunResult(exit_code=0, stdout=json.dumps(found) + "\n", stderr="")
        files = {
            f: {"b64": base64.b64encode(fs.files[f].content).decode(), "mode": fs.files[f].mode,
                "uid": fs.files[f].uid, "gid": fs.files[f].gid}
            for f in sorted({f for f in found.values() if f})
        }  # fmt: skip
        doc = {"modules": found, "files": files}
        return RunResult(exit_code=0, stdout=json.dumps(doc) + "\n", stderr="")

    # -- writing ---------------------------------------------------------------------------
    def pull(self, reference: str, progress: Progress) -> None:
        self._call("pull", reference)
        image = self.registry.get(_normalize_ref(reference))
        if image is None:
            raise EngineError(
                f"pull failed: manifest for {reference} not found: manifest unknown",
                where=reference,
                fix="check that the registry is reachable and the digest exists",
            )
        for layer in image.layers:
            progress(f"{layer.diff_id.removeprefix('sha256:')[:12]} Pull complete")
        self._store(image)
        self.refs[_normalize_ref(reference)] = image.id

    def load(self, archive: bytes | Path | tuple[bytes | Path, ...]) -> str:
        parts = archive if isinstance(archive, tuple) else (archive,)
        archive = b"".join(p.read_bytes() if isinstance(p, Path) else p for p in parts)
        self._call("load", sha256_digest(archive))
        self.archives.append(archive)
        members: dict[str, bytes] = {}
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
                for m in tar:
                    f = tar.extractfile(m) if m.isfile() else None
                    if f is not None:
                        members[m.name] = f.read()
            manifest = json.loads(members["manifest.json"])
        except (tarfile.TarError, KeyError, ValueError) as e:
            raise EngineError(
                f"docker load failed: not a docker archive: {e!r}", where="docker load"
            ) from e
        loaded = []
        for entry in manifest:
            raw = members.get(entry["Config"])
            if raw is None:
                raise EngineError(
                    f"docker load failed: open {entry['Config']}: no such file or directory",
                    where="docker load",
                )
            doc = json.loads(raw)
            diff_ids = list(doc["rootfs"]["diff_ids"])
            if len(diff_ids) != len(entry["Layers"]):
                raise EngineError(
                    "docker load failed: invalid manifest, layers length mismatch: expected "
                    f"{len(diff_ids)}, got {len(entry['Layers'])}",
                    where="docker load",
                )
            chains = chain_ids(diff_ids)
            new_layers: list[Layer] = []
            for i, (name, diff_id) in enumerate(zip(entry["Layers"], diff_ids, strict=True)):
                data = members.get(name)
                if chains[i] in self.chains and diff_id in self.layers:
                    new_layers.append(self.layers[diff_id])
                    continue
                if data is not None and data[:2] == b"\x1f\x8b":
                    data = gzip.decompress(data)  # dockerd decompresses a layer file it loads
                if data is None:
                    # dockerd looks the chain up in its layer store, then opens the file.
                    raise EngineError(
                        f"docker load failed: open /var/lib/docker/tmp/docker-import-0/{name}: "
                        "no such file or directory",
                        where="docker load",
                        fix="check that the base image is in this engine (k3env pulls it)",
                    )
                actual = sha256_digest(data)
                if actual != diff_id:
                    raise EngineError(
                        f"docker load failed: invalid diffID for layer {i}: expected "
                        f"{diff_id!r}, got {actual!r}",
                        where="docker load",
                    )
                new_layers.append(parse_layer(data, diff_id))
            if self.rewrite_configs:
                raw = json.dumps(doc, indent=2, sort_keys=True).encode()
            image = FakeImage(image=base_image_of(raw), layers=tuple(new_layers), config_json=raw)
            self._store(image)
            for ref in entry.get("RepoTags") or ():
                self.refs[_normalize_ref(ref)] = image.id
            loaded.append(image.id)
        if len(loaded) != 1:
            raise EngineError(
                f"docker load gave {len(loaded)} images, expected 1", where="docker load", fix=""
            )
        return loaded[0]

    def tag(self, image_id: str, repository: str, tag: str) -> None:
        self._call("tag", image_id, repository, tag)
        image = self._require(image_id, "tag failed")
        self.refs[f"{repository}:{tag}"] = image.id

    def remove(self, ref: str) -> None:
        self._call("remove", ref)
        image_id = self.resolve(ref)
        if image_id is None:
            return
        if image_id == ref or ref.removeprefix("sha256:") in image_id:
            repos = {_repository_of(r) for r, i in self.refs.items() if i == image_id}
            if len(repos) > 1:
                raise EngineError(
                    f"cannot remove image: conflict: unable to delete {image_id[7:19]} (must be "
                    "forced) - image is referenced in multiple repositories",
                    where=ref,
                )
            self._drop_image(image_id)
            return
        del self.refs[_normalize_ref(ref)]
        if image_id not in self.refs.values():
            self._drop_image(image_id)

    def import_rootfs(self, tarball: Path, repository: str, tag: str) -> str:
        self._call("import_rootfs", str(tarball), repository, tag)
        try:
            data = tarball.read_bytes()
        except OSError as e:
            raise EngineError(f"docker import failed: {e}", where=str(tarball)) from e
        layer = parse_layer(data)
        doc = {
            "architecture": "amd64",
            "os": "linux",
            "created": CREATED,
            "config": {"Env": None, "Cmd": None, "Entrypoint": None, "Labels": None},
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
            "history": [{"created": CREATED, "created_by": "", "comment": "Imported from -"}],
        }
        raw = config_json(doc)
        image = FakeImage(image=base_image_of(raw), layers=(layer,), config_json=raw)
        self._store(image)
        self.refs[f"{repository}:{tag}"] = image.id
        return image.id

    def push(self, repository: str, tag: str, progress: Progress) -> PushResult:
        self._call("push", repository, tag)
        image_id = self.resolve(f"{repository}:{tag}")
        if image_id is None:
            raise EngineError(
                f"push failed: An image does not exist locally with the tag: {repository}",
                where=f"{repository}:{tag}",
                fix="check that the registry is up (curl http://REGISTRY/v2/)",
            )
        image = self.images[image_id]
        layers: dict[str, str] = {}
        for layer in image.layers:
            short = layer.diff_id.removeprefix("sha256:")[:12]
            known = (repository, layer.diff_id) in self.registry_layers
            layers[short] = "Layer already exists" if known else "Pushed"
            self.registry_layers.add((repository, layer.diff_id))
            progress(f"{short} {layers[short]}")
        digest = manifest_digest(image_id)
        self.registry[f"{repository}:{tag}"] = image
        self.registry[f"{repository}@{digest}"] = image
        self.refs[f"{repository}@{digest}"] = image_id
        self.pushes.append(
            PushRecord(repository=repository, tag=tag, image_id=image_id, digest=digest)
        )
        return PushResult(digest=digest, layers=layers)

    def export(self, image: str) -> Generator[bytes | bytearray, None, None]:
        """The image's filesystem as a tar stream (its files' own mtimes), with what a
        container's init layer adds to it (at ``self.container_created``)."""
        self._call("export", image)
        fs = merge(self._require(image, "cannot create a container").layers)
        files = {**fs.files}
        links = {**fs.links, **CONTAINER_LINKS}
        for p in CONTAINER_FILES:
            files[p] = ImageFile(path=p, content=b"", mode=0o644, uid=0, gid=0)
        dirs = set(fs.dirs) | set(CONTAINER_DIRS)
        dirs |= {d for p in (*files, *links) for d in _parents(p)}
        init = {*CONTAINER_FILES, *CONTAINER_DIRS, *CONTAINER_LINKS}
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(dirs | set(files) | set(links)):
                info = tarfile.TarInfo(path.lstrip("/"))
                info.mtime = self.container_created if path in init else fs.mtimes.get(path, 0)
                if path in dirs:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                elif path in links:
                    info.type, info.linkname = tarfile.SYMTYPE, links[path]
                    tar.addfile(info)
                else:
                    f = files[path]
                    info.mode, info.uid, info.gid, info.size = f.mode, f.uid, f.gid, len(f.content)
                    tar.addfile(info, io.BytesIO(f.content))
        data = buf.getvalue()
        return (data[i : i + 65536] for i in range(0, len(data), 65536))


# --- a base over fake layers ---------------------------------------------------------------------
def python_base(module_text: str, **config: Any) -> FakeImage:
    """A two-layer "Debian + Python" base whose ``k3test.mod`` holds ``module_text``."""
    return make_image(
        {
            "/usr/bin/python3": ImageFile(
                path="/usr/bin/python3", content=b"\x7fELF fake", mode=0o755, uid=0, gid=0
            ),
            "/etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n',
        },
        {
            "/usr/lib/python3/dist-packages/k3test/__init__.py": b"",
            MODULE_FILE: module_text,
        },
        **config,
    )


def _as_engine(fake: FakeEngine) -> Engine:
    """Never called: mypy checks here that the fake is an ``Engine`` (the protocol), so the
    unit tests' engine cannot drift from the real one's interface."""
    return fake
