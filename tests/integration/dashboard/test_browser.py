"""The dashboard in a real headless Chromium against a running allocator on a real nats-server."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import pytest
from nats.aio.client import Client

from gpuledger_common.announce import announce
from gpuledger_core.model import Health, Remedy
from gpuledger_dev.fleet import Fleet
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.browser import chromium
from tests.support.replicas import RunningAllocator

CARDS = "[...document.querySelectorAll('.card')]"
DETAILS = "document.getElementById('details')"
FILTER = "document.getElementById('filter-node')"


def p4_card(index: int) -> str:
    return f'document.querySelector(\'.card[data-node="p4-0"][data-index="{index}"]\')'


def rtx_card() -> str:
    return 'document.querySelector(\'.card[data-node="rtx-0"][data-index="0"]\')'


@pytest.mark.timeout(90)
async def test_dashboard_shows_the_cluster_and_follows_allocations(
    allocator: RunningAllocator, nc: Client, fleet: Fleet
) -> None:
    url = f"http://127.0.0.1:{allocator.http_port()}/"
    async with chromium() as page:
        await page.goto(url)
        count = await page.wait_for(f"{CARDS}.length === 11 && {CARDS}.length")
        assert count == 11  # rtx-0: 1, p4-0: 2, h100-0: 8
        summary = await page.evaluate("document.getElementById('summary').textContent")
        assert summary == "3 node(s), 11 card(s), 0 in use"
        assert await page.evaluate(f"{rtx_card()}.querySelector('.health').textContent") == "healthy"
        assert await page.evaluate(f"{rtx_card()}.title") == "free"
        await page.wait_for("document.getElementById('live').className === 'on'")

        api = allocator.stub()
        await api.allocate(
            pb.AllocateRequest(
                owner=pb.Owner(kind="tool", id="notebook-7"),
                containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1, gpu_mem_mib=12000))],
                node="rtx-0",
                commit=True,
            )
        )
        # No reload: the page follows the event stream.
        held = await page.wait_for(f"{rtx_card()}.title.includes('notebook-7') && {rtx_card()}.title")
        assert "12000 MiB" in held and "bound" in held
        assert await page.evaluate(f"{rtx_card()}.querySelector('.mem-text').textContent") == "12000/24259 MiB"
        width = await page.evaluate(f"{rtx_card()}.querySelector('.bar.mem > div').style.width")
        assert width == "49%"
        assert (
            await page.evaluate("document.getElementById('summary').textContent") == "3 node(s), 11 card(s), 1 in use"
        )

        await page.evaluate(f"{rtx_card()}.click()")
        details = await page.wait_for(
            "!document.getElementById('details').hidden && document.getElementById('details').textContent"
        )
        assert "notebook-7" in details and "rtx-0 card 0" in details

        # a card under repair is shown apart from a plain unhealthy one, with its fault's reason
        p4 = next(n.node for n in fleet.nodes if n.node.name == "p4-0")
        xid = "XID 79: GPU has fallen off the bus"
        repairs = (
            replace(p4.cards[0], health=Health.UNHEALTHY, health_reason=xid, remedy=Remedy.DRAIN),
            replace(p4.cards[1], health=Health.UNHEALTHY, health_reason="bad fan", remedy=Remedy.RETIRED),
        )
        await announce(nc, [replace(p4, cards=repairs)])
        draining = await page.wait_for(f"{p4_card(0)}.classList.contains('draining') && {p4_card(0)}.className")
        assert draining == "card unhealthy repair draining"
        assert await page.evaluate(f"{p4_card(0)}.querySelector('.health').textContent") == "draining"
        assert await page.evaluate(f"{p4_card(0)}.querySelector('.state').textContent") == f"draining: {xid}"
        assert await page.evaluate(f"{p4_card(0)}.title") == f"draining: {xid}\nfree"
        assert await page.evaluate(f"{p4_card(1)}.className") == "card unhealthy repair retired"
        await page.evaluate(f"{p4_card(1)}.click()")
        details = await page.wait_for(f"{DETAILS}.textContent.includes('retired: bad fan') && {DETAILS}.textContent")
        assert "gpuledger health --node p4-0" in details
        assert await page.evaluate(f"{rtx_card()}.className") == "card"

        await page.evaluate(
            "(e => { e.value = 'p4'; e.dispatchEvent(new Event('input')); })(document.getElementById('filter-node'))"
        )
        assert await page.wait_for(f"{CARDS}.length === 2")
        shot = os.environ.get("GPULEDGER_SCREENSHOT")  # for a person to look at
        if shot:
            image = await page.screenshot()
            await asyncio.to_thread(Path(shot).write_bytes, image)
