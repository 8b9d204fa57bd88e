"""Card-granular remediation on the real control plane (docs/remediation.md, "Draining a card"):
three pods on three cards of one node; the node's inventory, restarted with remediation on and a
fleet file whose fake NVML reports XID 79 on one of those cards, marks that card remedy drain;
placement evicts the one pod on it (an Event on the pod and one on the Node), the allocator
releases its cards, the inventory resets the card (the fake answers the reset), checks it and
returns it healthy to the ledger. The pods on the node's other cards keep running throughout."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger_core.model import Health, Remedy
from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.local_stack import Stack
from tests.e2e.conftest import E2E_FLEET
from tests.e2e.helpers import POLL_S, get_pod, ledger, namespace, pod, pods_in, running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

NODE = "v100-0"  # eight cards
PODS = ("first", "second", "third")
FAULT_AT_S = 10  # after the inventory's start: its NVML events are being read by then


def faulty_fleet(directory: Path, card: int) -> Path:
    """The suite's fleet file with XID 79 on ``card`` of ``NODE``, ``FAULT_AT_S`` after the start."""
    fleet = yaml.safe_load(E2E_FLEET.read_text())
    for node in fleet["nodes"]:
        if node["name"] == NODE:
            node["faults"] = [{"at": FAULT_AT_S, "card": card, "xid": 79}]
    path = directory / "drain-fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    return path


