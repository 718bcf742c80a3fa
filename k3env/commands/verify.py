"""Check each image from inside, one container per core at once; images with the same files share
one container and one import of the entrypoints, each image's checks running under its own env
(an image whose env the import looked up is probed alone; `--isolated`: one each); an unchanged
image, plan and probe answered from its record: the serve lines parse with the image's own vLLM
/ Dynamo parsers (including vLLM's server-setup validation; a model path stands in as an empty
directory), parser names on the profile and on the command lines are registered with the
process that reads them, the tokenizer `model_type` loads in Dynamo's Rust frontend (a
rejection names the runtime's supported list), entrypoint modules import, patches are present,
every baked env var is read by a file in the image (the verdict names it, or the search that
found none, with a did-you-mean and the flag that replaced it), versions match the lock, every
installed distribution's Requires-Dist (and the extras in use) holds, an import that fails on
an absent module goes on past it to the first real incompatibility; prints a table and a
markdown compat matrix, and per image what this host holds of its last export's SBOM and
signed provenance (`--key PUB.pem`: both signatures checked, the statement naming that SBOM and
the export's recorded sha256; the file's own bytes: `export --check`)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3env import jsontext
from k3env.commands.app import App, image_args, platform_arg
from k3env.files import write_atomic
from k3env.verdict import NOT_CHECKED, PASSED, Gate, bad, exit_code

if TYPE_CHECKING:
    from k3env.signing import VerifyKey
    from k3env.state import State

NAME = "verify"
HELP = "check each image from inside: args, parsers, tokenizer, imports, patches, env"


def arguments(p: argparse.ArgumentParser) -> None:
    image_args(p, twin="verify the images built over the twin")
    p.add_argument("--markdown", type=Path, help="also write the compat matrix to this file")
    p.add_argument(
        "--timeout", type=float, default=300, help="seconds per image before the probe is killed"
    )
    p.add_argument(
        "--isolated",
        action="store_true",
        help="one container and one import per image (by default images with the same files "
        "share one import; each image's checks still run under its own environment)",
    )
    p.add_argument(
        "--key",
        type=Path,
        metavar="PUB.pem",
        help="check each image's last export's SBOM signature and signed provenance with this "
        "ECDSA P-256 public key (PEM); without it they are not checked",
    )
    platform_arg(p, many=True)


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.checks.report import markdown, table
    from k3env.checks.verify import verify_images
    from k3env.signing import load_verify_key
    from k3env.smoke.run import recorded_serves

    key = load_verify_key(args.key) if args.key is not None else None
    lock, specs, engine, state, builds = app.builds(args)
    # One container per core; images with the same files share one (and one import).
    reports = verify_images(
        engine,
        state,
        lock,
        list(zip(specs, builds, strict=True)),
        twin=args.twin,
        timeout=args.timeout,
        log=log,
        share=not args.isolated,
    )
    serves = {r.image_id: recorded_serves(state, r.image_id) for r in reports}
    matrix = markdown(reports, serves=serves)
    if args.markdown:
        write_atomic(args.markdown, matrix)
        log.info(f"compat matrix written to {args.markdown}")
    failed = [f for r in reports for f in r.failed]
    attested = {r.image_id: _attested(state, r.image_id, key) for r in reports}
    payload = {
        "twin": args.twin,
        "images": [{**r.as_json(), "sbom": attested[r.image_id].as_json()} for r in reports],
        "failures": len(failed),
        "markdown": matrix,
    }

    def human() -> None:
        print(table(reports))
        print()
        for r in reports:
            print(f"{r.image} sbom: {attested[r.image_id].said}")
        print()
        print(matrix)

    app.emit(payload, human)
    signed = [replace(g, name=f"{r.image} {g.name}")
              for r in reports for g in attested[r.image_id].gates]  # fmt: skip
    fixes = [CHECKS_FIX] * bool(failed) + [SIGNED_FIX] * bool(bad(signed))
    return exit_code([*(g for r in reports for g in r.gates), *signed],
                     what="the images do not verify", where="k3env verify",
                     fix="; ".join(fixes))  # fmt: skip


CHECKS_FIX = (
    "each failure above names the image, profile, check and component, with the probe's own output"
)
SIGNED_FIX = (
    "export the image again with --sign-key (the private key of --key's pair), or pass the key "
    "it was signed with; an SBOM or statement changed after signing is tampering"
)


@dataclass(frozen=True, kw_only=True)
class Attested:
    """What this host holds of an image's SBOM and provenance, and their gates."""

    export: str | None  # the last export's .sqsh
    files: tuple[str, ...]  # the three files beside it, those present
    gates: tuple[Gate, ...]
    said: str  # one line

    def as_json(self) -> dict[str, Any]:
        return jsontext.plain(self)


def _attested(state: State, image_id: str, key: VerifyKey | None) -> Attested:
    """The image's last export's SBOM and provenance beside it: present or not, both
    signatures checked with ``key`` (not checked without one), the statement naming this SBOM
    and, as its subject, the sha256 the export recorded. The file itself is not read (a
    multi-GB image): its own bytes are checked by `export --check`."""
    from k3env.handoff.attest import (
        SBOM_SUFFIX,
        SIG_SUFFIX,
        STATEMENT_SUFFIX,
        beside,
        check_signed,
        recorded,
    )
    from k3env.image.records import shipped

    exported = shipped(state, image_id).exported
    if exported is None:
        why = "not exported (k3env export --sign-key KEY.pem)"
        return Attested(export=None, files=(), said=f"none: {why}",
                        gates=(Gate(name="sbom", status=NOT_CHECKED, detail=why),))  # fmt: skip
    sqsh = Path(exported.path)
    files = tuple(str(beside(sqsh, x)) for x in (SBOM_SUFFIX, SIG_SUFFIX, STATEMENT_SUFFIX)
                  if beside(sqsh, x).is_file())  # fmt: skip
    gates = tuple(check_signed(sqsh, key, recorded(str(exported.sha256))))
    said = f"{sqsh}: " + "; ".join(
        f"{g.name} {g.status}" + ("" if g.status == PASSED else f" ({g.detail})") for g in gates
    )
    if key is None and files:
        said += f"; signatures: k3env verify --key PUB.pem, or k3env export --check {sqsh} --key "
        said += "PUB.pem"
    return Attested(export=str(sqsh), files=files, gates=gates, said=said)
