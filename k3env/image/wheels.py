"""Pinned wheels onto the build host: ``pip download --no-deps --require-hashes`` into k3env's
wheelhouse, for the CPU twin's Python and platform (Debian bookworm: CPython 3.11, glibc 2.36).
"""

from __future__ import annotations

from pathlib import Path

from k3env import jsontext
from k3env.config.shapes import DEFAULT_PLATFORM, MACHINES
from k3env.config.twinreq import parse_pinned
from k3env.errors import ConfigError
from k3env.files import read_input
from k3env.log import Log
from k3env.runner import attempt, run
from k3env.state import State


def platform_tags(platform: str = DEFAULT_PLATFORM) -> list[str]:
    """The wheel platform tags of the twin on ``platform``: Debian bookworm has glibc 2.36, so
    every manylinux tag up to that fits. Older pips do not expand a --platform to the older
    tags themselves, so each is listed."""
    machine = MACHINES[platform]
    legacy = (
        ("manylinux2014", "manylinux2010", "manylinux1")
        if machine == "x86_64"
        else ("manylinux2014",)
    )
    return [
        *(f"manylinux_2_{minor}_{machine}" for minor in range(36, 4, -1)),
        *(f"{name}_{machine}" for name in legacy),
        f"linux_{machine}",
    ]


def platform_flags(platform: str = DEFAULT_PLATFORM) -> list[str]:
    """pip's ``--platform`` flags for the twin on ``platform``."""
    return [flag for tag in platform_tags(platform) for flag in ("--platform", tag)]


def held_files(wheelhouse: Path) -> dict[str, Path]:
    """sha256 -> file, for every wheel in the wheelhouse (each file hashed once: the answers
    are kept beside them, keyed by name, size and mtime)."""
    import json

    from k3env.files import write_atomic
    from k3env.hashing import file_sha256

    index_path = wheelhouse / ".sha256.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    fresh = {}
    for f in wheelhouse.glob("*.whl"):
        st = f.stat()
        key = f"{f.name}:{st.st_size}:{st.st_mtime_ns}"
        fresh[key] = index.get(key) or file_sha256(f)
    if fresh != index:
        write_atomic(index_path, jsontext.dumps(fresh).encode())
    return {sha: wheelhouse / key.split(":", 1)[0] for key, sha in fresh.items()}


def download_wheels(
    requirements: Path, state: State, log: Log, platform: str = DEFAULT_PLATFORM
) -> Path:
    """The wheels of a hash-pinned requirements file, in k3env's wheelhouse. When the
    wheelhouse already holds a file for every line, the index is not asked at all."""
    wheelhouse = state.path("wheels")
    wheelhouse.mkdir(parents=True, exist_ok=True)
    held = set(held_files(wheelhouse))
    pinned = parse_pinned(read_input(requirements).decode("utf-8", "replace"))
    wanted = [set(hashes) for _, hashes in pinned.values()]  # per line, the sha256 it accepts
    if wanted and all(w & held for w in wanted):
        log.info(f"    wheelhouse {wheelhouse}: all {len(wanted)} pinned wheels held")
        return wheelhouse
    with log.step(f"wheelhouse {wheelhouse} (pip download --require-hashes)"):
        run(
            [
                "python3",
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--require-hashes",
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--implementation",
                "cp",
                *platform_flags(platform),
                "-d",
                str(wheelhouse),
                "-r",
                str(requirements),
            ],
            log,
            capture=True,
            what="pip download",
        )
    return wheelhouse


# The twin's interpreter and platform (Debian bookworm's CPython 3.11, glibc 2.36), for
# resolving its requirements.
TWIN_PYTHON = "3.11"


def uv_platform(platform: str = DEFAULT_PLATFORM) -> str:
    """uv's ``--python-platform`` for the twin on ``platform``."""
    return f"{MACHINES[platform]}-manylinux_2_36"


def wheel_sha256s(
    requirements: list[str],
    log: Log,
    *,
    find_links: tuple[str, ...] = (),
    platform: str = DEFAULT_PLATFORM,
) -> dict[str, tuple[str, str]]:
    """``name==version`` -> (canonical name, sha256 of the wheel pip picks for the twin's
    platform): what a bump writes into the lock's ``wheels``. With ``find_links``, only those
    directories are searched (no index)."""
    import tempfile

    from k3env.hashing import file_sha256
    from k3env.versions import canonical_name

    with tempfile.TemporaryDirectory(prefix="k3env-wheels-") as tmp:
        argv = [
            "python3", "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", TWIN_PYTHON, "--implementation", "cp", *platform_flags(platform),
            "-d", tmp,
        ]  # fmt: skip
        if find_links:
            argv += ["--no-index", *(a for d in find_links for a in ("--find-links", d))]
        where = ", ".join(find_links) if find_links else "the package index"
        with log.step(f"find the wheels of {', '.join(requirements)} in {where}"):
            code, output = attempt([*argv, *requirements], log)
        if code != 0:
            raise ConfigError(
                f"no wheel of {' / '.join(requirements)} for the twin's platform in {where}: "
                + (output.strip().splitlines() or ["(no output)"])[-1],
                where="pip download",
                fix="bump to a release that publishes wheels, or pin its wheels by hand",
            )
        found = {}
        for f in sorted(Path(tmp).glob("*.whl")):
            found[canonical_name(f.name.split("-", 1)[0])] = file_sha256(f)
    out = {}
    for r in requirements:
        name = canonical_name(r.split("==", 1)[0])
        if name in found:
            out[r] = (name, found[name])
    return out
