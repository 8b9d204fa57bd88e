"""Announce a fleet's nodes on NATS as their inventory services would (tests, local stack)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from nats.aio.client import Client

from gpuledger_core import codec
from gpuledger_core.model import Node
from gpuledger_common.bus import SUBJECT_PREFIX, encode


def inventory_subject(node: str) -> str:
    return f"{SUBJECT_PREFIX}.inventory.{node}"


def heartbeat_subject(node: str) -> str:
    return f"{SUBJECT_PREFIX}.heartbeat.{node}"


async def announce(nc: Client, nodes: Iterable[Node], seq: int = 0) -> None:
    """Publish each node's inventory and a heartbeat, then flush."""
    now = time.time()
    for node in nodes:
        await nc.publish(inventory_subject(node.name), encode({"node": codec.node_to(node), "at": now, "extra": {}}))
        await nc.publish(heartbeat_subject(node.name), encode({"node": node.name, "at": now, "seq": seq}))
    await nc.flush()
