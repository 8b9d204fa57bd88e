"""The dashboard in a real headless Chromium against a running allocator on a real nats-server:
what the cluster, node and card views show, held against the ledger, as the ledger moves.

With ``GPULEDGER_SCREENSHOTS=docs/images`` each view is saved there (docs/dashboard.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import ROUND_HALF_UP, Decimal

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.inventory_api import get_subject
from gpuledger_core.model import Health, Remedy
from gpuledger_dev.fleet import Fleet
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.integration.dashboard.pages import (
    card_tile,
    choose,
    holder_rows,
    labels_apart,
    node_rows,
    plot_points,
    save_screenshot,
    search,
    tile,
)
from tests.support.browser import Page, chromium
from tests.support.replicas import RunningAllocator

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20Z
TIMELINE = (
    "[...document.querySelectorAll('#history .timeline .step')].map(s => [...s.children].map(c => c.textContent))"
)


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


def pod_request(namespace: str, name: str, container: str, node: str, **request: int) -> pb.AllocateRequest:
    owner = pb.Owner(kind="pod", id=f"uid-{name}", namespace=namespace, name=name)
    ask = pb.ContainerRequest(container=container, request=pb.ResourceRequest(gpu=1, **request))
    return pb.AllocateRequest(owner=owner, containers=[ask], node=node, commit=True)


async def rows_are(page: Page, nodes: list[str]) -> None:
    """Wait until the node list shows exactly ``nodes`` (the last list seen is in the timeout's message)."""
    await page.wait_for(f"JSON.stringify({node_rows()}) === {json.dumps(json.dumps(nodes, separators=(',', ':')))}")


async def goto(page: Page, where: str) -> None:
    await page.evaluate(f"location.hash = {json.dumps(where)}")


@pytest.mark.timeout(120)
async def test_cluster_node_and_card_views_show_the_ledger_and_follow_it(
    sampling_allocator: RunningAllocator, nc: Client, fleet: Fleet
) -> None:
    api = sampling_allocator.stub()
    async with chromium(1400, 1000) as page:
        await page.goto(f"http://127.0.0.1:{sampling_allocator.http_port()}/")
        await rows_are(page, ["h100-0", "p4-0", "rtx-0"])
        assert (await tile(page, "nodes"), await tile(page, "cards"), await tile(page, "holders")) == ("3", "11", "0")
        await page.wait_for("document.getElementById('live').className === 'on'")

        trainer = await api.allocate(pod_request("research", "trainer-1", "main", "rtx-0", gpu_mem_mib=12000))
        infer = await api.allocate(
            replace(
                pod_request("serving", "infer-0", "server", "h100-0", gpu_mem_mib=20000, gpu_core_permille=300),
                isolation="mps",
            )
        )
        # no reload: the page follows the event stream
        await page.wait_for("document.querySelector('[data-tile=holders] .value').textContent === '2'")
        listed = await api.get_cluster(pb.GetClusterRequest())
        cards = [c for n in listed.nodes for c in n.cards]
        total = sum(c.memory_mib for c in cards)
        granted = sum(c.memory_mib - c.free_mem_mib for c in cards)
        assert granted == 32000
        assert await tile(page, "memory") == gib(granted)
        detail = await page.evaluate("document.querySelector('[data-tile=memory] .detail').textContent")
        assert detail.startswith(f"of {gib(total)} ({round(100 * granted / total)} %)")

        # filters, asked of the allocator: namespace, name, state
        await choose(page, "f-namespace", "research")
        await rows_are(page, ["rtx-0"])
        await choose(page, "f-namespace", "")
        await rows_are(page, ["h100-0", "p4-0", "rtx-0"])
        await search(page, "h100")
        await rows_are(page, ["h100-0"])
        await search(page, "")
        await rows_are(page, ["h100-0", "p4-0", "rtx-0"])

        # the node view: each card's holders by name, plots of its samples
        await goto(page, "#/node/rtx-0")
        shown = await page.wait_for(f"{card_tile('rtx-0', 0)}?.querySelector('.holders').textContent")
        assert shown == "1 holder: research/trainer-1"
        granted = await page.evaluate("document.querySelector('[data-fact=\"memory granted\"]').textContent")
        assert granted.startswith("11.7 GiB of 23.7 GiB")  # 12,000 of 24,259 MiB
        assert await page.wait_for(f"{plot_points('memory', 'granted')} >= 2 && {plot_points('memory', 'granted')}")
        legend = "[...document.querySelectorAll('[data-plot=memory] .plot-legend li')].map(li => li.textContent)"
        assert "granted11.7 GiB" in await page.wait_for(f"{legend}.includes('granted11.7 GiB') && {legend}")
        await save_screenshot(page, "node")

        # a long model name stays apart from the card's number and state
        await goto(page, "#/node/h100-0")
        await page.wait_for(f"{card_tile('h100-0', 7)} !== null")
        for index in range(8):
            assert await labels_apart(page, "h100-0", index), f"card {index}'s labels overlap"
        assert await page.evaluate(f"{card_tile('h100-0', 7)}.querySelector('.model').textContent") == (
            "NVIDIA H100 80GB HBM3"
        )

        # the card view: its holders as the ledger holds them
        index = infer.allocation.grants[0].cards[0].index
        free = next(c.free_mem_mib for n in listed.nodes if n.name == "h100-0" for c in n.cards if c.index == index)
        await goto(page, f"#/node/h100-0/card/{index}")
        rows = await page.wait_for(f"{holder_rows()}.length === 1 && {holder_rows()}")
        assert rows[0][:9] == [
            "serving",
            "infer-0",
            "server",
            "19.5 GiB (20,000 MiB)",
            "n/m",
            "30 %",
            "n/m",
            "mps",
            "bound",
        ]
        assert rows[0][9].startswith(_utc(infer.allocation.created_at))
        layout = "[...document.querySelectorAll('#layout .share-legend li')].map(li => li.textContent)"
        assert await page.evaluate(layout) == [
            "serving/infer-0 [server]19.5 GiB (20,000 MiB)",
            f"free{gib(free)} ({free:,} MiB)",
            "serving/infer-0 [server]30 %",
            "free70 %",
        ]
        assert "Not in MIG mode" in await page.evaluate(
            "document.getElementById('mig').textContent"
        )
        await save_screenshot(page, "card")

        # repairs: filtered by state, marked on the node, each step of the card's history shown
        p4 = next(n.node for n in fleet.nodes if n.node.name == "p4-0")
        xid = "XID 79: GPU has fallen off the bus"
        repairs = (
            replace(p4.cards[0], health=Health.UNHEALTHY, health_reason=xid, remedy=Remedy.DRAIN),
            replace(p4.cards[1], health=Health.UNHEALTHY, health_reason="bad fan", remedy=Remedy.RETIRED),
        )
        await announce(nc, [replace(p4, cards=repairs)])
        inventory = await bus.Responder(nc, get_subject("p4-0"), p4_inventory(p4.cards[1].uuid)).start()
        try:
            await goto(page, "#/")
            await choose(page, "f-state", "retired")
            await rows_are(page, ["p4-0"])
            await choose(page, "f-state", "")
            await goto(page, "#/node/p4-0")
            draining = await page.wait_for(f"{card_tile('p4-0', 0)}?.className")
            assert draining == "card state-draining"
            assert await page.evaluate(f"{card_tile('p4-0', 0)}.querySelector('.reason').textContent") == xid
            await goto(page, "#/node/p4-0/card/1")
            steps = await page.wait_for(f"{TIMELINE}.length === 4 && {TIMELINE}")
        finally:
            await inventory.close()
        assert [step[1] for step in steps] == ["fault", "quarantined", "drained", "retired"]
        assert steps[0] == ["2023-11-14 22:13:20Z", "fault", "bad fan", "operator:ana"]
        assert steps[1][2] == "retired by operator:ana (<i>fan</i> replaced)"  # text, never HTML
        assert await page.evaluate("document.querySelector('#history .timeline i') === null")

        await api.release(pb.ReleaseRequest(allocation_id=trainer.allocation.id))
        await goto(page, "#/")
        await page.wait_for("document.querySelector('[data-tile=holders] .value')?.textContent === '1'")
        await page.wait_for(f"{plot_points('holders', 'holders')} >= 3")
        await save_screenshot(page, "cluster")


def gib(mib: int) -> str:
    """MiB as the page writes GiB (below 100 GiB: one decimal, halves rounded up as toFixed does)."""
    places = Decimal(1) if mib >= 102400 else Decimal("0.1")
    return f"{(Decimal(mib) / 1024).quantize(places, ROUND_HALF_UP)} GiB"


def _utc(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
