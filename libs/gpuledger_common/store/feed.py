"""Following every node's value: one ordered consumer of the ledger's stream whose callback decodes
each change and hands it to the follower's ``apply``, with no queue and no task between them.

A store fed so knows its values are current (``Known.followed``): after a lost race it waits for
the watch to bring the winner instead of reading the key, and it takes part in yielding a hot key
(``yielding``). A value that cannot be read is its node's problem alone (``unreadable``): the
follower hears of it, and every other node is followed on. ``gpuledger_common.store.follow``
starts a feed again after it fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DeliverPolicy

from gpuledger_common.store.buckets import KEY_PREFIX, LEDGER_BUCKET, Buckets
from gpuledger_common.store.known import Known
from gpuledger_common.store.listing import Listing
from gpuledger_common.store.unreadable import BadValues, Unreadable
from gpuledger_common.store.values import UnreadableValue, Values
from gpuledger_common.store.yielding import Yielding
from gpuledger_core.errors import Unavailable
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger

Apply = Callable[[NodeName, NodeLedger | None, int], None]


@dataclass(slots=True)
class Following:
    """A running ``follow_values``: ``failed`` holds why it stopped applying, if it did."""

    sub: Subscription | None = None
    failed: Exception | None = None

    async def stop(self) -> None:
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
            self.sub = None


@dataclass(slots=True)
class Feed:
    buckets: Buckets
    values: Values
    known: Known
    yielding: Yielding
    listing: Listing
    bad: BadValues

    async def follow(
        self, apply: Apply, caught_up: Callable[[], None], unreadable: Unreadable | None = None
    ) -> Following:
        """Call ``apply`` for every node's current value, then ``caught_up`` (once every key the
        bucket held has arrived, as ``snapshot`` decides it), then for every change, from the
        subscription's own callback: no queue and no task between a change and ``apply``. A
        value that cannot be read goes to ``unreadable`` instead (and counts as arrived). The
        returned handle says whether it failed, and stops it."""
        following = Following()
        watched, bad = self.values.watched, self.bad
        try:
            await self.yielding.listen()
            keys = await self.listing.keys_now()
            if not keys:
                caught_up()

            async def on_msg(msg: Msg) -> None:
                if following.failed is not None:
                    return
                try:
                    key = msg.subject.removeprefix(KEY_PREFIX)
                    node = NodeName(key.removeprefix("node."))
                    operation = msg.header.get("KV-Operation") if msg.header else None
                    try:
                        apply(node, watched(node, msg.data, operation), stream_sequence(msg))
                    except UnreadableValue as err:  # the node's problem alone: the others are followed on
                        revision = stream_sequence(msg)
                        why = bad.noted(node, revision, err)
                        if unreadable is not None:
                            unreadable(node, revision, why)
                    if keys:
                        keys.discard(key)
                        if not keys:
                            caught_up()
                except Exception as err:  # the follower could not take a value: it starts again
                    following.failed = err

            following.sub = await self.buckets.js.subscribe(
                f"{KEY_PREFIX}node.>",
                stream=f"KV_{LEDGER_BUCKET}",
                cb=on_msg,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                inactive_threshold=300.0,
            )
        except Exception as err:
            raise Unavailable(f"cannot watch the ledger: {err}") from err
        self.known.followed = True  # from now on the known values are the watch's (see ``Known.start_from``)
        return following


def stream_sequence(msg: Msg) -> int:
    """A delivered JetStream message's stream sequence (a key's revision), read from its reply
    subject as ``msg.metadata`` reads it, without building the rest of the metadata: the watch of
    the ledger reads one per change. ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>...``
    (9 tokens), or with the domain and account hash after ``ACK`` (12 or more)."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9:
        return int(tokens[5])
    if len(tokens) >= 12:
        return int(tokens[7])
    return msg.metadata.sequence.stream  # not a JetStream delivery: nats-py says what is wrong
