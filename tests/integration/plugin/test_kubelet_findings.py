"""Reconciling the ledger with kubelet's record, and bounded answers when NATS is down."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gpuledger_common import bus
from gpuledger_common.store import LedgerStore
from gpuledger_core.ledger import NodeLedger, commit
from gpuledger_core.model import AllocState
from gpuledger_dev.fake_kubelet import AdmissionError, FakeContainer, FakeKubelet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_plugin.app import running
from gpuledger_plugin.metrics import RECONCILE_MISMATCHES
from tests.support.waiting import wait_for

from .conftest import CARDS, NODE, SLOTS, Stack, make_node, plugin_stack, pod, settings_for, share

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def mismatches(kind: str) -> float:
    value: float = RECONCILE_MISMATCHES.labels(kind)._value.get()
    return value


async def test_moved_devices_are_repaired_in_the_ledger(stack: Stack) -> None:
    p = pod("p", FakeContainer("main", gpus=1))
    reserved = await stack.reserve(p, {"main": (share(0),)})
    await stack.kubelet.admit(p)
    stack.kubelet.give(p, "main", ("GPU-card-0::3",))  # kubelet's record says another slot
    before = mismatches("moved")
    findings = await stack.plugin.service.reconcile()
    assert [f.kind for f in findings] == ["moved"]
    assert findings[0].ledger_side != findings[0].kubelet_side
    assert mismatches("moved") == before + 1
    ledger = await stack.ledger()
    now = ledger.get(reserved.id)
    assert now is not None
    assert now.grants[0].device_ids == ("GPU-card-0::3",)
    assert await stack.plugin.service.reconcile() == ()  # repaired: nothing left to find


async def test_swapped_containers_are_swapped_in_the_ledger(stack: Stack) -> None:
    a = pod("a", FakeContainer("main", gpus=1))
    b = pod("b", FakeContainer("main", gpus=1))
    ra = await stack.reserve(a, {"main": (share(0, mem=2048),)})
    rb = await stack.reserve(b, {"main": (share(1, mem=8192),)})
    stack.kubelet.give(a, "main", rb.grants[0].device_ids)
    stack.kubelet.give(b, "main", ra.grants[0].device_ids)
    findings = await stack.plugin.service.reconcile()
    assert [f.kind for f in findings] == ["swapped"]
    ledger = await stack.ledger()
    now_a, now_b = ledger.get(ra.id), ledger.get(rb.id)
    assert now_a is not None
    assert now_b is not None
    assert now_a.grants[0].cards == rb.grants[0].cards  # the ledger now says what a really has
    assert now_b.grants[0].cards == ra.grants[0].cards
    assert now_a.grants[0].container == "main"


async def test_bound_allocation_of_a_vanished_pod_is_released_on_a_second_look_a_while_later(
    dirs: Path, nats_server: NatsServer
) -> None:
    async with plugin_stack(dirs, nats_server, gone_after_s=0.5) as stack:
        p = pod("p", FakeContainer("main", gpus=1))
        reserved = await stack.reserve(p, {"main": (share(0),)})
        await stack.kubelet.admit(p)
        stack.kubelet.remove(p)
        assert await stack.plugin.service.reconcile() == ()  # one look is not enough
        assert await stack.plugin.service.reconcile() == ()  # nor two, so soon after it
        await asyncio.sleep(0.6)
        findings = await stack.plugin.service.reconcile()
        assert [f.kind for f in findings] == ["gone"]
        ledger = await stack.ledger()
        released = ledger.get(reserved.id)
        assert released is not None
        assert released.state is AllocState.RELEASED


async def test_a_bound_pod_kubelet_has_not_admitted_yet_keeps_its_allocation(
    dirs: Path, nats_server: NatsServer
) -> None:
    """A pod bound to the node but still waiting for kubelet (a burst after a kubelet restart) is
    not in kubelet's list, however long it waits: it is not gone, and kubelet admits it later."""
    async with plugin_stack(dirs, nats_server, gone_after_s=0.2) as stack:
        p = pod("p", FakeContainer("main", gpus=1))
        reserved = await stack.reserve(p, {"main": (share(0),)})

        def bind(ledger: NodeLedger | None) -> NodeLedger:
            assert ledger is not None
            return commit(ledger, reserved.id, time.time())

        await stack.store.mutate(reserved.node, bind)  # as the extender's bind does
        assert await stack.plugin.service.reconcile() == ()
        await asyncio.sleep(0.3)
        assert await stack.plugin.service.reconcile() == ()
        held = (await stack.ledger()).get(reserved.id)
        assert held is not None and held.state is AllocState.BOUND
        admitted = await stack.kubelet.admit(p)
        assert admitted.env("main")["GPULEDGER_ALLOCATION_ID"] == reserved.id


