"""What a client says when it cannot go on: one line, and a code that tells the caller what
to do next. The CLI exits with the code; the api maps it to an HTTP status."""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_REFUSED: Final = 1  # refused or failed: the message names the node and the reason
EXIT_USAGE: Final = 2  # asked wrongly: nothing was sent
EXIT_RETRY: Final = 3  # not known yet, or the bus did not answer: the same call may work later


class CommandFailed(Exception):
    """A request that cannot go on; ``str()`` is the one line to show, ``code`` an ``EXIT_*``."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


class PermissionDenied(CommandFailed):
    """The server refused what this identity tried (SEC-1): the API's 403."""


class NodeNotFound(CommandFailed):
    """No view of that node (the API's 404)."""
