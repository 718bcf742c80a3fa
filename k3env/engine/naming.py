"""Which name an engine gives an image: its image store decides.

dockerd keeps images in one of two stores, and each names an image by another digest:

- the classic store (graph drivers: overlay2, ...; Docker 20.10's only one, still Docker 28's
  default) calls an image by its **config digest**, the sha256 of the image config JSON;
- the containerd image store (``"features": {"containerd-snapshotter": true}``, the default of
  Docker 29 on a new install) calls it by its **manifest digest**, the sha256 of the OCI
  manifest that names that config and the layers (moby daemon/containerd/image_inspect.go:
  ``ID: target.Digest``), as a registry does.

k3env writes both for every image it loads (the config, and one OCI manifest of its registry
form, in the same archive: ``image.layer``), so before a load it knows the ID the engine must
answer, and what it records of an image (labels, provenance, records) is the config digest,
the same on either store. ``engine_id`` is the one rule that turns an image's names into the
engine's ID: every comparison of an engine's image ID with what k3env wrote goes through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k3env.errors import EngineError

CLASSIC = "classic"
CONTAINERD = "containerd"

# What /info's DriverStatus says on the containerd image store: [["driver-type",
# "io.containerd.snapshotter.v1"]] (moby daemon/containerd/service.go, LayerStoreStatus); a
# graph driver lists its own facts there (backing filesystem, d_type, ...), never that pair.
_SNAPSHOTTER = "io.containerd.snapshotter."


@dataclass(frozen=True, kw_only=True)
class ImageNames:
    """The two digests of an image k3env wrote."""

    config: str  # sha256 of the config JSON: the classic store's image ID
    # sha256 of its OCI manifest: the containerd store's image ID. None: not known (an image
    # over a base whose manifest k3env was never given, on a classic store, where it is not
    # needed).
    manifest: str | None = None


def store_of(info: Mapping[str, Any]) -> str:
    """The image store of the engine whose ``GET /info`` answered ``info``."""
    status = info.get("DriverStatus") or []
    for pair in status if isinstance(status, list) else []:
        if (
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and pair[0] == "driver-type"
            and str(pair[1]).startswith(_SNAPSHOTTER)
        ):
            return CONTAINERD
    return CLASSIC


def engine_id(store: str, names: ImageNames) -> str:
    """The ID an engine with image store ``store`` gives the image named ``names``."""
    if store == CLASSIC:
        return names.config
    if store != CONTAINERD:
        raise ValueError(f"unknown image store {store!r}")
    if names.manifest is None:
        raise EngineError(
            f"the engine keeps images in the containerd image store, which names an image by "
            f"its manifest digest, and k3env does not know the manifest of image "
            f"{names.config[:19]} (its base's manifest was never read)",
            where="the engine's image store",
            fix="build over a base k3env can read the manifest of (pinned by digest in a "
            "reachable registry, or the CPU twin), or use an engine on the classic store",
        )
    return names.manifest
