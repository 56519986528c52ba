"""Errors a command reports to its user as one line and an exit code (docs/contract.md), never as a traceback.

A handler raises `CliError` (or a subclass) when it must stop; `swift_vora.cli.main` prints
`swift-vora COMMAND: MESSAGE` on stderr, with `--json` also `{"error": MESSAGE, "exit_code": N}` on
stdout, and returns the code. docs/errors.md lists the codes and messages for users and scripts.
"""
from __future__ import annotations

from typing import Optional

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_REFUSED = 0, 1, 2, 3, 4


class CliError(Exception):
    """Stop the command with `message` and `exit_code` (default 2, usage error)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: Optional[int] = None, command: Optional[str] = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        self.command = command  # e.g. 'swift-vora data build'; default: the command that ran


class UsageError(CliError):
    """A flag, argument or path the user gave cannot be used (exit 2)."""

    exit_code = EXIT_USAGE


class InvalidInput(CliError):
    """An input file holds something that cannot be used (exit 1); the message names file, line and field."""

    exit_code = EXIT_INVALID


class OutputPathError(UsageError):
    """An output path would destroy an input or something that is not a regular file (exit 2)."""


class Terminated(BaseException):
    """SIGTERM / SIGHUP arrived while a command wrote its outputs (raised by swift_vora.outputs' handler after it
    removed the temporary files). A BaseException, so that no `except Exception` takes it for a bug."""

    def __init__(self, signum: int):
        super().__init__(f'signal {signum}')
        self.signum = signum
