"""What this process knows of each node's key, and the value a write starts from.

The newest value and revision seen (this process's own write, a read, or what a watch brought),
when a write to the key last lost a race, and when another process's write of it last arrived.
The first attempt of a write starts from the known value instead of reading the key; after a lost
race a store that a watch feeds waits for the watch to bring the revision that won
(docs/ledger.md, "A lost race takes the winner from the watch, not from a read").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuledger_core.ledger import NodeLedger

CATCH_UP_S = 0.05  # after a lost race, how long a followed store waits for its watch to bring the winner
HOT_S = 1.0  # after losing a race on a key, an unfollowed store starts from a fresh read for this long


def _nothing(_: str) -> None:
    return None


@dataclass(slots=True)
class Known:
    written: dict[str, dict[bytes, NodeLedger]]  # ``Values.written``: our last writes, by their bytes
    newer: dict[str, int]  # ``Values.newer``: nodes whose value is of a newer schema
    catch_up_s: float = CATCH_UP_S  # after a lost race, how long a followed store waits for its watch
    followed: bool = False  # a watch feeds ``remember`` (``follow_values``): the known values are current
    latest: dict[str, tuple[NodeLedger | None, int]] = field(default_factory=dict)
    contended: dict[str, float] = field(default_factory=dict)  # when a write to the key last lost a race
    foreign: dict[str, float] = field(default_factory=dict)  # when another process's write of the key last arrived
    advanced: dict[str, asyncio.Event] = field(default_factory=dict)  # set when a newer value of the key is known
    paused: set[str] = field(default_factory=set)  # ``Batches.paused``: writes waiting out a pause another asked
    resume: Callable[[str], None] = _nothing  # ``Batches.resume``: end such a pause

    def remember(self, node: str, ledger: NodeLedger | None, revision: int) -> None:
        """Note a value of the node's key seen elsewhere (a watch), if it is newer than ours.

        ``mutate`` starts from the newest value it knows instead of reading the key again; a
        stale one only costs a failed compare-and-set and a fresh read.
        """
        if revision >= self.latest.get(node, (None, 0))[1]:
            self.latest[node] = (ledger, revision)
            if any(ledger is mine for mine in self.written.get(node, {}).values()):
                self.foreign.pop(node, None)  # one of our writes (they decode to themselves)
            elif ledger is not None:
                self.foreign[node] = time.monotonic()
                if node in self.paused:  # the writer that asked got in: the pause has done its work
                    self.resume(node)
            event = self.advanced.pop(node, None)
            if event is not None:
                event.set()

    def forget(self, node: str) -> None:
        """The node's key holds a value that cannot be read: its next write reads the key first."""
        self.latest.pop(node, None)

    def hot(self, node: str) -> bool:
        """Another process wrote this key lately: our cached value is likely stale, so read first."""
        return time.monotonic() - self.contended.get(node, -HOT_S) < HOT_S

    def hot_nodes(self) -> set[str]:
        """The nodes a write lost a race on lately."""
        now = time.monotonic()
        return {node for node, at in self.contended.items() if now - at < HOT_S}

    def won_elsewhere(self, within_s: float) -> set[str]:
        """Nodes whose newest value another process wrote, arriving here within the last ``within_s``."""
        now = time.monotonic()
        return {node for node, at in self.foreign.items() if now - at < within_s}

    async def start_from(self, node: str, attempt: int, lost_to: int) -> tuple[NodeLedger | None, int] | None:
        """The value an attempt first tries the transition on, or None to read the key first.

        The first attempt starts from the newest value this process knows, which saves a read;
        without a watch feeding this store, not while the key is hot (another process won a
        race on it lately). After a lost race a followed store waits (``catch_up_s``) for its
        watch to bring the revision that won, which the refusal named, instead of reading the
        key: a read costs a JetStream request and a decode, the watch brings that value anyway.
        A value of a newer schema is checked again on a fresh read (it may have gone)."""
        if node in self.newer:
            return None
        if attempt > 1:
            return await self._caught_up(node, lost_to) if self.followed and lost_to else None
        return None if self.hot(node) and not self.followed else self.latest.get(node)

    async def _caught_up(self, node: str, revision: int) -> tuple[NodeLedger | None, int] | None:
        """The node's value once a watch has brought revision ``revision`` (or a newer one), or None
        if none did within ``catch_up_s``."""
        deadline = time.monotonic() + self.catch_up_s
        while (known := self.latest.get(node)) is None or known[1] < revision:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            event = self.advanced.setdefault(node, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await event.wait()
        return known
