"""enroot's provenance line (``# enroot-provenance: <uri>``, the first line of /etc/rc from enroot
4.2 on), read as enroot's own ``src/docker.sh`` writes it, and matched against the image a
squashfs claims to be; and which enroot release writes it, from a cluster profile's
``[runtime.enroot]``.

The forms, from NVIDIA/enroot main at 8ea147d (``../shared/upstream/enroot-main-8ea147d.tar.gz``,
``src/docker.sh``): ``docker::configure`` writes ``printf '# enroot-provenance: %s\\n' "${uri}"``
(line 360) with the URI its caller passes. ``docker::daemon::import`` (line 613) passes the
``dockerd://REF`` or ``podman://REF`` it was given, REF matching ``[[:alnum:]/._:-]+`` (line 574:
a name, a name:tag, an image ID; never ``@``). ``docker::_prepare_layers`` (line 333) passes the
registry URI rewritten from what ``docker::_parse_uri`` found: ``docker://REGISTRY#IMAGE:TAG``,
REGISTRY canonical (Docker Hub as registry-1.docker.io), the user dropped, TAG ``latest`` when
none was given, and a digest in TAG's place (``docker://R#IMAGE@sha256:H`` and ``...:T@sha256:H``
are written ``docker://R#IMAGE:sha256:H``: the digest wins over the tag).
Nothing else is a line enroot writes; anything else is refused by name. No I/O here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from k3env.config.cluster import Cluster, RuntimePin
from k3env.config.shapes import control_character
from k3env.errors import ConfigError
from k3env.quoting import one_line

PREFIX = "# enroot-provenance: "
MAX_URI = 1024  # enroot sets none; a reference is at most 255 + a registry + a digest
# The first release that writes the line, and the main commit this repository carries it at
# (8ea147d still calls itself 4.1.2: its VERSION file is bumped at release).
FIRST_RELEASE = "4.2"
MAIN_COMMITS = {"8ea147d337da60cb1c557140f3a85cdf0d620968": "main 8ea147d (enroot 4.2's change)"}

_DAEMON_REF = re.compile(r"[A-Za-z0-9/._:-]+")  # docker::daemon::import's reg_image
_REGISTRY = re.compile(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?")  # host[:port], as k3env pushes to
_IMAGE = re.compile(r"[a-z0-9/._-]+")  # docker::_parse_uri's reg_image
_TAG = re.compile(r"[A-Za-z0-9._-][A-Za-z0-9._:-]{0,127}")  # reg_tag, as a registry bounds it
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]{64}")
_WHERE = "/etc/rc, its first line (enroot-provenance)"
_FIX = "re-import the image by the URI `k3env push` printed; a line you did not write is tampering"


@dataclass(frozen=True, kw_only=True)
class EnrootUri:
    """A URI as enroot writes it on the provenance line."""

    scheme: str  # docker, dockerd or podman
    image: str  # the daemon's REF as given; the registry's repository
    registry: str | None = None  # docker:// only
    tag: str | None = None  # docker:// only: a tag, or sha256:HEX

    @property
    def text(self) -> str:
        if self.scheme == "docker":
            return f"docker://{self.registry}#{self.image}:{self.tag}"
        return f"{self.scheme}://{self.image}"


@dataclass(frozen=True, kw_only=True)
class ThisImage:
    """What names the image a squashfs claims to be: its reference (``k3env/NAME:TAG``, from its
    provenance file), and, where this host's records say, its digests (config, manifest, the
    engine's ID) and its push (``REGISTRY/REPO:TAG`` and the manifest and index digests)."""

    reference: str | None
    digests: tuple[tuple[str, str], ...] = ()  # (what, sha256:HEX)
    pushed: str | None = None
    pushed_digests: tuple[tuple[str, str], ...] = ()

    def shown(self) -> str:
        said = [self.reference or "no reference (its spec is not here)"]
        said += [f"{what} {d[:19]}" for what, d in self.digests]
        said += [f"pushed as {self.pushed}"] if self.pushed else ["no push recorded here"]
        return ", ".join(said)


def provenance_line(rc: str) -> str | None:
    """/etc/rc's first line when it is enroot's provenance line (the prefix), else None."""
    return rc.split("\n", 1)[0] if rc.startswith(PREFIX) else None


