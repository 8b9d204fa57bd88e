"""Progress lines and timing of the preparation steps, on stderr."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


def say(message: str) -> None:
    print(f"[engine] {message}", file=sys.stderr, flush=True)


@contextmanager
def step(what: str) -> Iterator[None]:
    started = time.monotonic()
    say(f"{what} ...")
    yield
    say(f"{what}: done in {time.monotonic() - started:.0f} s")
