"""The allocator asks the placement service, and after it failed to answer, fits alone a while."""

from __future__ import annotations

from nats.aio.client import Client
from nats.aio.msg import Msg

from gpuledger_allocator.finder import PLACE_SUBJECT, PlacementFinder
from gpuledger_allocator.view import ClusterView
from gpuledger_common import bus
from gpuledger_common.store import LedgerStore
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.model import Request

ASKS = (ContainerAsk("", Request(count=1)),)


class Fallback:
    def __init__(self) -> None:
        self.calls = 0

    async def candidates(self, view: ClusterView, asks: object, exclude: object = ()) -> list[object]:
        self.calls += 1
        return []


async def test_placement_away_is_not_asked_again_until_the_retry_window_ends(nc: Client) -> None:
    view = ClusterView(await LedgerStore.open(nc))
    fallback = Fallback()
    patient = PlacementFinder(nc, timeout_s=0.5, retry_s=3600.0, fallback=fallback)  # type: ignore[arg-type]
    eager = PlacementFinder(nc, timeout_s=0.5, retry_s=0.0, fallback=fallback)  # type: ignore[arg-type]
    for finder in (patient, eager):
        await finder.candidates(view, ASKS)  # nobody serves placement yet
    assert fallback.calls == 2

    asked: list[Msg] = []

    async def placement(msg: Msg) -> None:
        asked.append(msg)
        await msg.respond(bus.encode({"ok": True, "result": {"node": "n1", "containers": [], "ranked": []}}))

    await nc.subscribe(PLACE_SUBJECT, cb=placement)
    await nc.flush()
    assert await patient.candidates(view, ASKS) == []  # within its window: fits alone, asks nobody
    assert (fallback.calls, len(asked)) == (3, 0)
    found = await eager.candidates(view, ASKS)  # its window is over: asks placement
    assert [c.node for c in found] == ["n1"]
    assert (fallback.calls, len(asked), eager.answered) == (3, 1, 1)
