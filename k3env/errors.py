"""The one error tree of k3env. ``cli.main`` turns them into exit codes; elsewhere one is
caught only where the failure is itself an answer (``checks.variants``: a variant wheel that
cannot be fetched is said as not inspected), never to be hidden.

Every message says what failed, where (file and key, patch, image) and what to do next.
Exit codes follow cibuildwheel: 2 for input the user must fix, 3 for the engine or the
outside world, 4 for a check that ran and found a problem.
"""

from __future__ import annotations

from k3env.quoting import one_line

# `said`'s bounds: the message, then the other program's last line (each on its own).
SAID_MESSAGE, SAID_LAST = 240, 300


class K3envError(Exception):
    """Base of every error k3env reports to a user. ``message``, ``where`` and ``fix`` are
    one line each when rendered; ``output``: what another program printed (its lines shown
    quoted under the message)."""

    return_code = 1

    def __init__(
        self,
        message: str,
        *,
        where: str | None = None,
        fix: str | None = None,
        output: str | None = None,
    ) -> None:
        self.message = message
        self.where = where
        self.fix = fix
        self.output = output
        super().__init__(self.render())

    def render(self) -> str:
        """For a person: a line ``where: message``, the other program's output a quoted line
        each, then ``fix``. The line breaks are k3env's: every control character in the
        parts themselves (a name, a message, a file someone else wrote), a line break
        included, is escaped, so no part can clear the screen or forge a line of its own."""
        head = one_line(self.message)
        parts = [f"{one_line(self.where)}: {head}" if self.where else head]
        if self.output:
            parts += [f"  | {one_line(line)}" for line in self.output.splitlines()]
        if self.fix:
            parts.append(f"  fix: {one_line(self.fix)}")
        return "\n".join(parts)

    @property
    def said(self) -> str:
        """The message on one line (a table cell, a note), with the last line the other
        program printed when there is one: each bounded on its own (a long message, such as
        a command line, never pushes out the line that says why)."""
        last = [one_line(x)[:SAID_LAST] for x in (self.output or "").strip().splitlines()[-1:]]
        message = one_line(self.message)
        message = message if len(message) <= SAID_MESSAGE else message[: SAID_MESSAGE - 3] + "..."
        return " ".join([message, *last])

    def as_json(self) -> dict[str, object]:
        return {
            "error": type(self).__name__,
            "message": self.message,
            "where": self.where,
            "fix": self.fix,
            "output": self.output,
            "exit_code": self.return_code,
        }


class ConfigError(K3envError):
    """The lock, an image spec or a patch file is malformed or inconsistent."""

    return_code = 2


class UsageError(ConfigError):
    """The command line itself: an unknown option, a missing argument (argparse's words)."""


class LockError(ConfigError):
    """The lockfile is malformed, or a pin in it is not an immutable identity."""


class SpecError(ConfigError):
    """An image spec is malformed or refers to something the lock does not have."""


class SecretError(ConfigError):
    """An env value that looks like a credential would be baked into an image."""


class PatchError(K3envError):
    """A container patch does not match the lock or the file it targets."""

    return_code = 2


class EngineError(K3envError):
    """The Docker engine or registry failed, or is not reachable."""

    return_code = 3


class ToolError(K3envError):
    """An external command (debootstrap, pip, nix-instantiate, ...) failed."""

    return_code = 3


class StateError(K3envError):
    """k3env's own files (the state directory, outputs) could not be read or written."""

    return_code = 3


class CheckFailed(K3envError):
    """A check ran and found a problem (e.g. ``lock --check`` with unresolved pins)."""

    return_code = 4


class UntrustedFileError(CheckFailed):
    """A file in a tree others made (an image, a checkout) is not a regular file within its
    size limit: a link, device, FIFO or socket, or too large; it was not followed or read."""
