"""The device plugin's MIG parts that need no socket: which resources a node's cards make and what
they list, which containers a resource's calls may match, the MIG minors file, and the answer
naming MIG devices."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core import mig
from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.mig import resource_of
from gpuledger_core.mig_profiles import A100_40GB, H100_80GB
from gpuledger_core.model import (
    MIG_SMALLEST,
    Allocation,
    Card,
    CardMode,
    CardShare,
    Grant,
    Health,
    Isolation,
    Node,
    Owner,
    OwnerKind,
    Request,
)
from gpuledger_core.slots import assign_device_ids
from gpuledger_plugin import matching as m
from gpuledger_plugin.answer import DEVICE_LIST_MOUNT_ROOT, AnswerPolicy
from gpuledger_plugin.board import MigBoards
from gpuledger_plugin.devices import advertised
from gpuledger_plugin.mig_answer import mig_answer, parse_mig_minors
from gpuledger_plugin.mig_resources import GPU_RESOURCE, accepts, device_lists, socket_name

SLOTS = 4
A100 = "NVIDIA A100-SXM4-40GB"


def card(
    index: int, model: str = "NVIDIA H100 80GB HBM3", memory: int = 81920, mode: CardMode = CardMode.WHOLE
) -> Card:
    return Card(CardUuid(f"GPU-{index}"), index, model, memory, numa=index // 2, minor=10 + index, mode=mode)


def mixed_node() -> Node:
    """Card 0 whole, card 1 an A100 40 GB in MIG mode, card 2 an H100 in MIG mode, card 3 a T4 in
    MIG mode (a model without MIG: offered under no resource)."""
    cards = (
        card(0),
        card(1, A100, 40960, CardMode.MIG),
        card(2, mode=CardMode.MIG),
        card(3, "Tesla T4", 15360, CardMode.MIG),
    )
    return Node(NodeName("n1"), cards)


def slots(uuid: str) -> set[str]:
    return {f"{uuid}::{n}" for n in range(SLOTS)}


def ids(devices: object) -> set[str]:
    assert isinstance(devices, tuple)
    return {d.id for d in devices}


def test_cards_in_mig_mode_leave_the_gpu_list_for_their_profiles_resources() -> None:
    node = mixed_node()
    assert ids(advertised(node, SLOTS)) == slots("GPU-0")
    lists = device_lists(node, SLOTS)
    a100, h100 = slots("GPU-1"), slots("GPU-2")
    assert ids(lists[mig.RESOURCE]) == a100 | h100
    assert ids(lists["gpuledger.io/mig-1g.5gb"]) == a100  # the A100 40 GB's alone
    assert ids(lists["gpuledger.io/mig-1g.10gb"]) == a100 | h100  # both models offer it
    assert ids(lists["gpuledger.io/mig-7g.80gb"]) == h100
    assert ids(lists["gpuledger.io/mig-1g.5gb.me"]) == a100  # a resource name has no '+'
    names = {resource_of(p.name) for p in (*A100_40GB.profiles, *H100_80GB.profiles)} | {mig.RESOURCE}
    assert set(lists) == names
    assert all(d.numa == 0 for d in lists["gpuledger.io/mig-1g.5gb"])


def test_a_node_without_mig_cards_has_no_mig_resource_and_an_unhealthy_card_lists_unhealthy() -> None:
    whole = Node(NodeName("n1"), (card(0), card(1)))
    assert device_lists(whole, SLOTS) == {}
    assert len(advertised(whole, SLOTS)) == 2 * SLOTS
    sick = replace(card(1, A100, 40960, CardMode.MIG), health=Health.UNHEALTHY)
    lists = device_lists(Node(NodeName("n1"), (card(0), sick)), SLOTS)
    assert {d.health for d in lists[mig.RESOURCE]} == {"Unhealthy"}


def test_each_resource_has_its_socket_beside_the_gpu_one() -> None:
    assert socket_name("gpuledger.sock", GPU_RESOURCE) == "gpuledger.sock"
    assert socket_name("gpuledger.sock", mig.RESOURCE) == "gpuledger-mig.sock"
    assert socket_name("x.sock", "gpuledger.io/mig-1g.10gb") == "x-mig-1g.10gb.sock"


async def test_a_resource_no_card_offers_any_more_keeps_its_board_with_no_device() -> None:
    boards = MigBoards(SLOTS)
    await boards.publish(Node(NodeName("n1"), (card(0),)))
    assert boards.boards == {} and not boards.added.is_set()
    await boards.publish(mixed_node())
    assert boards.added.is_set()
    assert ids(boards.boards["gpuledger.io/mig-1g.5gb"].devices) == slots("GPU-1")
    boards.added.clear()
    only_h100 = Node(NodeName("n1"), (card(1, A100, 40960), card(2, mode=CardMode.MIG)))
    await boards.publish(only_h100)
    assert boards.boards["gpuledger.io/mig-1g.5gb"].devices == ()  # registered still, capacity 0
    assert ids(boards.boards["gpuledger.io/mig-1g.10gb"].devices) == slots("GPU-2")
    assert not boards.added.is_set()  # no resource is new


def ledger_with(*asks: tuple[str, str, Request | None]) -> NodeLedger:
    """A ledger of mixed_node with one pod per ask: (name, profile or "" for a share, request)."""
    node = mixed_node()
    ledger = NodeLedger(node)
    a100 = node.cards[1]
    starts = iter((0, 2, 4, 6))
    for created, (name, profile, request) in enumerate(asks):
        if profile:
            shape = A100_40GB.by_name(profile)
            assert shape is not None
            share = mig.share_of(a100, shape, next(starts))
        else:
            share = CardShare(CardUuid("GPU-0"), 0, 1024, 100)
        owner = Owner(OwnerKind.POD, name, "default", name)
        requests = (request,) if request is not None else ()
        grants = (Grant("c", (share,)),)
        allocation = Allocation(
            AllocationId(name), owner, NodeName("n1"), grants, created_at=created, requests=requests
        )
        ledger = reserve(ledger, assign_device_ids(ledger, allocation, SLOTS))
    return ledger


def test_a_resource_steers_only_to_containers_that_asked_for_it() -> None:
    named = Request(1, mig="1g.5gb")
    smallest = Request(1, 4000, None, mig=MIG_SMALLEST)
    ledger = ledger_with(("small", "1g.5gb", named), ("big", "2g.10gb", None), ("any", "1g.5gb", smallest))
    offered = sorted(slots("GPU-1"))
    found = m.steer(ledger, {}, offered, [], 1, accepts=accepts("gpuledger.io/mig-2g.10gb"))
    assert isinstance(found, m.Found) and found.slot.allocation.id == "big"
    found = m.steer(ledger, {}, offered, [], 1, accepts=accepts("gpuledger.io/mig-1g.5gb"))
    assert isinstance(found, m.Found) and found.slot.allocation.id == "small"  # "any" asked gpuledger.io/mig
    assert found.ids != ()
    whole = m.steer(ledger, {}, offered, [], 1, accepts=accepts(mig.RESOURCE))
    # "small" asked for its profile by name; "big" has no requests to say, so either may be meant
    assert isinstance(whole, m.Ambiguous) and {s.allocation.id for s in whole.candidates} == {"big", "any"}
    refused = m.steer(ledger, {}, offered, [], 1, accepts=accepts(GPU_RESOURCE))
    assert isinstance(refused, m.Refused)


def test_allocate_refuses_ids_another_resource_reserved() -> None:
    ledger = ledger_with(("small", "1g.5gb", None), ("big", "2g.10gb", None))
    big = ledger.get(AllocationId("big"))
    assert big is not None
    theirs = list(big.grants[0].device_ids)
    exact = m.resolve(ledger, {}, theirs, accepts=accepts("gpuledger.io/mig-2g.10gb"))
    assert isinstance(exact, m.Found) and exact.slot.allocation.id == "big"
    wrong = m.resolve(ledger, {}, theirs, accepts=accepts("gpuledger.io/mig-1g.5gb"))
    assert isinstance(wrong, m.Refused) and "pod default/big" in wrong.reason


def test_the_gpu_resource_never_matches_a_mig_grant() -> None:
    ledger = ledger_with(("mig", "1g.5gb", None), ("share", "", None))
    found = m.resolve(ledger, {}, ["GPU-0::1"], accepts=accepts(GPU_RESOURCE))  # free: a rehome
    assert isinstance(found, m.Found) and found.slot.allocation.id == "share" and found.rehome
    without = m.resolve(ledger, {}, ["GPU-0::1"])  # every grant: the MIG one would be a candidate too
    assert isinstance(without, m.Ambiguous) and {s.allocation.id for s in without.candidates} == {"mig", "share"}


def test_the_mig_minors_file_is_read_line_by_line_and_a_bad_line_named() -> None:
    text = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\n"
    assert parse_mig_minors(text) == {"config": 1, "monitor": 2, "gpu0/gi1/access": 12, "gpu0/gi1/ci0/access": 13}
    with pytest.raises(FailedPrecondition, match="line 2"):
        parse_mig_minors("config 1\ngpu0/gi1/access twelve\n", "minors")


def mig_grant() -> tuple[Node, Allocation, Grant, list[MadeMig]]:
    ledger = ledger_with(("p", "1g.5gb", None))
    allocation = ledger.get(AllocationId("p"))
    assert allocation is not None
    made = [MadeMig("MIG-aaaa", 13, 0, 1, None)]
    return ledger.node, allocation, allocation.grants[0], made


def test_the_answer_names_the_mig_device_by_every_strategy() -> None:
    node, allocation, grant, made = mig_grant()
    mounted = mig_answer(node, allocation, grant, made, AnswerPolicy(), None)
    assert mounted.envs["CUDA_VISIBLE_DEVICES"] == "MIG-aaaa"
    assert mounted.envs["NVIDIA_VISIBLE_DEVICES"] == DEVICE_LIST_MOUNT_ROOT
    assert [x.container_path for x in mounted.mounts] == [f"{DEVICE_LIST_MOUNT_ROOT}/MIG-aaaa"]
    assert mounted.envs["GPULEDGER_MIG"] == "1g.5gb@0"
    assert mounted.envs["GPULEDGER_EXCLUSIVE"] == "true"
    assert mounted.envs["GPULEDGER_MEMORY_LIMIT_MIB"] == str(grant.cards[0].mem_mib)
    assert mounted.devices == ()  # no device specs asked for
    env = mig_answer(node, allocation, grant, made, AnswerPolicy(strategies=("env",)), None)
    assert env.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-aaaa" and env.mounts == ()
    cdi = mig_answer(node, allocation, grant, made, AnswerPolicy(strategies=("cdi-cri", "cdi-annotations")), None)
    assert cdi.cdi_devices == ("nvidia.com/gpu=MIG-aaaa",)
    assert list(cdi.annotations.values()) == ["nvidia.com/gpu=MIG-aaaa"]
    mps = AnswerPolicy(default_isolation=Isolation.MPS)  # shares would get MPS; an instance is isolated
    assert "CUDA_MPS_PIPE_DIRECTORY" not in mig_answer(node, allocation, grant, made, mps, None).envs


def test_device_specs_name_the_card_and_the_instance_capabilities() -> None:
    node, allocation, grant, made = mig_grant()
    policy = AnswerPolicy(device_specs=True, device_dir="/host/dev")
    minors = {"gpu11/gi13/access": 120, "gpu11/gi13/ci0/access": 121, "gpu10/gi13/access": 5}
    found = mig_answer(node, allocation, grant, made, policy, minors)  # card 1's minor is 11 in the ledger
    paths = [d.container_path for d in found.devices]
    assert paths[-3:] == ["/dev/nvidia11", "/dev/nvidia-caps/nvidia-cap120", "/dev/nvidia-caps/nvidia-cap121"]
    assert "/dev/nvidiactl" in paths
    assert found.devices[-1].host_path == "/host/dev/nvidia-caps/nvidia-cap121"
    told = [replace(made[0], minor=10)]  # the inventory's minor wins over the ledger's
    with pytest.raises(FailedPrecondition, match="gpu10/gi13/ci0/access"):
        mig_answer(node, allocation, grant, told, policy, minors)
    without = mig_answer(node, allocation, grant, made, policy, None)  # no minors file: no capability nodes
    assert [d.container_path for d in without.devices][-1] == "/dev/nvidia11"
