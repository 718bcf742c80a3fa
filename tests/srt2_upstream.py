"""srt-slurm 2.x's real code, for tests: ``../shared/upstream/srt-slurm-2.x-partial.tar.gz``
(upstream's ``migrate.py``, its schema gate and its roles/engine/services expansion, verbatim from
a public code index; see that archive's README and MANIFEST.tsv) extracted once per session and
imported from there. Nothing of it is copied into k3env or its tests: every upstream word a test
compares is what this code says when it runs.
"""

from __future__ import annotations

import importlib
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from k3env.hashing import file_sha256

from .conftest import upstream_dir

ARCHIVE = "srt-slurm-2.x-partial.tar.gz"
# ../shared/upstream/README.md records it by this sha256.
ARCHIVE_SHA256 = "c348c8cf7b1a2f7064c17c455d5df21da0b0b8575588de8bba4d2c15ad5c28e5"


@dataclass(frozen=True)
class Srt2:
    """The extracted source tree and upstream's own modules."""

    root: Path  # the tree (src/, tests/, SCHEMA2.md, ...)
    migrate: ModuleType  # srtctl.core.migrate
    config: ModuleType  # srtctl.core.config: the gate, resolve_config_with_defaults
    roles: ModuleType  # srtctl.core.roles: expand_roles

    def migrated(self, text: str) -> str:
        """``text`` rewritten to schema 2 by upstream's ``migrate_recipe_text``."""
        return str(self.migrate.migrate_recipe_text(text).text)

    def gate(self, data: dict[str, object]) -> str | None:
        """Upstream's gate on a raw recipe: its refusal's words, or None when it loads."""
        try:
            self.config.require_current_schema(data)
        except ValueError as e:
            return str(e)
        return None


@pytest.fixture(scope="session")
def srt2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srt2]:
    upstream = upstream_dir(ARCHIVE)
    if upstream is None:
        pytest.skip(f"../shared/upstream/{ARCHIVE} (srt-slurm 2.x's real code)")
    archive = upstream / ARCHIVE
    assert file_sha256(archive) == ARCHIVE_SHA256, f"{archive} is not the recorded archive"
    dest = tmp_path_factory.mktemp("srt-slurm-2.x")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    (root,) = dest.iterdir()
    sys.path.insert(0, str(root / "src"))
    try:
        yield Srt2(
            root=root,
            migrate=importlib.import_module("srtctl.core.migrate"),
            config=importlib.import_module("srtctl.core.config"),
            roles=importlib.import_module("srtctl.core.roles"),
        )
    finally:
        sys.path.remove(str(root / "src"))
        for name in [m for m in sys.modules if m == "srtctl" or m.startswith("srtctl.")]:
            del sys.modules[name]
