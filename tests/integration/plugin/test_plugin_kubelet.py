"""Registration, device list, health, kubelet restarts: the shim through a fake kubelet."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from gpuledger_core.ledger import NodeLedger, with_node
from gpuledger_core.model import Health
from gpuledger_dev.fake_kubelet import FakeContainer

from .conftest import CARDS, SLOTS, Stack, pod, share

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_registers_and_advertises_every_slot_with_numa(stack: Stack) -> None:
    kubelet = stack.kubelet
    assert kubelet.registrations == 1
    assert kubelet.options is not None
    assert kubelet.options.get_preferred_allocation_available
    assert len(kubelet.devices) == CARDS * SLOTS
    assert kubelet.numa["GPU-card-3::0"] == [1]
    assert all(len(i) <= 63 for i in kubelet.devices)


async def test_health_changes_reach_kubelet(stack: Stack) -> None:
    def card_health(health: Health) -> object:
        def change(ledger: NodeLedger | None) -> NodeLedger:
            assert ledger is not None
            cards = tuple(
                replace(c, health=health) if c.index == 1 else c for c in ledger.node.cards
            )
            return with_node(ledger, replace(ledger.node, cards=cards))

        return change

    await stack.store.mutate("n1", card_health(Health.UNHEALTHY))  # type: ignore[arg-type]
    await stack.kubelet.wait_for(lambda k: k.devices["GPU-card-1::2"] == "Unhealthy")
    assert len(stack.kubelet.healthy()) == (CARDS - 1) * SLOTS
    await stack.store.mutate("n1", card_health(Health.HEALTHY))  # type: ignore[arg-type]
    await stack.kubelet.wait_for(lambda k: len(k.healthy()) == CARDS * SLOTS)


async def test_kubelet_restart_reregisters_and_keeps_state(stack: Stack) -> None:
    first = pod("before", FakeContainer("c", gpus=1))
    await stack.reserve(first, {"c": (share(0),)})
    admitted = await stack.kubelet.admit(first)
    assert admitted.env("c")["GPULEDGER_ALLOCATION_ID"] == "alloc-before"

    await stack.kubelet.restart()
    await stack.kubelet.wait_for(
        lambda k: k.registrations == 2 and len(k.healthy()) == CARDS * SLOTS
    )
    assert stack.plugin.link.restarts == 1
    assert stack.plugin.service.served  # what was answered before the restart is remembered

    second = pod("after", FakeContainer("c", gpus=1))
    await stack.reserve(second, {"c": (share(1),)})
    admitted = await stack.kubelet.admit(second)
    assert admitted.visible("c") == ["GPU-card-1"]


async def test_a_deleted_plugin_socket_is_served_and_registered_again(stack: Stack) -> None:
    os.unlink(stack.dirs / "dp" / "gpuledger.sock")  # the old stream breaks with the server
    await stack.kubelet.wait_for(
        lambda k: k.registrations == 2 and len(k.healthy()) == CARDS * SLOTS
    )
    assert stack.plugin.link.restarts == 1
