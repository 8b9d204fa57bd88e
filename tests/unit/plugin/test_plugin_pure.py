"""Answers, device lists, topology ranking and ledger transitions of the plugin (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger_core.errors import Conflict, Exhausted
from gpuledger_core.ids import AllocationId
from gpuledger_core.model import Grant, Health, Isolation
from gpuledger_plugin.answer import AnswerPolicy, answer
from gpuledger_plugin.devices import advertised
from gpuledger_plugin.kubelet_findings import compare
from gpuledger_plugin.topology import preferred
from gpuledger_plugin.transitions import bind, rehome, swap

from .plugin_fixtures import ids_of, ledger_with, node, pod, share


def test_answer_env_lists_cards_and_limits_in_visible_order() -> None:
    alloc = pod("p", Grant("c", (share(2, mem=1000, core=125), share(3, mem=2000, core=250))))
    got = answer(node(), alloc, alloc.grants[0], AnswerPolicy(strategies=("env",)))
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"
    assert got.envs["CUDA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"
    assert got.mounts == ()
    assert got.envs["GPULEDGER_MEMORY_LIMIT_MIB"] == "1000,2000"
    assert got.envs["GPULEDGER_CORE_LIMIT_PERCENT"] == "12.5,25"
    assert got.envs["GPULEDGER_EXCLUSIVE"] == "false"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in got.envs
    assert got.cdi_devices == ()


def test_cdi_and_device_specs_by_setting() -> None:
    alloc = pod("p", Grant("c", (share(1, exclusive=True),), device_ids=("GPU-1::0",)))
    policy = AnswerPolicy(strategies=("cdi-cri", "cdi-annotations"), device_specs=True)
    got = answer(node(), alloc, alloc.grants[0], policy)
    assert "NVIDIA_VISIBLE_DEVICES" not in got.envs
    assert got.cdi_devices == ("nvidia.com/gpu=GPU-1",)
    ((key, value),) = got.annotations.items()
    assert key.startswith("cdi.k8s.io/gpuledger_")
    assert len(key.split("/", 1)[1]) <= 63
    assert value == "nvidia.com/gpu=GPU-1"
    assert "/dev/nvidia1" in [d.host_path for d in got.devices]
    assert got.envs["GPULEDGER_EXCLUSIVE"] == "true"


def test_device_nodes_come_from_the_device_dir_and_appear_in_dev() -> None:
    alloc = pod("p", Grant("c", (share(1, exclusive=True),), device_ids=("GPU-1::0",)))
    got = answer(node(), alloc, alloc.grants[0], AnswerPolicy(device_specs=True, device_dir="/run/fake-dev"))
    pairs = {d.container_path: d.host_path for d in got.devices}
    assert pairs == {
        "/dev/nvidiactl": "/run/fake-dev/nvidiactl",
        "/dev/nvidia-uvm": "/run/fake-dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools": "/run/fake-dev/nvidia-uvm-tools",
        "/dev/nvidia1": "/run/fake-dev/nvidia1",
    }


def test_default_isolation_mps_applies_to_shared_cards_only() -> None:
    policy = AnswerPolicy(default_isolation=Isolation.MPS)
    shared = pod("s", Grant("c", (share(0, mem=512, core=50),)))
    assert (
        answer(node(), shared, shared.grants[0], policy).envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
        == "5"
    )
    whole = pod("w", Grant("c", (share(0, exclusive=True),)))
    assert (
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
        not in answer(node(), whole, whole.grants[0], policy).envs
    )


def test_unhealthy_card_advertises_unhealthy_slots_with_numa() -> None:
    n = node(2)
    sick = replace(n.cards[1], health=Health.UNHEALTHY)
    devices = advertised(replace(n, cards=(n.cards[0], sick)), 2)
    assert [(d.id, d.health, d.numa) for d in devices] == [
        ("GPU-0::0", "Healthy", 0),
        ("GPU-0::1", "Healthy", 0),
        ("GPU-1::0", "Unhealthy", 0),
        ("GPU-1::1", "Unhealthy", 0),
    ]
    assert advertised(None, 4) == ()


def test_topology_prefers_nvlinked_cards_on_one_numa_node() -> None:
    n = node(4)  # cards 0-1 and 2-3 are NVLinked pairs
    offered = ["GPU-0::0", "GPU-1::0", "GPU-2::0", "GPU-3::0", "GPU-3::1"]
    assert preferred(n, offered, [], 2) == ["GPU-0::0", "GPU-1::0"]
    assert preferred(n, offered, ["GPU-3::1"], 2) == ["GPU-2::0", "GPU-3::1"]
    assert preferred(n, offered, [], 5) == []


def test_bind_commits_and_rehomes_onto_free_slots_of_the_same_card() -> None:
    ledger = ledger_with(pod("a", Grant("c", (share(0),))))
    ref = (AllocationId("a-a"), 0)
    bound = bind(ledger, ref, ids_of(ledger, "a"), ["GPU-0::2"], now=5.0)
    after = bound.get(AllocationId("a-a"))
    assert after is not None
    assert after.grants[0].device_ids == ("GPU-0::2",)
    assert after.state.value == "bound"
    with pytest.raises(Conflict):
        bind(ledger, ref, ("GPU-0::1",), ["GPU-0::2"], now=5.0)


def test_rehome_to_another_card_checks_room_and_reservations() -> None:
    ledger = ledger_with(
        pod("a", Grant("c", (share(0),))), pod("b", Grant("c", (share(1, mem=81920),)))
    )
    moved = rehome(ledger, (AllocationId("a-a"), 0), ["GPU-2::0"])
    grant = moved.get(AllocationId("a-a"))
    assert grant is not None
    assert grant.grants[0].cards[0].uuid == "GPU-2"
    with pytest.raises(Conflict):
        rehome(ledger, (AllocationId("a-a"), 0), ids_of(ledger, "b"))
    with pytest.raises(Exhausted):
        rehome(ledger, (AllocationId("a-a"), 0), ["GPU-1::3"])


def test_swap_exchanges_cards_between_pods() -> None:
    ledger = ledger_with(
        pod("a", Grant("c", (share(0, mem=1),))), pod("b", Grant("c", (share(1, mem=2),)))
    )
    swapped = swap(ledger, (AllocationId("a-a"), 0), (AllocationId("a-b"), 0))
    assert ids_of(swapped, "a") == ids_of(ledger, "b")
    assert ids_of(swapped, "b") == ids_of(ledger, "a")


def test_compare_confirms_agreement_and_flags_unknown_devices() -> None:
    ledger = bind(
        ledger_with(pod("a", Grant("c", (share(0),)))),
        (AllocationId("a-a"), 0),
        ("GPU-0::0",),
        ("GPU-0::0",),
        1.0,
    )
    view = {
        ("ns", "a"): {"c": frozenset({"GPU-0::0"})},
        ("ns", "x"): {"c": frozenset({"GPU-3::3"})},
    }
    got = compare(ledger, view, 2.0)
    assert got.confirmed == ((AllocationId("a-a"), 0),)
    assert [(f.kind, f.pod) for f in got.findings] == [("unknown", ("ns", "x"))]
    assert got.findings[0].repair is None
    assert compare(ledger, {}, 2.0).absent[0].id == "a-a"