def parse_uri(line: str) -> EnrootUri:
    """The URI of a provenance line, in one of the forms enroot writes; else ConfigError
    naming what is wrong."""
    text = line.removeprefix(PREFIX)
    if len(text) > MAX_URI:
        raise _refused(f"its URI has {len(text)} characters, over the {MAX_URI} read")
    if bad := control_character(text):
        raise _refused(f"its URI holds the control character {bad}", text)
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("docker", "dockerd", "podman"):
        raise _refused("not a docker://, dockerd:// or podman:// URI", text)
    if scheme != "docker":
        if not _DAEMON_REF.fullmatch(rest):
            raise _refused(f"not a {scheme}://REF enroot imports ([A-Za-z0-9/._:-]+)", text)
        return EnrootUri(scheme=scheme, image=rest)
    registry, sep, path = rest.partition("#")
    image, _, tag = path.partition(":")
    if not sep or not _REGISTRY.fullmatch(registry):
        raise _refused("not docker://REGISTRY#IMAGE:TAG as enroot rewrites a registry URI", text)
    if not _IMAGE.fullmatch(image):
        raise _refused(f"its image {image[:80]!r} is not a repository enroot takes", text)
    if tag.startswith("sha256:") and not _DIGEST.fullmatch(tag):
        raise _refused("its digest is not sha256: and 64 hex digits", text)
    if not _TAG.fullmatch(tag):
        raise _refused(
            "it names no tag or digest (enroot writes :latest when none was given)", text
        )
    return EnrootUri(scheme=scheme, image=image, registry=registry, tag=tag)


def _refused(why: str, text: str = "") -> ConfigError:
    shown = f": '{one_line(text[:120])}'" if text else ""
    return ConfigError(f"is not a line enroot writes ({why}){shown}", where=_WHERE, fix=_FIX)


def names(uri: EnrootUri, image: ThisImage) -> str:
    """How ``uri`` names ``image`` (the evidence); ConfigError when it names another image, or
    one this host cannot tell is this one."""
    if uri.scheme == "docker":
        return _names_pushed(uri, image)
    ref = uri.image
    if ref == image.reference:
        return f"by its reference {ref}"
    if image.pushed and ref == image.pushed:
        return f"by its pushed reference {ref}"
    digest = ref if ref.startswith("sha256:") else f"sha256:{ref}" if _HEX.fullmatch(ref) else None
    for what, d in (*image.digests, *image.pushed_digests):
        if digest == d:
            return f"by its {what} {d}"
    if digest or ref.startswith("sha256:"):
        raise _another(uri, image, "a digest no build or push record of this image here gives")
    raise _another(uri, image, "another reference")


def _names_pushed(uri: EnrootUri, image: ThisImage) -> str:
    if image.pushed is None:
        why = "a registry image, and this host has no record of pushing this one: run the check "
        raise _another(uri, image, why + "where `k3env push` ran (its K3ENV_STATE_DIR)")
    registry, repository, tag = _enroot_form(image.pushed)
    if uri.registry != registry:
        raise _another(uri, image, f"registry {uri.registry}, not {registry} it was pushed to")
    if uri.image != repository:
        raise _another(uri, image, f"repository {uri.image}, not {repository}")
    if uri.tag == tag:
        return f"by its pushed reference {image.pushed}"
    for what, d in image.pushed_digests:
        if uri.tag == d:
            return f"by its pushed {what} {d}"
    raise _another(uri, image, f"{uri.tag}: neither the tag nor a digest it was pushed under")


def _enroot_form(reference: str) -> tuple[str, str, str]:
    """``REGISTRY/REPO:TAG`` as enroot's ``docker::_parse_uri`` splits and canonicalizes it."""
    name, _, tag = reference.rpartition(":")
    first, _, rest = name.partition("/")
    if not rest or not re.search(r"[.:]", first):  # a Docker Hub namespace, as enroot reads it
        first, rest = "registry-1.docker.io", name
    if first in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        first, rest = "registry-1.docker.io", rest if "/" in rest else f"library/{rest}"
    return first, rest, tag


def _another(uri: EnrootUri, image: ThisImage, why: str) -> ConfigError:
    return ConfigError(
        f"names another image ({why}): '{one_line(uri.text)[:200]}'; this image is "
        f"{one_line(image.shown())[:400]}",
        where=_WHERE,
        fix=_FIX,
    )


@dataclass(frozen=True, kw_only=True)
class Release:
    """The enroot a cluster profile's ``[runtime.enroot]`` names, and where it says so."""

    pin: RuntimePin
    profile: str

    @property
    def writes_line(self) -> bool:
        """4.2 or later, or a main commit known to carry the change."""
        from k3env.versions import Version

        pin = self.pin
        return pin.commit in MAIN_COMMITS or Version(pin.version) >= Version(FIRST_RELEASE)

    def __str__(self) -> str:
        main = f", {MAIN_COMMITS[self.pin.commit]}" if self.pin.commit in MAIN_COMMITS else ""
        return f"enroot {self.pin.version}{main} ({one_line(self.profile)} [runtime.enroot])"


def release_of(cluster: Cluster) -> Release:
    """The enroot ``cluster``'s nodes run; ConfigError when its profile does not say."""
    pin = cluster.runtime.get("enroot")
    if pin is None:
        raise ConfigError(
            "the cluster profile does not say which enroot its nodes run: export --check cannot "
            "tell which /etc/rc that enroot writes",
            where=f"{cluster.path} [runtime.enroot]",
            fix="add [runtime.enroot] with version (and commit) as `enroot version` prints it on a "
            "node, or check without --cluster",
        )
    return Release(pin=pin, profile=str(cluster.path))
