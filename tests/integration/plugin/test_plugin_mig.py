"""The plugin's MIG resources over its real sockets: a fake kubelet, a real nats-server, the real
ledger store, and a fake node inventory answering ``mig.make`` on NATS as the contract says.

Cards 0 and 1 are H100s in whole mode, cards 2 and 3 A100 40 GB cards in MIG mode with no
instance yet (made on demand)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuledger_common import bus
from gpuledger_common.inventory_api import MadeMig, mig_make_subject
from gpuledger_common.store import LedgerStore
from gpuledger_core import mig
from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.ids import AllocationId, CardUuid
from gpuledger_core.ledger import NodeLedger, set_mode
from gpuledger_core.mig import resource_of
from gpuledger_core.mig_profiles import A100_40GB, H100_80GB
from gpuledger_core.model import AllocState, CardMode, CardShare, Node
from gpuledger_dev.fake_kubelet import AdmissionError, FakeContainer, FakeKubelet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_plugin.app import running
from gpuledger_plugin.mig_resources import GPU_RESOURCE

from .conftest import NODE, SLOTS, Stack, make_node, pod, settings_for, share

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]
A100 = "NVIDIA A100-SXM4-40GB"
SMALL = resource_of("1g.5gb")
A100_RESOURCES = {resource_of(p.name) for p in A100_40GB.profiles} | {mig.RESOURCE}


class FakeInventory:
    """The node's inventory's ``mig.make``: the instance at the asked placement (GPU instance 7 +
    start), or the error it is given."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.error: Exception | None = None
        self.minor: int | None = None

    async def handle(self, body: Any) -> Any:
        self.asked.append(body)
        if self.error is not None:
            raise self.error
        made = MadeMig(f"MIG-{body['card']}-{body['start']}", 7 + body["start"], 0, 2, self.minor)
        return made.to_json()


def mig_node() -> Node:
    node = make_node()
    cards = tuple(
        replace(c, model=A100, memory_mib=40960, mode=CardMode.MIG) if c.index >= 2 else c for c in node.cards
    )
    return replace(node, cards=cards)


def slots(*cards: int) -> set[str]:
    return {f"GPU-card-{c}::{n}" for c in cards for n in range(SLOTS)}


@contextlib.asynccontextmanager
async def mig_stack(
    dirs: Path, nats_server: NatsServer, **settings: object
) -> AsyncIterator[tuple[Stack, FakeInventory]]:
    nc = await bus.connect(nats_server.url, "test")
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: NodeLedger(mig_node()))
    inventory = FakeInventory()
    responder = await bus.Responder(nc, mig_make_subject(NODE), inventory.handle).start()
    kubelet = FakeKubelet(str(dirs / "dp"), str(dirs / "pr.sock"))
    await kubelet.start()
    try:
        async with running(settings_for(dirs, nats_server.url, **settings)) as plugin:
            await kubelet.wait_for(lambda k: k.healthy() == slots(0, 1) and k.healthy(mig.RESOURCE) == slots(2, 3))
            yield Stack(nats_server, nc, store, kubelet, plugin, dirs), inventory
    finally:
        await responder.close()
        await kubelet.stop()
        await nc.close()


def a100_share(card: int, profile: str, start: int) -> CardShare:
    shape = A100_40GB.by_name(profile)
    assert shape is not None
    found = mig_node().card(CardUuid(f"GPU-card-{card}"))
    assert found is not None
    return mig.share_of(found, shape, start)


async def allocation(stack: Stack, name: str) -> tuple[AllocState, str]:
    found = (await stack.ledger()).get(AllocationId(f"alloc-{name}"))
    assert found is not None
    return found.state, found.reason


