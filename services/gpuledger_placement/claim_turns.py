"""Mode C tries the pods it allocates for highest priority first, as kube-scheduler's queue does.

Pods are settled several at once, so that a burst is not allocated one claim at a time. Where
room is short that would let whichever try reaches the ledger first take it: when a card is freed,
every pod waiting for room is woken by the same change, and a low-priority pod could take the card
that a high-priority pod waits for (which would then preempt it, an eviction for nothing). In
classic mode and mode B kube-scheduler pops the pod of highest priority first, then the oldest.

``Turns`` gives mode C the same order across priorities: a try of a pod (or of a claim allocated
on its creation) waits while a try of a pod of higher priority is under way, up to ``TURN_S``
(a try that hangs on the API server holds nobody up for long). Tries of one priority still run
together. A try counts as under way from the moment its pod is woken, before its first read, so
that pods woken by one change are ordered whichever of their reads comes back first.

A pod that has waited long tries again only as its back-off ends (the back-off keeps a burst of
waiting pods from all trying on every change), so pods woken by one change are few. Where pods of
several priorities wait, the change also wakes those of the highest priority in their back-off
(``first_in_line``, the oldest ``FIRST_IN_LINE`` of them), as kube-scheduler's queue pops them
first: the room a change frees goes to them, not to whichever back-off ends first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuledger_placement.preemption_holders import priority_of

TURN_S = 1.0  # the longest a try waits for tries of higher priority
FIRST_IN_LINE = 8  # waiting pods of the highest priority a change wakes in their back-off


@dataclass(slots=True)
class Turns:
    limit_s: float = TURN_S
    _trying: dict[str, int] = field(default_factory=dict)  # key -> the priority of its try under way
    _ended: asyncio.Event | None = None  # set when a try ends, for the tries waiting then

    def begin(self, key: str, priority: int) -> None:
        """A try is under way (again) from now: tries of lower priority wait for it."""
        self._trying[key] = priority

    async def wait(self, key: str, priority: int) -> None:
        """Begin the try, then return once no try of higher priority is under way (or after
        ``limit_s``)."""
        self.begin(key, priority)
        loop = asyncio.get_running_loop()
        until = loop.time() + self.limit_s
        while any(p > priority for p in self._trying.values()) and (left := until - loop.time()) > 0:
            if self._ended is None:
                self._ended = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), left)

    def end(self, key: str) -> None:
        """The try is over (settled, refused, or its pod gone)."""
        if self._trying.pop(key, None) is not None and self._ended is not None:
            self._ended.set()
            self._ended = None


def first_in_line(waiting: Iterable[str], pods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Of the waiting pods (uid -> newest version in ``pods``), those of the highest priority,
    oldest first, up to ``FIRST_IN_LINE``; none where they all have one priority (a burst: the
    back-off keeps them from all trying on every change)."""
    ranked = {uid: priority_of(pods[uid]) for uid in waiting if uid in pods}
    if len(set(ranked.values())) < 2:
        return []
    top = max(ranked.values())
    first = sorted((uid for uid, p in ranked.items() if p == top), key=lambda uid: _created(pods[uid]))
    return first[:FIRST_IN_LINE]


def _created(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("uid") or "")
