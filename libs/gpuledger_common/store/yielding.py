"""Yielding a hot key across processes (docs/ledger.md, "Several replicas").

A followed store that lost ``YIELD_AFTER`` races in a row on a node asks the other writers
(core NATS, ``LEDGER_YIELD``, "<writer> <node>") to hold their next write to it until its write
arrives (``YIELD_S`` at most), and tries again after a short back-off. Here are both sides: the
request a writer publishes, and the pause it takes when another asks (``until``, which ``batches``
waits out). Nothing depends on a request arriving.

Only the ledger's writers (the allocator and placement) may publish on ``LEDGER_YIELD``
(``natsauth``), but a JetStream consumer may deliver a stream's messages to any subject: a node
could write a request into its own key and have a consumer of its own deliver it here. Such a
delivery keeps the stream's subject and carries a ``$JS.ACK`` reply, so a request is taken only
from a core NATS publish on ``LEDGER_YIELD`` itself; anything else is counted (``forged``) and
dropped.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from gpuledger_common.metrics import LEDGER_YIELDS
from gpuledger_common.natsauth import LEDGER_YIELD
from gpuledger_core.ledger import NodeLedger

log = logging.getLogger(__name__)
YIELD_AFTER = 2
YIELD_S = 0.005  # at most: the pause ends when the other writer's write arrives
YIELD_BACKOFF_S = 0.001  # the first back-off after asking; it doubles with each further loss, as before


@dataclass(slots=True)
class Yielding:
    nc: Client
    known: dict[str, tuple[NodeLedger | None, int]]  # ``Known.latest``: the nodes this store knows
    yield_s: float = YIELD_S  # how long a write to a node is held when another writer asks
    writer: bytes = field(default_factory=lambda: secrets.token_hex(8).encode())  # names this store in yields
    until: dict[str, float] = field(default_factory=dict)  # a pause asked by another writer, per node
    again: dict[str, float] = field(default_factory=dict)  # no new pause before: at most every other window
    warned: set[str] = field(default_factory=set)  # the subjects of dropped deliveries, warned of once
    _sub: Subscription | None = None

    async def listen(self) -> None:
        """Take other writers' requests from now on (once per store: a follower that starts again keeps it)."""
        if self._sub is None:
            self._sub = await self.nc.subscribe(LEDGER_YIELD, cb=self.asked)

    async def asked(self, msg: Msg) -> None:
        """Another writer lost races on a node in a row: hold the next write to it until a write of
        another process arrives from the watch, or for ``yield_s`` at most.
        Only for a node this store knows, not asked by itself, and not again until as long again
        has passed after the pause: a writer that asks and asks cannot hold this one up for more
        than half the time. A message that is no writer's request (see above) is dropped."""
        if msg.subject != LEDGER_YIELD or (msg.reply or "").startswith("$JS.ACK."):
            self._forged(msg.subject)
            return
        writer, _, raw = msg.data.partition(b" ")
        node = raw.decode(errors="replace")
        now = time.monotonic()
        if writer == self.writer or node not in self.known or now < self.again.get(node, 0.0):
            return
        self.until[node] = now + self.yield_s
        self.again[node] = now + 2 * self.yield_s
        LEDGER_YIELDS.labels("taken").inc()

    def _forged(self, subject: str) -> None:
        LEDGER_YIELDS.labels("forged").inc()
        if subject not in self.warned:  # once per subject: a node may write its key as often as it likes
            self.warned.add(subject)
            log.warning("ignoring messages of %s delivered to %s: no writer's request to yield", subject, LEDGER_YIELD)

    async def ask(self, node: str) -> None:
        LEDGER_YIELDS.labels("asked").inc()
        with contextlib.suppress(Exception):  # a hint: a write never depends on it
            await self.nc.publish(LEDGER_YIELD, self.writer + b" " + node.encode())
