"""The DRA plugin's device health for kubelet: every device the node's slices publish, named as
they name it, with the card's health and a MIG instance's fault; the wire message kubelet reads;
the board that streams it on each change and again before kubelet's timeout runs out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

import pytest

from gpuledger_common.settings import SettingsError
from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.model import Card, CardMode, Health, MigInstance, MigSlot, Node, Remedy
from gpuledger_inventory.slices import SliceConfig, desired, manifest
from gpuledger_plugin.dra.health import MESSAGE_MAX, DeviceHealth, devices_of
from gpuledger_plugin.dra.health import Health as State
from gpuledger_plugin.dra.health_board import HealthBoard
from gpuledger_plugin.dra.server import DraHealth, health_response
from gpuledger_plugin.dra.settings import DraSettings
from gpuledger_proto import v1alpha1 as pb

pytestmark = pytest.mark.timeout(10)
A100 = "NVIDIA A100-SXM4-40GB"
A100_PLACEMENTS = 7 + 7 + 4 + 3 + 2 + 1 + 1  # the starts of each profile of the A100 40GB


def card(index: int, **fields: object) -> Card:
    return Card(CardUuid(f"GPU-{index}"), index, A100, 40960, minor=index, **fields)  # type: ignore[arg-type]


def node(*cards: Card) -> Node:
    return Node(NodeName("a100-0"), cards)


def by_name(found: tuple[DeviceHealth, ...]) -> dict[str, DeviceHealth]:
    return {d.device: d for d in found}


def published_names(of: Node) -> set[str]:
    slices = desired(of, {}, None, SliceConfig())
    return {d["name"] for n in range(slices.count) for d in manifest(slices, n, 1)["spec"].get("devices", [])}


def test_no_node_in_the_ledger_is_no_device() -> None:
    assert devices_of(None) == ()


def test_a_whole_card_is_its_device_with_the_cards_health() -> None:
    found = devices_of(node(card(1), card(0, health=Health.UNHEALTHY, health_reason="XID 79", remedy=Remedy.DRAIN)))
    assert [d.device for d in found] == ["gpu-0", "gpu-1"]
    assert found[1] == DeviceHealth("gpu-1", State.HEALTHY)
    assert found[0].health is State.UNHEALTHY
    assert found[0].message == "card 0 (GPU-0): XID 79 (remedy: drain)"


def test_an_unhealthy_card_without_a_reason_still_says_who_judged_it() -> None:
    (found,) = devices_of(node(card(0, health=Health.UNHEALTHY)))
    assert found.message == "card 0 (GPU-0): reported unhealthy by the node's inventory"


def test_a_mig_card_is_every_placement_of_its_model_a_superset_of_what_the_slices_publish() -> None:
    instance = MigInstance(MigSlot("3g.20gb", 4, 4), static=False, uuid="MIG-1")
    of = node(card(0), card(1, mode=CardMode.MIG, instances=(instance,)))
    found = by_name(devices_of(of))
    assert len(found) == 1 + A100_PLACEMENTS
    assert published_names(of) <= set(found)  # every device kubelet can be given has a health
    assert "gpu-1-mig-3g-20gb-4" in found and "gpu-1-mig-1g-5gb-me-6" in found
    assert {d.health for d in found.values()} == {State.HEALTHY}


def test_a_faulted_instance_makes_its_own_placement_unhealthy_and_no_other() -> None:
    faulted = MigInstance(MigSlot("1g.10gb", 2, 2), uuid="MIG-2", fault="XID 94 in GI 3", remedy=Remedy.DRAIN)
    found = by_name(devices_of(node(card(0, mode=CardMode.MIG, instances=(faulted,)))))
    unhealthy = {name: d.message for name, d in found.items() if d.health is State.UNHEALTHY}
    assert unhealthy == {
        "gpu-0-mig-1g-10gb-2": "MIG instance 1g.10gb at 2 of card 0 (GPU-0): XID 94 in GI 3 (remedy: drain)"
    }


def test_an_unhealthy_mig_card_makes_every_placement_unhealthy() -> None:
    found = devices_of(node(card(0, mode=CardMode.MIG, health=Health.UNHEALTHY, health_reason="fell off the bus")))
    assert len(found) == A100_PLACEMENTS
    assert {(d.health, d.message) for d in found} == {(State.UNHEALTHY, "card 0 (GPU-0): fell off the bus")}


def test_a_mig_card_of_a_model_without_a_mig_table_has_no_device() -> None:
    other = Card(CardUuid("GPU-9"), 0, "Tesla P4", 7680, mode=CardMode.MIG)
    assert devices_of(node(other)) == ()
    assert published_names(node(other)) == set()


def test_a_long_reason_is_cut_as_kubelet_would() -> None:
    (found,) = devices_of(node(card(0, health=Health.UNHEALTHY, health_reason="x" * 2000)))
    assert len(found.message) == MESSAGE_MAX
    assert found.message.endswith("x...")


def test_the_response_names_pool_device_health_time_and_timeout() -> None:
    devices = (DeviceHealth("gpu-0", State.HEALTHY), DeviceHealth("gpu-1", State.UNHEALTHY, "XID 79"))
    answer = health_response("a100-0", devices, 1700000000.9, 30)
    parsed = pb.NodeWatchResourcesResponse().parse(bytes(answer))
    assert [(d.device.pool_name, d.device.device_name, d.health, d.message) for d in parsed.devices] == [
        ("a100-0", "gpu-0", pb.HealthStatus.HEALTHY, ""),
        ("a100-0", "gpu-1", pb.HealthStatus.UNHEALTHY, "XID 79"),
    ]
    assert {(d.last_updated_time, d.health_check_timeout_seconds) for d in parsed.devices} == {(1700000000, 30)}


async def test_the_board_streams_the_list_then_each_change_and_nothing_for_a_repeat() -> None:
    board = HealthBoard()
    first = (DeviceHealth("gpu-0", State.HEALTHY),)
    await board.publish(first)
    stream = board.stream(resend_s=3600)
    assert await anext(stream) == first
    await board.publish(first)  # the same list again: no new version
    assert board.version == 1
    changed = (DeviceHealth("gpu-0", State.UNHEALTHY, "XID 79"),)
    waiting = asyncio.create_task(anext(stream))
    await board.publish(changed)
    assert await waiting == changed
    await stream.aclose()


async def test_the_board_says_an_unchanged_list_again_every_resend_interval() -> None:
    board = HealthBoard()
    await board.publish((DeviceHealth("gpu-0", State.HEALTHY),))
    stream = board.stream(resend_s=0.05)
    await anext(stream)
    started = time.monotonic()
    assert await anext(stream) == board.devices
    assert time.monotonic() - started >= 0.04
    await stream.aclose()


async def test_the_service_sends_the_boards_list_at_once_for_the_pool() -> None:
    board = HealthBoard()
    await board.publish((DeviceHealth("gpu-0", State.HEALTHY),))
    stream = DraHealth("a100-0", board, 10.0, 30).node_watch_resources(pb.NodeWatchResourcesRequest())
    assert isinstance(stream, AsyncGenerator)
    first = await anext(stream)
    assert [(d.device.pool_name, d.device.device_name, d.health_check_timeout_seconds) for d in first.devices] == [
        ("a100-0", "gpu-0", 30)
    ]
    assert board.watchers == 1
    await stream.aclose()
    assert board.watchers == 0


def test_a_timeout_not_longer_than_the_resend_interval_is_refused_naming_it() -> None:
    with pytest.raises(SettingsError, match="health_timeout_s"):
        DraSettings(node="n1", health_resend_s=30.0, health_timeout_s=30)