async def test_a_pod_kubelet_did_not_list_for_two_quick_rounds_keeps_its_allocation(stack: Stack) -> None:
    """As after a kubelet restart: a round while a pod's devices were being recorded, then one at
    once on the plugin's registration with the new kubelet, before it has listed its pods. The pod
    runs on; it is not gone."""
    p = pod("p", FakeContainer("main", gpus=1))
    reserved = await stack.reserve(p, {"main": (share(0),)})
    await stack.kubelet.admit(p)
    kubelet = stack.kubelet
    active = {key: found for key, found in kubelet.active.items() if found.uid == p.uid}
    devices = {key: ids for key, ids in kubelet.pod_devices.items() if key[0] == p.uid}
    kubelet.remove(p)
    assert await stack.plugin.service.reconcile() == ()
    assert await stack.plugin.service.reconcile() == ()
    kubelet.active.update(active)  # the restarted kubelet lists it again
    kubelet.pod_devices.update(devices)
    assert await stack.plugin.service.reconcile() == ()
    held = (await stack.ledger()).get(reserved.id)
    assert held is not None and held.state is AllocState.BOUND


async def test_every_call_answers_within_the_bound_when_nats_is_down(stack: Stack) -> None:
    """With nats-server gone, a pod whose reservation the plugin's watch had brought is admitted
    from that copy, and one with no reservation is refused naming why; each call within its bound."""
    p = pod("p", FakeContainer("main", gpus=1))
    allocation = await stack.reserve(p, {"main": (share(0),)})

    async def seen() -> bool:
        known = stack.plugin.service.seen
        return known is not None and known.get(allocation.id) is not None

    await wait_for(seen, what="the reservation in the plugin's copy")
    await stack.nats.kill()
    started = time.monotonic()
    admitted = await stack.kubelet.admit(p)
    assert time.monotonic() - started < 2 * 1.5 + 1.0  # GetPreferredAllocation then Allocate, each bounded by 1.5 s
    assert admitted.env("main")["GPULEDGER_ALLOCATION_ID"] == allocation.id
    stranger = pod("q", FakeContainer("main", gpus=1))
    started = time.monotonic()
    with pytest.raises(AdmissionError) as refused:
        await stack.kubelet.admit(stranger)
    assert time.monotonic() - started < 2 * 1.5 + 1.0
    message = str(refused.value)
    assert "gpuledger-plugin on node n1" in message
    assert "the node's last known ledger holds no reservation" in message


async def test_allocate_rides_out_a_nats_restart(dirs: Path, nats_server: NatsServer) -> None:
    """kubelet refuses a pod for good when Allocate fails, so a short NATS outage is waited out
    (within answer_timeout_s, here 20 s: a restart on a loaded machine takes seconds)."""
    async with plugin_stack(dirs, nats_server, answer_timeout_s=20.0) as stack:
        p = pod("p", FakeContainer("main", gpus=1))
        allocation = await stack.reserve(p, {"main": (share(0),)})
        await stack.nats.kill()
        admitting = asyncio.ensure_future(stack.kubelet.admit(p))
        await asyncio.sleep(0.3)  # the outage must be under way while kubelet admits
        assert not admitting.done()
        await stack.nats.start()
        admitted = await admitting
        assert admitted.env("main")["GPULEDGER_ALLOCATION_ID"] == allocation.id
        bound = (await stack.ledger()).get(allocation.id)
        assert bound is not None
        assert bound.state is AllocState.BOUND


async def test_a_container_admitted_from_the_copy_is_bound_by_the_plugin_restarted_before_nats(
    dirs: Path, nats_server: NatsServer
) -> None:
    """The plugin admitted a container from its copy of the ledger while NATS was down, and was
    restarted before NATS came back: the bind it meant to write went with it, kubelet's record of
    the container did not. The restarted plugin's first reconciliation (right after it registers
    with kubelet) binds the reservation."""
    nc = await bus.connect(nats_server.url, "test")
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: NodeLedger(make_node()))
    kubelet = FakeKubelet(str(dirs / "dp"), str(dirs / "pr.sock"))
    await kubelet.start()
    settings = settings_for(dirs, nats_server.url, answer_timeout_s=20.0)
    try:
        async with running(settings) as plugin:
            await kubelet.wait_for(lambda k: len(k.healthy()) == CARDS * SLOTS)
            stack = Stack(nats_server, nc, store, kubelet, plugin, dirs)
            p = pod("p", FakeContainer("main", gpus=1))
            allocation = await stack.reserve(p, {"main": (share(0),)})

            async def seen() -> bool:
                known = plugin.service.seen
                return known is not None and known.get(allocation.id) is not None

            await wait_for(seen, what="the reservation in the plugin's copy")
            await nats_server.kill()
            admitted = await kubelet.admit(p)
            assert admitted.env("main")["GPULEDGER_ALLOCATION_ID"] == allocation.id
            assert plugin.service.unbound  # its bind waits for the ledger
        await nats_server.start()
        async with running(settings):

            async def bound() -> bool:
                ledger, _ = await store.read(NODE)
                found = ledger.get(allocation.id) if ledger is not None else None
                return found is not None and found.state is AllocState.BOUND

            await wait_for(bound, timeout=30, what="the reservation bound by the restarted plugin")
    finally:
        await kubelet.stop()
        await nc.close()
