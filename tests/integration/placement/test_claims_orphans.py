"""The claims controller's release of ledger entries no ResourceClaim holds, against a real
nats-server: a release that fails (JetStream away) is logged with the claim and the allocation and
counted, and the entry is released after the next listing once the ledger answers again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from nats.aio.client import Client
from prometheus_client import REGISTRY

from gpuledger_common.store import LedgerStore
from gpuledger_core import claims
from gpuledger_core.claims import AllocatedDevice, ClaimRef
from gpuledger_core.errors import Unavailable
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_placement.claims import ClaimsController
from gpuledger_placement.view import FleetView
from tests.support.waiting import polled, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
FAILURES = "gpuledger_placement_claim_orphan_release_failures_total"


class NoClaims:
    """An API server that lists no ResourceClaim; its watch ends in an error when ``relist`` is set."""

    def __init__(self) -> None:
        self.relist = asyncio.Event()
        self.listings = 0

    async def list_objects(self, path: str, params: Mapping[str, str], timeout_s: float = 60.0) -> dict[str, Any]:
        self.listings += 1
        return {"items": [], "metadata": {"resourceVersion": str(self.listings)}}

    async def watch(
        self, path: str, params: Mapping[str, str], timeout_s: float = 300.0
    ) -> AsyncIterator[dict[str, Any]]:
        await self.relist.wait()
        self.relist.clear()
        raise Unavailable("the watch ended")
        yield {}  # an async generator

    async def get_object(self, path: str) -> dict[str, Any]:
        raise AssertionError(f"no claim to get ({path})")

    async def replace_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise AssertionError(f"no claim to write ({path})")


def failures(code: str) -> float:
    return REGISTRY.get_sample_value(FAILURES, {"code": code}) or 0.0


async def orphaned(store: LedgerStore, fleet: Fleet) -> tuple[FleetView, Allocation]:
    """The first node's ledger with the entry of a claim deleted an hour ago, in the store and a view."""
    node = fleet.nodes[0].node
    gone = ClaimRef("ns", "gone", "uid-of-a-deleted-claim")
    orphan = claims.ledger_allocation(gone, [AllocatedDevice("gpu", node.name, "gpu-0")], node, time.time() - 3600)
    written = await store.mutate(node.name, lambda _: NodeLedger(node, (orphan,)))
    view = FleetView(store, stale_after_s=0, slots_per_card=8)
    assert written.new is not None
    view.apply(node.name, written.new, written.revision)
    view.ready.set()
    return view, orphan


async def test_a_failed_release_of_an_orphan_is_logged_and_counted_and_tried_again_after_the_next_listing(
    nats_server: NatsServer, nc: Client, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    store = await LedgerStore.open(nc, retry_s=0.5)
    view, orphan = await orphaned(store, fleet)
    api = NoClaims()
    controller = ClaimsController(api, store, view)
    before = failures("unavailable")
    await nats_server.kill()
    caplog.set_level(logging.WARNING, logger="gpuledger_placement.claims")
    running = asyncio.create_task(controller.run())
    try:
        await wait_for(polled(lambda: failures("unavailable") > before), 20, "the failed release counted", 0.05)
        [said] = [r.getMessage() for r in caplog.records if "was not released" in r.getMessage()]
        assert orphan.id in said and "ResourceClaim ns/gone (uid uid-of-a-deleted-claim)" in said
        assert f"on {orphan.node}" in said
        await nats_server.start()
        api.relist.set()

        async def released() -> bool:
            ledger, _ = await store.read(orphan.node)
            return ledger is not None and not ledger.live()

        await wait_for(released, 30, "the orphan released after the next listing", 0.1)
        assert api.listings >= 2
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_an_entry_no_claim_holds_is_released_by_the_periodic_look_while_the_watch_runs_on(
    nc: Client, fleet: Fleet
) -> None:
    """The watch never ends (no listing after the first); an entry left without its claim after that
    listing (its deletion missed) is released by the look every ``resync_s``. One whose claim mode C
    is allocating right now is left to it."""
    store = await LedgerStore.open(nc, retry_s=0.5)
    view = FleetView(store, stale_after_s=0, slots_per_card=8)
    view.ready.set()
    api = NoClaims()
    controller = ClaimsController(api, store, view, resync_s=0.2)
    running = asyncio.create_task(controller.run())
    try:
        await wait_for(polled(lambda: api.listings >= 1), 10, "the first listing", 0.05)
        node = fleet.nodes[0].node
        devices = [AllocatedDevice("gpu", node.name, "gpu-0")]
        left = claims.ledger_allocation(ClaimRef("ns", "gone", "uid-gone"), devices, node, time.time() - 3600)
        busy = claims.ledger_allocation(ClaimRef("ns", "busy", "uid-busy"), devices, node, time.time() - 3600)
        controller.allocating.add("uid-busy")
        written = await store.mutate(node.name, lambda _: NodeLedger(node, (left, busy)))
        assert written.new is not None
        view.apply(node.name, written.new, written.revision)

        async def released() -> bool:
            ledger, _ = await store.read(node.name)
            return ledger is not None and [a.id for a in ledger.live()] == [busy.id]

        await wait_for(released, 10, "the entry without its claim released, mode C's left", 0.1)
        assert api.listings >= 2 and not api.relist.is_set()  # the looks listed; the watch ran on
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
