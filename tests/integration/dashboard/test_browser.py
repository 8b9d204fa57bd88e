"""The dashboard in a real headless Chromium against a running allocator on a real nats-server."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.inventory_api import get_subject
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


HISTORY = f"[...{DETAILS}.querySelectorAll('.timeline .step')].map(s => [...s.children].map(c => c.textContent))"
T0 = 1_700_000_000.0  # 2023-11-14 22:13:20Z


def p4_inventory(uuid: str) -> bus.Handler:
    """p4-0's inventory answering ``get``: card 1 faulted, then retired by an operator."""
    by_hand = "retired by operator:ana (<i>fan</i> replaced)"
    steps = [("quarantined", 1, by_hand), ("drained", 2, "no holder and no process"), ("retired", 3, "drained")]
    card = {
        "uuid": uuid,
        "index": 1,
        "health": {"state": "unhealthy", "reason": "bad fan", "since": T0, "by": "operator:ana", "action": "retire"},
        "remediation": {
            "stage": "retired",
            "since": T0 + 3,
            "history": [{"at": T0 + dt, "stage": stage, "reason": why} for stage, dt, why in steps],
        },
    }
    fault = {"node": "p4-0", "at": T0, "uuid": uuid, "health": "unhealthy", "reason": "bad fan", "by": "operator:ana"}
    message = {
        "node": {"name": "p4-0", "cards": [{"uuid": uuid, "remedy": "retired"}]},
        "at": T0 + 3,
        "extra": {"cards": [card], "health_log": [fault]},
    }

    async def answer(_: object) -> object:
        return message

    return answer


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
        # nobody serves rtx-0's inventory: the page says its history cannot be had
        unavailable = await page.wait_for(f"{DETAILS}.querySelector('#history .problem')?.textContent")
        assert unavailable == "history unavailable: the node's inventory did not answer"

        # a card under repair is shown apart from a plain unhealthy one, with its fault's reason
        p4 = next(n.node for n in fleet.nodes if n.node.name == "p4-0")
        xid = "XID 79: GPU has fallen off the bus"
        repairs = (
            replace(p4.cards[0], health=Health.UNHEALTHY, health_reason=xid, remedy=Remedy.DRAIN),
            replace(p4.cards[1], health=Health.UNHEALTHY, health_reason="bad fan", remedy=Remedy.RETIRED),
        )
        await announce(nc, [replace(p4, cards=repairs)])
        inventory = await bus.Responder(nc, get_subject("p4-0"), p4_inventory(p4.cards[1].uuid)).start()
        draining = await page.wait_for(f"{p4_card(0)}.classList.contains('draining') && {p4_card(0)}.className")
        assert draining == "card unhealthy repair draining"
        assert await page.evaluate(f"{p4_card(0)}.querySelector('.health').textContent") == "draining"
        assert await page.evaluate(f"{p4_card(0)}.querySelector('.state').textContent") == f"draining: {xid}"
        assert await page.evaluate(f"{p4_card(0)}.title") == f"draining: {xid}\nfree"
        assert await page.evaluate(f"{p4_card(1)}.className") == "card unhealthy repair retired"
        await page.evaluate(f"{p4_card(1)}.click()")
        details = await page.wait_for(f"{DETAILS}.textContent.includes('retired: bad fan') && {DETAILS}.textContent")
        assert "gpuledger health --node p4-0" in details
        # its history, asked of p4-0's inventory: a timeline of its stages, every word as text
        steps = await page.wait_for(f"{DETAILS}.querySelectorAll('.timeline .step').length === 4 && {HISTORY}")
        await inventory.close()
        assert [step[1] for step in steps] == ["fault", "quarantined", "drained", "retired"]
        assert steps[0] == ["2023-11-14 22:13:20Z", "fault", "bad fan", "operator:ana"]
        by_hand = [
            "2023-11-14 22:13:21Z",
            "quarantined",
            "retired by operator:ana (<i>fan</i> replaced)",
            "operator:ana",
        ]
        assert steps[1] == by_hand and steps[-1][3] == "rule:remediation"
        assert await page.evaluate(f"{DETAILS}.querySelector('.timeline i') === null")
        assert await page.evaluate(f"{rtx_card()}.className") == "card"

        await page.evaluate(
            "(e => { e.value = 'p4'; e.dispatchEvent(new Event('input')); })(document.getElementById('filter-node'))"
        )
        assert await page.wait_for(f"{CARDS}.length === 2")
        shot = os.environ.get("GPULEDGER_SCREENSHOT")  # for a person to look at
        if shot:
            image = await page.screenshot()
            await asyncio.to_thread(Path(shot).write_bytes, image)
