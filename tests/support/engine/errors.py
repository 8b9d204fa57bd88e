"""The one error of this package: a step could not be done, and the message says which and why."""

from __future__ import annotations


class EngineError(RuntimeError):
    """Docker, Compose or an image could not be installed, started or built."""