async def test_every_mig_resource_has_its_socket_and_registration_and_lists_the_mig_cards(
    dirs: Path, nats_server: NatsServer
) -> None:
    async with mig_stack(dirs, nats_server) as (stack, _):
        kubelet = stack.kubelet
        await kubelet.wait_for(lambda k: set(k.endpoints) == {GPU_RESOURCE, *A100_RESOURCES})
        await kubelet.wait_for(lambda k: all(k.healthy(r) == slots(2, 3) for r in A100_RESOURCES))
        assert kubelet.healthy() == slots(0, 1)  # the MIG cards are not gpuledger.io/gpu's
        assert all(kubelet.endpoint(r).registrations == 1 for r in A100_RESOURCES)
        assert (dirs / "dp" / "gpuledger-mig-1g.5gb.sock").exists()
        assert (dirs / "dp" / "gpuledger-mig-1g.5gb.me.sock").exists()  # the +me profile, named as kubelet allows
        assert set(stack.plugin.links) == {GPU_RESOURCE, *A100_RESOURCES}


async def test_no_mig_card_no_mig_resource(stack: Stack) -> None:
    assert set(stack.kubelet.endpoints) == {GPU_RESOURCE}
    assert set(stack.plugin.links) == {GPU_RESOURCE}


async def test_a_card_switched_to_mig_mode_moves_to_its_profiles_and_back(dirs: Path, nats_server: NatsServer) -> None:
    def mode(wanted: CardMode) -> Any:
        return lambda ledger: set_mode(ledger, CardUuid("GPU-card-1"), wanted)

    async with mig_stack(dirs, nats_server) as (stack, _):
        kubelet, whole = stack.kubelet, resource_of("7g.80gb")  # an H100 profile, no A100's
        await stack.store.mutate(NODE, mode(CardMode.MIG))
        await kubelet.wait_for(lambda k: k.healthy(whole) == slots(1) and k.healthy() == slots(0))
        assert kubelet.healthy(mig.RESOURCE) == slots(1, 2, 3)
        assert kubelet.healthy(resource_of("1g.10gb")) == slots(1, 2, 3)  # both models offer it
        assert kubelet.healthy(SMALL) == slots(2, 3)
        await stack.store.mutate(NODE, mode(CardMode.WHOLE))
        await kubelet.wait_for(lambda k: k.endpoint(whole).devices == {})
        await kubelet.wait_for(lambda k: k.healthy() == slots(0, 1))
        assert kubelet.endpoint(whole).registrations == 1  # still registered: capacity 0, not a stale plugin
        assert kubelet.healthy(mig.RESOURCE) == slots(2, 3)
        assert {resource_of(p.name) for p in H100_80GB.profiles} <= set(stack.plugin.links)


async def test_a_mig_container_gets_the_instance_the_inventory_made(dirs: Path, nats_server: NatsServer) -> None:
    async with mig_stack(dirs, nats_server) as (stack, inventory):
        mine = pod("p", FakeContainer("c", gpus=1, resource=SMALL))
        await stack.reserve(mine, {"c": (a100_share(3, "1g.5gb", 6),)})
        admitted = await stack.kubelet.admit(mine)
        assert admitted.devices["c"] == ("GPU-card-3::0",)
        env = admitted.env("c")
        assert env["CUDA_VISIBLE_DEVICES"] == "MIG-GPU-card-3-6"
        assert admitted.visible("c") == ["MIG-GPU-card-3-6"]
        assert env["GPULEDGER_MIG"] == "1g.5gb@6"
        assert [{k: v for k, v in body.items() if k != "schema"} for body in inventory.asked] == [
            {"card": "GPU-card-3", "profile": "1g.5gb", "start": 6, "size": 1, "holder": "alloc-p"}
        ]
        assert await allocation(stack, "p") == (AllocState.BOUND, "")


