"""A node speaks for itself only: placement's view takes a heartbeat from its own subject, so node
A (which may publish only on its own subjects) cannot keep node B alive."""

from __future__ import annotations

from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_placement.view import FleetView
from tests.support.waiting import wait_for


async def test_placement_takes_a_heartbeat_only_from_its_nodes_subject(nc: Client) -> None:
    view = FleetView(None, slots_per_card=8)
    await view.listen(nc)
    try:
        await nc.publish("gpuledger.v1.heartbeat.node-a", bus.encode({"node": "node-b", "at": 1.0, "seq": 0}))
        await nc.publish("gpuledger.v1.inventory.node-a", bus.encode({"node": {"name": "node-b"}, "at": 1.0}))
        # then true ones on each subscription: once they are in, the forged ones before them were seen
        await nc.publish("gpuledger.v1.heartbeat.node-a", bus.encode({"node": "node-a", "at": 1.0, "seq": 1}))
        await nc.publish("gpuledger.v1.inventory.node-c", bus.encode({"node": {"name": "node-c"}, "at": 1.0}))

        async def heard() -> bool:
            return {"node-a", "node-c"} <= set(view.heartbeats)

        await wait_for(heard, what="the true heartbeats")
        assert "node-b" not in view.heartbeats
    finally:
        await view.stop_listening()
