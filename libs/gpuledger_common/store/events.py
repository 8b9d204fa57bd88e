"""The ledger's change events (``gpuledger.v1.events.<node>``), published after each write.

The events are not part of the caller's answer: a request handler sends its answer first
(``bus.after_reply``); elsewhere they go out as soon as the write's call returns. A write stands
whether or not its events go out: watchers also see the key change.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from nats.aio.client import Client

from gpuledger_common.bus import SUBJECT_PREFIX, encode
from gpuledger_core import codec
from gpuledger_core.events import diff
from gpuledger_core.ledger import NodeLedger

log = logging.getLogger(__name__)
EVENTS_SUBJECT = f"{SUBJECT_PREFIX}.events"


@dataclass(slots=True)
class Events:
    nc: Client
    _publishing: set[asyncio.Future[None]] = field(default_factory=set)  # events on their way out

    def start(self, old: NodeLedger | None, new: NodeLedger | None, revision: int) -> None:
        """Publish the events of a change from ``old`` to ``new`` in a task of their own."""
        publishing = asyncio.ensure_future(self._publish(old, new, revision))
        self._publishing.add(publishing)
        publishing.add_done_callback(self._publishing.discard)

    async def _publish(self, old: NodeLedger | None, new: NodeLedger | None, revision: int) -> None:
        for event in diff(old, new, revision):
            try:
                subject = f"{EVENTS_SUBJECT}.{event.node}"
                await self.nc.publish(subject, encode(codec.event_to(event)))
            except Exception as err:  # the write stands; watchers also see the key change
                log.warning("could not publish %s event for %s: %s", event.kind, event.node, err)
