"""What a service that failed to start leaves behind in this process: tasks still running and
sockets still open (a NATS connection not closed, a port still bound). The lifecycle tests take
a port first, so that a late part of a service cannot start, and check that nothing is left."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from tests.support.waiting import wait_for


def open_sockets() -> set[str]:
    """The sockets this process holds open (``socket:[inode]``, one per file descriptor)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor of the listing itself is gone by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                found.add(f"{fd}:{target}")
    return found


def running_tasks() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if not t.done() and t is not asyncio.current_task()}


@dataclass(frozen=True)
class Before:
    """The tasks and sockets of this process before a service starts."""

    tasks: set[asyncio.Task[object]]
    sockets: set[str]

    @classmethod
    def now(cls) -> Before:
        return cls(running_tasks(), open_sockets())

    async def nothing_left(self, timeout: float = 10.0) -> None:
        """Wait until every task and socket the service made is gone (a closed transport lets go of
        its socket a turn of the loop later); fail naming what is left."""

        async def clean() -> bool:
            return not (running_tasks() - self.tasks) and not (open_sockets() - self.sockets)

        try:
            await wait_for(clean, timeout, "nothing left behind")
        except TimeoutError:
            tasks = sorted(repr(t.get_coro()) for t in running_tasks() - self.tasks)
            sockets = sorted(open_sockets() - self.sockets)
            raise AssertionError(f"left behind: tasks {tasks}, sockets {sockets}") from None


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that something else listens on, for as long as the block runs."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def in_use(err: BaseException) -> bool:
    """Whether ``err`` (or the one error of a task group's) says an address is already in use."""
    while isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:
        err = err.exceptions[0]
    return isinstance(err, OSError) and err.errno == errno.EADDRINUSE


def free(port: int) -> bool:
    """Whether a listener could bind ``port`` on 127.0.0.1 now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
