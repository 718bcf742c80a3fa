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
markdown compat matrix
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from k3env.commands.app import App, image_args, platform_arg
from k3env.errors import CheckFailed
from k3env.files import write_atomic

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
    platform_arg(p, many=True)


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.checks.report import markdown, table
    from k3env.checks.verify import verify_images
    from k3env.smoke.run import recorded_serves

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
    attested = {r.image_id: _attested(state, r.image_id) for r in reports}
    payload = {
        "twin": args.twin,
        "images": [{**r.as_json(), "sbom": attested[r.image_id]} for r in reports],
        "failures": len(failed),
        "markdown": matrix,
    }

    def human() -> None:
        print(table(reports))
        print()
        for r in reports:
            print(f"{r.image} sbom: {attested[r.image_id]['said']}")
        print()
        print(matrix)

    app.emit(payload, human)
    if failed:
        raise CheckFailed(
            f"{len(failed)} check(s) failed in {sorted({f.image for f in failed})}",
            where="k3env verify",
            fix="each failure above names the image, profile, check and component, with the "
            "probe's own output",
        )
    return 0


def _attested(state: Any, image_id: str) -> dict[str, Any]:
    """What this host holds of the image's SBOM and provenance: its last export's files beside
    it (present or not); their signatures are checked by `export --check --key`, not here."""
    from k3env.handoff.attest import SBOM_SUFFIX, SIG_SUFFIX, STATEMENT_SUFFIX, beside
    from k3env.handoff.enroot_export import last_export

    exported = last_export(state, image_id)
    if exported is None:
        return {"export": None, "files": [], "said": "none: not exported (k3env export --sign-key)"}
    sqsh = Path(exported.path)
    files = [str(beside(sqsh, x)) for x in (SBOM_SUFFIX, SIG_SUFFIX, STATEMENT_SUFFIX)
             if beside(sqsh, x).is_file()]  # fmt: skip
    said = (
        f"signed SBOM and provenance beside {sqsh} (signatures not checked here: "
        f"k3env export --check {sqsh} --key PUB.pem)"
        if len(files) == 3
        else f"none beside {sqsh} (k3env export --sign-key KEY.pem)"
        if not files
        else f"incomplete beside {sqsh}: only {', '.join(Path(f).name for f in files)}"
    )
    return {"export": str(sqsh), "files": files, "said": said}