def _now() -> str:
    """Now as the API server stamps objects (RFC 3339, whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def remediating(args: list[str], fleet: Path) -> list[str]:
    changed = list(args)
    changed[changed.index("--fake-fleet") + 1] = str(fleet)
    return [*changed, "--remediate"]


async def card_of(stack: Stack, uid: str) -> int:
    held = [a for a in (await ledger(stack))[NODE].live() if a.owner.id == uid]
    assert len(held) == 1 and len(held[0].shares()) == 1, held
    return held[0].shares()[0].index


@pytest.mark.timeout(300)
async def test_an_xid_79_evicts_only_the_pods_on_that_card_which_is_reset_and_back(
    stack: Stack, api: KubeApi, tmp_path: Path
) -> None:
    inventory = stack.supervisor.get(f"inventory-{NODE}")
    original = list(inventory.args)
    async with namespace(api, "e2e-drain", stack) as ns:
        uids: dict[str, str] = {}
        for name in PODS:  # whole cards: each pod on a card of its own
            made = await api.create(
                f"/api/v1/namespaces/{ns}/pods", pod(name, ns, {"gpuledger.io/gpu": "1"}, node=NODE)
            )
            await running(api, ns, name)
            uids[name] = made["metadata"]["uid"]
        cards = {name: await card_of(stack, uid) for name, uid in uids.items()}
        assert len(set(cards.values())) == len(PODS), cards
        failing = cards["first"]
        try:
            since = _now()
            inventory.args = remediating(original, faulty_fleet(tmp_path, failing))
            await stack.supervisor.restart(inventory.name)
            await _drained_and_back(stack, api, ns, uids, failing, since)
        finally:
            inventory.args = original
            await stack.supervisor.restart(inventory.name)


async def _drained_and_back(
    stack: Stack, api: KubeApi, ns: str, uids: dict[str, str], failing: int, since: str
) -> None:
    """``since``: when the test made the card fail (an RFC 3339 time, to the second): the Node's
    events of earlier tests are older."""

    async def card() -> Any:
        return next(c for c in (await ledger(stack))[NODE].node.cards if c.index == failing)

    async def marked() -> bool:
        return (await card()).remedy is Remedy.DRAIN

    await wait_for(marked, 60, f"card {failing} of {NODE} marked remedy drain", POLL_S)

    async def evicted() -> bool:
        return not any(p["metadata"]["name"] == "first" for p in await pods_in(api, ns))

    await wait_for(evicted, 60, "pod first evicted and gone", POLL_S)

    async def back() -> bool:
        found = await card()
        return found.health is Health.HEALTHY and found.remedy is Remedy.NONE

    await wait_for(back, 120, f"card {failing} reset, checked and healthy again", POLL_S)
    for name in ("second", "third"):
        kept = await get_pod(api, ns, name)
        assert kept["status"].get("phase") == "Running" and not kept["metadata"].get("deletionTimestamp"), name
        assert kept["metadata"]["uid"] == uids[name]
    live = {a.owner.id for a in (await ledger(stack))[NODE].live()}
    assert live >= {uids["second"], uids["third"]} and uids["first"] not in live

    events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
    drained = [e for e in events if e.get("reason") == "GpuledgerCardDrained"]
    assert [e["involvedObject"]["name"] for e in drained] == ["first"], drained
    assert f"card {failing} " in drained[0]["message"] and "XID 79" in drained[0]["message"], drained[0]["message"]
    node_events = (await api.get("/api/v1/namespaces/default/events"))["items"]
    told = [
        e
        for e in node_events
        if e.get("reason") == "GpuledgerDrainingCard"
        and e["involvedObject"]["name"] == NODE
        and e["metadata"]["creationTimestamp"] >= since
    ]
    assert len(told) == 1 and "moving 1 pod(s) off" in told[0]["message"], told


@pytest.mark.timeout(300)
async def test_a_budget_that_forbids_the_eviction_holds_the_drain_until_it_allows_and_nothing_is_forced(
    stack: Stack, api: KubeApi, tmp_path: Path
) -> None:
    """A PodDisruptionBudget with no disruption allowed covers the one pod on the failing card: its
    eviction is refused (a GpuledgerDrainBlocked Event on the pod), the pod keeps running and
    holding the card, and the card is neither reset nor returned; once the budget goes, the
    drainer's next try (after its back-off) evicts it and the card is reset and back."""
    inventory = stack.supervisor.get(f"inventory-{NODE}")
    original = list(inventory.args)
    async with namespace(api, "e2e-drain-budget", stack) as ns:
        uids: dict[str, str] = {}
        for name in PODS:
            spec = pod(name, ns, {"gpuledger.io/gpu": "1"}, node=NODE)
            spec["metadata"]["labels"] = {"drain-budget": "kept"} if name == "first" else {}
            made = await api.create(f"/api/v1/namespaces/{ns}/pods", spec)
            await running(api, ns, name)
            uids[name] = made["metadata"]["uid"]
        budgets = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
        keep = {"maxUnavailable": 0, "selector": {"matchLabels": {"drain-budget": "kept"}}}
        await api.create(budgets, {"metadata": {"name": "keep-first"}, "spec": keep})
        failing = await card_of(stack, uids["first"])
        try:
            since = _now()
            inventory.args = remediating(original, faulty_fleet(tmp_path, failing))
            await stack.supervisor.restart(inventory.name)
            await _blocked(stack, api, ns, uids["first"], failing)
            await api.delete(f"{budgets}/keep-first")
            await _drained_and_back(stack, api, ns, uids, failing, since)
        finally:
            inventory.args = original
            await stack.supervisor.restart(inventory.name)


async def _blocked(stack: Stack, api: KubeApi, ns: str, uid: str, failing: int) -> None:
    async def told() -> list[dict[str, Any]]:
        events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
        return [e for e in events if e.get("reason") == "GpuledgerDrainBlocked"]

    blocked = await wait_for(told, 90, "the eviction of pod first refused by its budget", POLL_S)
    assert [e["involvedObject"]["name"] for e in blocked] == ["first"], blocked
    kept = await get_pod(api, ns, "first")
    assert kept["metadata"]["uid"] == uid and not kept["metadata"].get("deletionTimestamp"), kept["metadata"]
    assert kept["status"].get("phase") == "Running"
    found = (await ledger(stack))[NODE]
    card = next(c for c in found.node.cards if c.index == failing)
    assert (card.health, card.remedy) == (Health.UNHEALTHY, Remedy.DRAIN), card
    assert uid in {a.owner.id for a in found.live()}  # still its holder: nothing was forced