async def test_whole_cards_and_instances_of_two_profiles_each_go_to_their_container(
    dirs: Path, nats_server: NatsServer
) -> None:
    async with mig_stack(dirs, nats_server) as (stack, _):
        big = pod("big", FakeContainer("c", gpus=1, resource=resource_of("2g.10gb")))
        small = pod("small", FakeContainer("c", gpus=1, resource=SMALL))
        plain = pod("plain", FakeContainer("c", gpus=1))
        await stack.reserve(big, {"c": (a100_share(2, "2g.10gb", 0),)})
        await stack.reserve(small, {"c": (a100_share(2, "1g.5gb", 6),)})
        await stack.reserve(plain, {"c": (share(1),)})
        assert (await stack.kubelet.admit(small)).env("c")["GPULEDGER_MIG"] == "1g.5gb@6"
        assert (await stack.kubelet.admit(plain)).visible("c") == ["GPU-card-1"]
        assert (await stack.kubelet.admit(big)).env("c")["GPULEDGER_MIG"] == "2g.10gb@0"
        for name in ("big", "small", "plain"):
            assert (await allocation(stack, name))[0] is AllocState.BOUND


async def test_a_failed_make_rejects_the_pod_with_the_reason_and_releases_its_allocation(
    dirs: Path, nats_server: NatsServer
) -> None:
    async with mig_stack(dirs, nats_server) as (stack, inventory):
        inventory.error = FailedPrecondition("card GPU-card-2 (1g.5gb at 0): NVML refused: Insufficient Resources")
        mine = pod("p", FakeContainer("c", gpus=1, resource=SMALL))
        await stack.reserve(mine, {"c": (a100_share(2, "1g.5gb", 0),)})
        with pytest.raises(AdmissionError) as caught:
            await stack.kubelet.admit(mine)
        assert "NVML refused: Insufficient Resources" in caught.value.pod_message
        assert "MIG instance 1g.5gb at 0 on card 2 (GPU-card-2)" in caught.value.pod_message
        state, reason = await allocation(stack, "p")
        assert state is AllocState.RELEASED
        assert "1g.5gb" in reason and "card 2 (GPU-card-2)" in reason and "Insufficient Resources" in reason


async def test_device_specs_pass_the_card_and_the_instance_capability_nodes(
    dirs: Path, nats_server: NatsServer
) -> None:
    dev = dirs / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in (
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia2",
        "nvidia-caps/nvidia-cap31",
        "nvidia-caps/nvidia-cap32",
    ):
        (dev / name).touch()
    minors = dirs / "mig-minors"
    minors.write_text("config 1\nmonitor 2\ngpu2/gi9/access 31\ngpu2/gi9/ci0/access 32\n")
    async with mig_stack(dirs, nats_server, device_specs=True, device_dir=str(dev), mig_minors_file=str(minors)) as (
        stack,
        _,
    ):
        mine = pod("p", FakeContainer("c", gpus=1, resource=SMALL))
        await stack.reserve(mine, {"c": (a100_share(2, "1g.5gb", 2),)})  # GPU instance 9; card 2's minor is 2
        answer = (await stack.kubelet.admit(mine)).answers["c"]
        paths = {d.container_path: d.host_path for d in answer.devices}
        assert paths["/dev/nvidia2"] == str(dev / "nvidia2")
        assert paths["/dev/nvidia-caps/nvidia-cap31"] == str(dev / "nvidia-caps/nvidia-cap31")
        assert paths["/dev/nvidia-caps/nvidia-cap32"] == str(dev / "nvidia-caps/nvidia-cap32")
        assert "/dev/nvidiactl" in paths


async def test_reconciliation_reads_kubelet_s_mig_devices(dirs: Path, nats_server: NatsServer) -> None:
    """kubelet admitted the MIG container while the plugin's bind did not land: the next round
    sees the devices under the MIG resource and binds the reservation."""
    async with mig_stack(dirs, nats_server) as (stack, _):
        mine = pod("p", FakeContainer("c", gpus=1, resource=SMALL))
        reserved = await stack.reserve(mine, {"c": (a100_share(2, "1g.5gb", 0),)})
        stack.kubelet.give(mine, "c", reserved.grants[0].device_ids, resource=SMALL)
        findings = await stack.plugin.service.reconcile()
        assert [f.kind for f in findings] == ["unbound"]
        assert (await allocation(stack, "p"))[0] is AllocState.BOUND
