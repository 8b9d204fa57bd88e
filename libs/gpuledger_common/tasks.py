"""Ending a task by cancelling it, on the Python this project runs (3.11).

There ``asyncio.wait_for`` returns its result instead of raising when the cancel arrives in the
turn that result came in, and nats-py awaits every request, publish and connect through it: one
cancel of a task that loops over NATS requests can be lost, and the loop go on. ``cancelled``
cancels again until the task has ended: first after a second, so that a task's own clean-up
after the first cancel (closing a server, removing a socket) is not cut short.
"""

from __future__ import annotations

import asyncio
from typing import Any

AGAIN_S = 1.0  # how often a task that is still running is cancelled again


async def cancelled(task: asyncio.Future[Any], within: float | None = None, again_s: float = AGAIN_S) -> bool:
    """Cancel ``task`` until it has ended (its result or error stay on it, unread). False if it
    still ran after ``within`` seconds (None: wait as long as it takes)."""
    loop = asyncio.get_running_loop()
    deadline = None if within is None else loop.time() + within
    while not task.done():
        left = again_s if deadline is None else min(again_s, deadline - loop.time())
        if left <= 0:
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=left)
    return True
