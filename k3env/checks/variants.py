"""What the lock's component variants say about a tokenizer, from their pinned wheels.

A tokenizer verdict that fails names the releases among ``[variants.NAME]`` whose Dynamo
runtime loads the model type: read from each variant's pinned ``ai-dynamo-runtime`` wheel
(by sha256, in k3env's wheelhouse), in the error text its Rust frontend compiles in
("Currently supported: ..."), the same evidence the probe reads in an image. Cached by the
wheel's sha256.
"""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

from k3env.config.pins import Lock, WheelPin
from k3env.errors import K3envError
from k3env.image import records
from k3env.image.records import Tokenizers
from k3env.image.wheels import download_wheels, held_files
from k3env.log import Log
from k3env.probes.probe.tokenizer import supported_in
from k3env.state import State

RUNTIME = "ai-dynamo-runtime"


def runtime_supports(wheel: WheelPin, state: State, log: Log) -> list[str] | None:
    """The tiktoken model types the pinned runtime wheel's frontend loads (None: it does not
    say, or the wheel could not be had)."""
    record = records.read(state, Tokenizers, wheel.sha256)
    if record is not None:
        return None if record.supported is None else list(record.supported)
    try:
        with tempfile.TemporaryDirectory(prefix="k3env-variant-") as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text(wheel.requirement + "\n")
            path = held_files(download_wheels(req, state, log)).get(wheel.sha256)
    except K3envError as e:
        log.detail(f"{wheel.name} {wheel.version}: not inspected ({e.said})")
        return None
    supported = None
    if path is not None:
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                if member.startswith("dynamo/_core") and ".so" in member:
                    supported = supported_in(z.read(member))
                    break
    records.write(state, Tokenizers(supported=None if supported is None else tuple(supported)),
                  wheel.sha256)  # fmt: skip
    return supported


def tokenizer_note(lock: Lock, model_type: str, state: State, log: Log) -> str | None:
    """One line: which of the lock's variants load ``model_type``, and which do not."""
    loads: list[str] = []
    not_loads: list[str] = []
    for name, variant in sorted(lock.variants.items()):
        component = variant.components.get("dynamo")
        wheel = (
            next((w for w in component.wheels if w.name == RUNTIME), None) if component else None
        )
        if wheel is None:
            continue
        supported = runtime_supports(wheel, state, log)
        if supported is None:
            continue
        (loads if model_type in supported else not_loads).append(
            f"{name} ({RUNTIME} {wheel.version})"
        )
    if not loads and not not_loads:
        return None
    return (
        f"lock variants whose runtime loads {model_type!r}: {', '.join(loads) or 'none'}"
        + (f"; not: {', '.join(not_loads)}" if not_loads else "")
        + " (from each pinned wheel's frontend; `k3env matrix` verifies them)"
    )
