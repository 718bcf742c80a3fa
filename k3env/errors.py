"""The one error tree of k3env. ``cli.main`` turns them into exit codes; elsewhere one is
caught only where the failure is itself an answer (``checks.variants``: a variant wheel that
cannot be fetched is said as not inspected), never to be hidden.

Every message says what failed, where (file and key, patch, image) and what to do next.
Exit codes follow cibuildwheel: 2 for input the user must fix, 3 for the engine or the
outside world, 4 for a check that ran and found a problem.
"""

from __future__ import annotations


class K3envError(Exception):
    """Base of every error k3env reports to a user."""

    return_code = 1

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.message = message
        self.where = where
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        parts = []
        if self.where:
            parts.append(f"{self.where}: {self.message}")
        else:
            parts.append(self.message)
        if self.fix:
            parts.append(f"  fix: {self.fix}")
        return "\n".join(parts)

    def as_json(self) -> dict[str, object]:
        return {
            "error": type(self).__name__,
            "message": self.message,
            "where": self.where,
            "fix": self.fix,
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
