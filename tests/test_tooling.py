"""The project's own tooling: CLI help, nox sessions, flake.nix, .ci/run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from k3env.cli import main

from .conftest import REPO


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for command in ("lock", "build", "twin"):
        assert command in out


def test_nox_lists_build_image() -> None:
    nox = shutil.which("nox")
    argv = [nox] if nox else [sys.executable, "-m", "nox"]
    out = subprocess.run([*argv, "-l"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for session in ("build-image", "tests", "bench", "lock", "twin", "verify", "preflight",
                    "enroot", "srt", "bump"):  # fmt: skip
        assert f" {session} -> " in out


def test_flake_parses() -> None:
    nix = shutil.which("nix-instantiate")
    if nix is None:
        pytest.skip("nix-instantiate not installed (apt-get install nix-bin)")
    proc = subprocess.run([nix, "--parse", str(REPO / "flake.nix")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # The dev shell pins nixpkgs to a commit and carries the host tools.
    text = (REPO / "flake.nix").read_text()
    assert "github:NixOS/nixpkgs/50ab793786d9de88ee30ec4e4c24fb4236fc2674" in text
    for tool in ("nox", "docker-client", "skopeo", "squashfsTools", "git"):
        assert tool in text


# Debian package (what scripts/host-setup.sh installs) -> the nixpkgs attribute of the same tool.
HOST_TOOLS = {
    "docker.io": "docker-client",
    "skopeo": "skopeo",
    "squashfs-tools": "squashfsTools",
    "faketime": "libfaketime",
    "debootstrap": "debootstrap",
    "git": "git",
    "qemu-user-static": "qemu",
    "binfmt-support": "qemu",
    "slurm-wlm": "slurm",
    "munge": "munge",
}


def test_flake_carries_every_tool_host_setup_installs() -> None:
    """The two ways to get the host tools agree: a tool added to one and not the other fails."""
    setup = (REPO / "scripts/host-setup.sh").read_text()
    pairs = setup.split("for pair in", 1)[1].split("; do", 1)[0].split()
    packages = {pair.split(":", 1)[1] for pair in pairs if ":" in pair}
    flake = (REPO / "flake.nix").read_text()
    for package in sorted(packages):
        if package in ("docker-registry", "nix-bin", "curl"):
            continue  # a service, nix itself, and a tool nixpkgs' stdenv has
        assert package in HOST_TOOLS, f"{package} from host-setup.sh has no flake counterpart"
        assert f"pkgs.{HOST_TOOLS[package]}" in flake, f"flake.nix lacks {HOST_TOOLS[package]}"
    assert "ps.docker" not in flake  # k3env speaks to dockerd itself: no docker SDK


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci/run").read_text()
    assert "nox -s tests" in readme
    # README's command, as a line of its own (`step` prints the seconds it took).
    assert re.search(r"\n(step )?nox -s tests\n", ci), ci
    assert "scripts/host-setup.sh" in ci


def test_pin_bump_workflow_structure() -> None:
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load((REPO / ".github/workflows/pin-bump.yml").read_text())
    triggers = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads `on:` as true
    assert "schedule" in triggers and triggers["schedule"][0]["cron"]
    assert set(triggers["workflow_dispatch"]["inputs"]) == {"pin", "value"}
    assert wf["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert set(wf["jobs"]) == {"outdated", "bump"}
    find = "\n".join(step.get("run", "") for step in wf["jobs"]["outdated"]["steps"])
    assert 'k3env outdated --twin-find-links "$TWIN_WHEELS" --json' in find and "matrix=" in find
    job = wf["jobs"]["bump"]
    assert job["needs"] == "outdated"
    assert job["strategy"]["matrix"]["include"] == "${{ fromJSON(needs.outdated.outputs.matrix) }}"
    assert "docker" in job["runs-on"] and job["timeout-minutes"] <= 90
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "scripts/host-setup.sh" in runs
    assert "nox -s bump" in runs and "--body pr-body.md" in runs and "--commit" in runs
    assert "gh pr create" in runs and "--body-file pr-body.md" in runs
    for step in job["steps"]:
        assert set(step) <= {"name", "id", "if", "uses", "with", "run", "env"}, step


def test_a_missing_tool_names_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from k3env.errors import ToolError
    from k3env.runner import require_tool

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolError) as debian:
        require_tool("mksquashfs", "squashfs-tools")
    assert debian.value.fix is not None and debian.value.fix.startswith(
        "apt-get install -y squashfs-tools"
    )
    with pytest.raises(ToolError) as pip:
        require_tool("uv", "pip install uv")
    assert pip.value.fix is not None and pip.value.fix.startswith("pip install uv (")
