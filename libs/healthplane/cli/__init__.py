"""The ``healthplane`` command."""

from healthplane.cli.main import main

__all__ = ["main"]
