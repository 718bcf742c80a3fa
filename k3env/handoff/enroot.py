"""The enroot image's own files and the cluster commands (pure rendering).

Slurm jobs run images through pyxis/enroot. ``enroot import`` writes files from the image
config into the root filesystem (/etc/environment, /etc/rc, /etc/rc.local, /etc/fstab);
``enroot_files`` renders them in enroot's own format, so an export (``enroot_export``) and an
``enroot import`` of the same image run the same, and a check (``squashfs_check``) compares a
squashfs against them. ``cluster_commands`` renders what to run on the cluster for one image,
each name quoted as a shell word or a YAML scalar (``k3env.quoting``).
No engine, no files, no processes here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from k3env.config.shapes import MACHINES, control_character
from k3env.config.spec import ImageSpec
from k3env.errors import ConfigError
from k3env.image.records import Exported, Pushed
from k3env.quoting import one_line, shell_word, yaml_string

ENROOT_FILES = ("etc/environment", "etc/rc", "etc/rc.local", "etc/fstab")
RC_LOCAL = (
    "# This file is sourced by /etc/rc when the container starts.\n"
    "# It can be used to manipulate the entrypoint or the command of the container.\n"
)


# --- enroot image files ------------------------------------------------------------------------
def _bash_quote(word: str) -> str:
    """A word as bash's ``${word@Q}`` writes it (enroot quotes the entrypoint and cmd so)."""
    return "'" + word.replace("'", "'\\''") + "'"


def _one_line(what: str, value: str) -> str:
    """``value``, refused when a control character would split it into more lines of a file
    that enroot reads line by line (/etc/environment) or runs (/etc/rc)."""
    if bad := control_character(value):
        raise ConfigError(
            f"{what} holds the control character {bad}: enroot would split it into separate "
            "lines of /etc/environment or /etc/rc (an injected line runs at `enroot start`)",
            where=what,
            fix="remove the control character from the image config (env, label or command)",
        )
    return value


def enroot_files(config: Mapping[str, Any]) -> list[tuple[str, bytes, int]]:
    """/etc/environment, /etc/fstab, /etc/rc, /etc/rc.local for an image config, in the form
    ``enroot import`` writes them (enroot 4.x ``docker::configure``)."""
    env = "".join(f"{_one_line('env', e)}\n" for e in config.get("Env") or [])
    volumes = sorted((config.get("Volumes") or {}).keys())
    fstab = "".join(
        f"${{ENROOT_ROOTFS}}{_one_line('volume', v)} {v} none x-create=dir,bind,rw,nosuid,nodev\n"
        for v in volumes
    )
    return [
        ("etc/environment", env.encode(), 0o644),
        ("etc/fstab", fstab.encode(), 0o644),
        ("etc/rc", render_rc(config).encode(), 0o644),
        ("etc/rc.local", RC_LOCAL.encode(), 0o644),
    ]


def render_rc(config: Mapping[str, Any]) -> str:
    """enroot's /etc/rc: the labels as comments (config order: sorted), a blank line, then the
    script that enters the working directory, sources /etc/rc.local and execs the command."""
    labels = config.get("Labels") or {}
    head = "".join(
        f"# {_one_line('label', k)} {_one_line(f'label {k}', v)}\n" for k, v in labels.items()
    )
    entrypoint = [_bash_quote(_one_line("entrypoint", a)) for a in config.get("Entrypoint") or []]
    cmd = [_bash_quote(_one_line("cmd", a)) for a in config.get("Cmd") or []]
    if not entrypoint and not cmd:
        cmd = [_bash_quote("/bin/sh")]
    workdir = _one_line("workdir", config.get("WorkingDir") or "/")
    if bad := sorted(set(workdir) & set('"$`\\')):
        # enroot writes the working directory inside double quotes: these would expand.
        raise ConfigError(
            f"workdir {workdir!r} holds {''.join(bad)!r}: enroot writes it inside double quotes "
            "in /etc/rc, where it would expand (a command substitution runs at `enroot start`)",
            where="workdir",
            fix="use a working directory without quotes, `$`, backquotes or backslashes",
        )
    ep = " ".join(entrypoint)
    return (
        (head + "\n" if head else "")
        + f'mkdir -p "{workdir}" 2> /dev/null\n'
        + f'cd "{workdir}" && unset OLDPWD || exit 1\n'
        + "\n"
        + "if [ -s /etc/rc.local ]; then\n"
        + "    . /etc/rc.local\n"
        + "fi\n"
        + "\n"
        + "if [ $# -gt 0 ]; then\n"
        + f'    exec {ep} "$@"\n'
        + "else\n"
        + f"    exec {ep} {' '.join(cmd)}\n"
        + "fi\n"
    )


# --- what to run on the cluster ----------------------------------------------------------------
def cluster_commands(spec: ImageSpec, pushed: Pushed | None, exported: Exported | None) -> str:
    """What to run on the cluster, and the srtslurm.yaml mapping, for one image."""
    platform = (pushed.platform if pushed else None) or (exported.platform if exported else None)
    # An index may name the platform with its variant (linux/arm64/v8): one machine either way.
    machine = MACHINES.get("/".join(platform.split("/")[:2]), "?") if platform else None
    on = f" ({platform}, for {machine} nodes)" if platform else ""
    lines = [f"# {one_line(spec.name)}{one_line(on)}"]
    # One image per platform under an index: each its own file, its own manifest's digest.
    arch = f".{platform.split('/')[1]}" if pushed and pushed.index and platform else ""
    sqsh = Path(exported.path).name if exported else f"{spec.name}{arch}.sqsh"
    if pushed:
        lines.append(
            "ENROOT_ALLOW_HTTP=y enroot import -o "
            f"{shell_word(sqsh)} {shell_word(pushed.enroot_uri)}"
        )
        lines.append(
            f"k3env export --check {shell_word(sqsh)}   # on a host with this repo and lock"
        )
        lines.append("# srtslurm.yaml")
        lines.append("containers:")
        lines.append(f"  {yaml_string(pushed.by_digest)}: {yaml_string('/path/to/' + sqsh)}")
    if exported:
        lines.append(
            f"# or copy the exported image: sha256 {one_line(exported.sha256)}  {one_line(sqsh)}"
        )
    return "\n".join(lines)
