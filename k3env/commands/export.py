"""Write enroot images (`.sqsh`) as `enroot import` lays them out: the rootfs with the image's own
mtimes (Python's `.pyc` stay valid), root 0755, and `/etc/environment`, `/etc/rc`,
`/etc/rc.local`, `/etc/fstab` in enroot's form, streamed from the engine into `mksquashfs -tar`
with enroot's options; the bytes depend on the image only; sha256 recorded (a file already in
`--out` whose sha256 is the image's recorded export is not written again). With `--check
FILE.sqsh`: check any squashfs (one `enroot import` made on the cluster, or an export) against
what the image carries and this lock: the provenance file (its sha256 in the config labels),
each `/etc/environment` line, the `/etc/rc` script, every file of k3env's layer, every
installed distribution against its RECORD, env and patches (exit 4 naming each difference; exit
2 for a file that is not a k3env image). `--sign-key KEY.pem` writes beside each export its
CycloneDX SBOM, the SBOM's signature and a signed in-toto provenance statement
(`handoff.attest`); `--check FILE.sqsh --key PUB.pem` makes the SBOM again from the file and
checks both signatures (without `--key`: not checked, said). enroot >= 4.2's first `/etc/rc`
line, `# enroot-provenance: <uri>`, must name this image (its reference, pushed reference or a
recorded digest); `--cluster PROFILE.toml`: its `[runtime.enroot]` says whether the line must be
there (4.2 on, or enroot main 8ea147d) or must not (before 4.2); without it either is accepted
and the result says which release the file looks like
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3env.commands.app import App, image_args, platform_arg
from k3env.config.cluster import load_cluster
from k3env.config.lock import load_lock
from k3env.config.spec import load_specs
from k3env.errors import UsageError

if TYPE_CHECKING:
    from k3env.image.records import Exported, Pushed
    from k3env.log import Log

NAME = "export"
HELP = "write enroot squashfs images (.sqsh), or --check one against the lock"


def arguments(p: argparse.ArgumentParser) -> None:
    image_args(p, twin="the images built over the twin")
    p.add_argument(
        "--out", type=Path, default=Path("out/sqsh"), help="output directory (default: out/sqsh)"
    )
    p.add_argument(
        "--check", type=Path, metavar="FILE.sqsh", help="check a squashfs against the lock"
    )
    p.add_argument(
        "--sign-key",
        type=Path,
        metavar="KEY.pem",
        help="write and sign each export's SBOM and provenance statement with this ECDSA "
        "P-256 private key (PEM)",
    )
    p.add_argument(
        "--key",
        type=Path,
        metavar="PUB.pem",
        help="with --check: the public key the SBOM and provenance must be signed with",
    )
    p.add_argument(
        "--cluster",
        type=Path,
        metavar="PROFILE.toml",
        help="with --check: the cluster whose enroot imported the file (its [runtime.enroot] says "
        "whether /etc/rc starts with enroot's provenance line); without it either is accepted",
    )
    platform_arg(p, many=True)


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.handoff.attest import check, hashed
    from k3env.handoff.enroot import cluster_commands
    from k3env.handoff.enroot_export import export_image
    from k3env.handoff.enroot_uri import release_of
    from k3env.handoff.squashfs import Squashfs
    from k3env.handoff.squashfs_check import check_image, require_ok
    from k3env.image.records import shipped
    from k3env.signing import load_verify_key

    if args.key is not None and not args.check:
        raise UsageError("--key goes with --check FILE.sqsh (the key to verify it with)")
    if args.sign_key is not None and args.check:
        raise UsageError("--sign-key signs new exports; --check takes --key PUB.pem")
    if args.cluster is not None and not args.check:
        raise UsageError("--cluster goes with --check FILE.sqsh (the cluster that imported it)")
    if args.check:
        lock = load_lock(args.lock)
        by_name = {s.name: s for s in load_specs(args.images, lock)}
        release = release_of(load_cluster(args.cluster)) if args.cluster is not None else None
        with tempfile.TemporaryDirectory(prefix="k3env-check-") as work:
            # One reader for both checks: the image is listed once, the file hashed once.
            fs = Squashfs(args.check, log, Path(work))
            items = check_image(fs, lock, by_name, log, state=app.state(), release=release)
            key = load_verify_key(args.key) if args.key is not None else None
            items += check(args.check, fs, key, hashed(args.check))
        app.emit(
            {"file": str(args.check), "checks": [i.as_json() for i in items]},
            lambda: print("\n".join(f"{i.status:<11} {i.name}: {i.detail}" for i in items)),
        )
        return require_ok(args.check, items)
    _lock, specs, engine, state, builds = app.builds(args)
    exported = []
    signed: dict[str, dict[str, Any]] = {}
    for build in builds:
        with log.step(f"export {build.reference} -> {args.out}/ (streamed into mksquashfs)"):
            exported.append(export_image(engine, state, build, args.out, log))
        if args.sign_key is not None:
            pushed = shipped(state, build.image_id).pushed
            signed[exported[-1].path] = _attest(exported[-1], args.sign_key, pushed, log)

    def commands(spec: Any, build: Any, exp: Any) -> str:
        return cluster_commands(spec, shipped(state, build.image_id).pushed, exp)

    app.emit(
        {"images": [{**e.as_json(), **signed.get(e.path, {})} for e in exported]},
        lambda: print(
            "\n\n".join(
                f"{e.path}  sha256 {e.sha256}  ({e.size / 1e9:.2f} GB)\n" + commands(s, b, e)
                for s, b, e in zip(specs, builds, exported, strict=True)
            )
        ),
    )
    return 0


def _attest(exported: Exported, key_path: Path, pushed: Pushed | None, log: Log) -> dict[str, Any]:
    """The export's SBOM and provenance, signed, beside it; attached to its pushed manifest
    as OCI referrers when it was pushed (else said)."""
    from k3env.handoff.attest import CYCLONEDX, attest
    from k3env.handoff.referrers import Artifact, attach
    from k3env.handoff.squashfs import Squashfs
    from k3env.signing import load_signing_key

    sqsh = Path(exported.path)
    key = load_signing_key(key_path)
    with (
        log.step(f"SBOM and provenance of {sqsh.name}, signed"),
        tempfile.TemporaryDirectory(prefix="k3env-sbom-") as work,
    ):
        sbom, sig, statement = attest(sqsh, exported.sha256, Squashfs(sqsh, log, Path(work)), key)
    said: dict[str, Any] = {
        "sbom": str(sbom),
        "sbom_signature": str(sig),
        "provenance": str(statement),
    }
    if pushed is None:
        said["referrers"] = None
        log.info(f"    not attached to a registry: {exported.image} was not pushed (k3env push)")
        return said
    artifacts = [
        Artifact(path=sbom, artifact_type=CYCLONEDX, media_type=CYCLONEDX),
        Artifact(path=sig, artifact_type="application/vnd.k3env.signature.v1+base64",
                 media_type="text/plain"),
        Artifact(path=statement, artifact_type="application/vnd.dsse.envelope.v1+json",
                 media_type="application/vnd.dsse.envelope.v1+json"),
    ]  # fmt: skip
    with log.step(f"attach them to {pushed.by_digest}"):
        said["referrers"] = attach(pushed, artifacts, log)
    return said
