"""The dashboard's card in MIG mode, in a real headless Chromium against a running allocator on a
real nats-server: the node's tile and the card view draw the card as its memory slices with each
placement where the ledger has it (an instance made by the operator and held, one made on demand
and faulted, one held but not made yet), and the card beside it as shares, as before."""

from __future__ import annotations

import json
from dataclasses import replace

import aiohttp
import pytest
from nats.aio.client import Client

from gpuledger_common.announce import announce
from gpuledger_core.model import MigInstance, MigSlot, Remedy
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.integration.dashboard.pages import card_tile, save_screenshot
from tests.integration.placement.helpers import MIG_NODE, STATIC, mig_node
from tests.support.browser import chromium
from tests.support.replicas import RunningAllocator, wait_for

pytestmark = [pytest.mark.integration]
FAULTED = MigInstance(MigSlot("1g.10gb", 0, 2), static=False, uuid="MIG-made", fault="XID 94", remedy=Remedy.DRAIN)
PLACEMENTS = (
    "[...{tile}.querySelectorAll('.mig-bar .mig-inst')].map(s => [s.dataset.placement, s.className, s.style.gridArea])"
)
ROWS = (
    "[...document.querySelectorAll('#mig table.mig tbody tr')]"
    ".map(r => [r.dataset.placement, ...[...r.cells].map(c => c.textContent)])"
)


def tool(owner: str, profile: str) -> pb.AllocateRequest:
    ask = pb.ContainerRequest(container="main", request=pb.ResourceRequest(gpu=1, mig=profile))
    return pb.AllocateRequest(owner=pb.Owner(kind="tool", id=owner), containers=[ask], node=MIG_NODE, commit=True)


@pytest.mark.timeout(90)
async def test_a_mig_card_is_drawn_as_its_slices_with_its_placements(allocator: RunningAllocator, nc: Client) -> None:
    node = mig_node()
    mig_card = replace(node.cards[0], instances=(STATIC, FAULTED))
    await announce(nc, [replace(node, cards=(mig_card, node.cards[1]))])
    api = allocator.stub()

    async def known() -> bool:
        return any(n.name == MIG_NODE for n in (await api.get_cluster(pb.GetClusterRequest())).nodes)

    await wait_for(known, what="the MIG node in the ledger")
    static = (await api.allocate(tool("t-static", "3g.20gb"))).allocation
    small = (await api.allocate(tool("t-small", "1g.10gb"))).allocation
    held = small.grants[0].cards[0].mig
    assert (held.profile, held.start) != ("1g.10gb", 0)  # never the faulted instance

    base = f"http://127.0.0.1:{allocator.http_port()}"
    async with aiohttp.ClientSession() as session, session.get(f"{base}/api/nodes/{MIG_NODE}") as reply:
        body = await reply.json()
    card0, card1 = body["node"]["cards"]
    assert (card0["mode"], card0["mig_slices"], "mig_slices" in card1) == ("mig", 8, False)
    assert {h["allocation_id"]: h["mig"] for h in card0["holders"]} == {
        static.id: {"profile": "3g.20gb", "start": 4, "size": 4},
        small.id: {"profile": held.profile, "start": held.start, "size": held.size},
    }

    async with chromium(1400, 1000) as page:
        await page.goto(f"{base}/#/node/{MIG_NODE}")
        tile0 = card_tile(MIG_NODE, 0)
        drawn = await page.wait_for(f"{tile0}?.querySelector('.mig-bar') && {PLACEMENTS.format(tile=tile0)}")
        small_at = f"{held.profile}@{held.start}"
        assert sorted(drawn) == sorted(
            [
                ["1g.10gb@0", "mig-inst free fault", "1 / 1 / 2 / span 2"],
                [small_at, "mig-inst held unmade", f"1 / {held.start + 1} / 2 / span {held.size}"],
                ["3g.20gb@4", "mig-inst held", "1 / 5 / 2 / span 4"],
            ]
        )
        assert await page.evaluate(f"{tile0}.querySelectorAll('.mig-bar .slice').length") == 8
        tile1 = card_tile(MIG_NODE, 1)
        assert await page.evaluate(
            f"[{tile1}.querySelector('.mig-bar'), {tile1}.querySelectorAll('.share-bar').length]"
        ) == [
            None,
            2,
        ]
        await save_screenshot(page, "node-mig")

        await page.evaluate(f"location.hash = {json.dumps(f'#/node/{MIG_NODE}/card/0')}")
        rows = await page.wait_for(f"{ROWS}.length === 3 && {ROWS}")
        assert rows == [
            ["1g.10gb@0", "1g.10gb", "0, 2", "MIG-made", "on demand", "free", "XID 94 [drain]"],
            [
                small_at,
                held.profile,
                f"{held.start}, {held.size}",
                "-",
                "not yet (held; made when its pod starts)",
                "tool:t-small [main]",
                "-",
            ],
            ["3g.20gb@4", "3g.20gb", "4, 4", "MIG-static-3g", "by the operator", "tool:t-static [main]", "-"],
        ]
        legend = "[...document.querySelectorAll('#layout .share-legend li')].map(li => li.textContent)"
        assert await page.evaluate(legend) == [
            "1g.10gb@0 on demand: free, fault XID 94 [drain]",
            f"{small_at} to be made: tool:t-small [main]",
            "3g.20gb@4 static: tool:t-static [main]",
        ]
        await save_screenshot(page, "card-mig")
