"""Components pinned only by a source commit, turned into wheels by the upstream's own build.

The repository is checked out at the pinned commit on the build host (the host that reaches
the source), then each project directory the lock names is built with ``pip wheel --no-deps
--no-build-isolation`` in a throwaway container of the base, with no network (its build
backend must be in the base) and ``SOURCE_DATE_EPOCH`` = the commit's time. The wheels go
into k3env's wheelhouse and are cached by (commit, projects, base image ID); the builder then
bakes them like pinned wheels, and provenance records their sha256.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from k3env.config.pins import ComponentPin, WheelPin
from k3env.engine.protocol import Engine
from k3env.errors import EngineError
from k3env.hashing import canonical_sha256, file_sha256
from k3env.image import records
from k3env.image.bases import ResolvedBase
from k3env.log import Log
from k3env.runner import require_tool, run
from k3env.state import State
from k3env.versions import canonical_name

SOURCE_FORMAT = 1

# Runs in the base (stdlib only; argv: the project directories under /k3env/src): a module
# of the probe package, run as ``python -c TEXT``.
_BUILD = (resources.files("k3env.probes.probe") / "wheels.py").read_text()


def _wheel_pin(path: Path) -> WheelPin:
    name, version = path.name.split("-")[:2]
    return WheelPin(name=canonical_name(name), version=version, sha256=file_sha256(path))


def source_wheels(
    engine: Engine, state: State, log: Log, base: ResolvedBase, pin: ComponentPin
) -> ComponentPin:
    """``pin`` with the wheels its source commit builds to (``pin`` itself if it pins wheels)."""
    source = pin.source
    if source is None:
        return pin
    key = canonical_sha256(
        {"format": SOURCE_FORMAT, "base": base.config_digest, "source": pin.identity}
    )
    wheelhouse = state.path("wheels")
    record = records.read(state, records.SourceWheels, key)
    if record is not None:
        files = [wheelhouse / f for f in record.files]
        wheels = [_wheel_pin(f) for f in files if f.is_file()]
        if len(wheels) == len(files) and tuple(w.sha256 for w in wheels) == record.sha256:
            return dataclasses.replace(pin, wheels=tuple(wheels))
    git = require_tool("git", "git")
    with tempfile.TemporaryDirectory(prefix="k3env-source-") as tmp:
        repo, out = Path(tmp) / "src", Path(tmp) / "out"
        out.mkdir()
        with log.step(f"check out {pin.name} {source.commit[:12]} from {source.git}"):
            run([git, "clone", "--quiet", "--no-checkout", "--", source.git, str(repo)], log)
            run([git, "-C", str(repo), "checkout", "--quiet", "--detach", source.commit], log)
            head = run([git, "-C", str(repo), "rev-parse", "HEAD"], log, capture=True).strip()
            if head != source.commit:
                raise EngineError(
                    f"{source.git} checked out {head}, not the pinned {source.commit}",
                    where=f"{pin.name}.commit",
                    fix="pin a full commit id that the repository has",
                )
            epoch = run([git, "-C", str(repo), "show", "-s", "--format=%ct", "HEAD"], log,
                        capture=True).strip()  # fmt: skip
            shutil.rmtree(repo / ".git")
        with log.step(f"build {', '.join(source.projects)} into wheels in a throwaway "
                      f"{base.reference}"):  # fmt: skip
            result = engine.run(
                base.image.id,
                [base.pin.python, "-c", _BUILD, *source.projects],
                timeout=3600,
                env={"SOURCE_DATE_EPOCH": epoch, "PYTHONHASHSEED": "0"},
                writable={str(repo): "/k3env/src", str(out): "/k3env/out"},
                user=f"{os.getuid()}:{os.getgid()}",
                progress=log.detail,
            )
        built = sorted(out.glob("*.whl"))
        if result.exit_code != 0 or not built:
            raise EngineError(
                f"building {pin.name} at {source.commit[:12]} failed (exit {result.exit_code}): "
                f"{(result.stdout + result.stderr).strip()[-3000:]}",
                where=f"{pin.name}.build in the lock, over {base.reference}",
                fix="the base must carry the project's build backend (no network in the build); "
                "or pin the release's wheels instead",
            )
        wheelhouse.mkdir(parents=True, exist_ok=True)
        for f in built:
            shutil.copy2(f, wheelhouse / f.name)
    wheels = [_wheel_pin(wheelhouse / f.name) for f in built]
    records.write(state, records.SourceWheels(files=tuple(f.name for f in built),
                  sha256=tuple(w.sha256 for w in wheels)), key)  # fmt: skip
    return dataclasses.replace(pin, wheels=tuple(wheels))
