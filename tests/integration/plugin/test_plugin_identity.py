"""Every container gets exactly its own reservation: concurrent admissions, no swap."""

from __future__ import annotations

import asyncio

import pytest

from gpuledger_core.model import Allocation, AllocState, CardShare, Isolation
from gpuledger_dev.fake_kubelet import AdmissionError, Admitted, FakeContainer, FakePod
from gpuledger_plugin.metrics import IDENTITY

from .conftest import Stack, pod, share

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def assert_own(admitted: Admitted, allocation: Allocation) -> None:
    """Each container's env is built from its own grant (a swap would fail here)."""
    for grant in allocation.grants:
        env = admitted.env(grant.container)
        assert env["GPULEDGER_ALLOCATION_ID"] == allocation.id
        assert env["GPULEDGER_CONTAINER"] == grant.container
        assert admitted.visible(grant.container) == [s.uuid for s in grant.cards]
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(s.uuid for s in grant.cards)
        assert env["GPULEDGER_MEMORY_LIMIT_MIB"] == ",".join(str(s.mem_mib) for s in grant.cards)
        assert {d.split("::")[0] for d in admitted.devices[grant.container]} == {
            s.uuid for s in grant.cards
        }


def workload() -> list[tuple[FakePod, dict[str, tuple[CardShare, ...]]]]:
    """Same-sized pods with different limits and cards, multi-container pods, init containers."""
    c = FakeContainer
    return [
        (pod("small", c("main", gpus=1)), {"main": (share(0, mem=2048, core=100),)}),
        (pod("large", c("main", gpus=1)), {"main": (share(1, mem=16384, core=500),)}),
        (pod("same-a", c("main", gpus=1)), {"main": (share(2, mem=4096),)}),
        (pod("same-b", c("main", gpus=1)), {"main": (share(3, mem=4096),)}),
        (pod("pair", c("main", gpus=2)), {"main": (share(0, mem=1024), share(1, mem=1024))}),
        (
            pod("multi", c("a", gpus=1), c("b", gpus=1), c("c", gpus=2)),
            {
                "a": (share(2, mem=3000),),
                "b": (share(3, mem=5000),),
                "c": (share(0, mem=700), share(1, mem=700)),
            },
        ),
        (
            pod("with-init", c("setup", gpus=1, init=True), c("work", gpus=1)),
            {"setup": (share(2, mem=8192),), "work": (share(2, mem=6000),)},
        ),
    ]


async def test_concurrent_admissions_get_their_own_cards_and_limits(stack: Stack) -> None:
    reserved = {p.name: await stack.reserve(p, shares) for p, shares in workload()}
    pods = [p for p, _ in workload()]
    admitted = await asyncio.gather(*(stack.kubelet.admit(p) for p in pods))
    for one in admitted:
        assert_own(one, reserved[one.pod.name])
    ledger = await stack.ledger()
    assert {a.id: a.state for a in ledger.live()} == {
        a.id: AllocState.BOUND for a in reserved.values()
    }


async def test_when_kubelet_ignores_hints_no_container_gets_another_pods_reservation(
    stack: Stack,
) -> None:
    stack.kubelet.follow_hints = False
    reserved = {p.name: await stack.reserve(p, shares) for p, shares in workload()}
    results = await asyncio.gather(
        *(stack.kubelet.admit(p) for p, _ in workload()), return_exceptions=True
    )
    ledger = await stack.ledger()
    admitted = [r for r in results if isinstance(r, Admitted)]
    refused = [r for r in results if not isinstance(r, Admitted)]
    assert all(isinstance(r, AdmissionError) for r in refused), refused
    assert admitted, "some pods must be admitted (re-homed onto the devices kubelet chose)"
    for one in admitted:
        now = ledger.get(reserved[one.pod.name].id)
        assert now is not None
        assert_own(one, now)  # the ledger follows kubelet's choice, and the env matches it


async def test_same_size_different_limits_without_pod_resources_are_refused_not_swapped(
    stack: Stack,
) -> None:
    await stack.kubelet.stop_pod_resources()
    a = pod("a", FakeContainer("main", gpus=1))
    b = pod("b", FakeContainer("main", gpus=1))
    await stack.reserve(a, {"main": (share(0, mem=2048),)})
    await stack.reserve(b, {"main": (share(1, mem=9000),)})
    with pytest.raises(AdmissionError, match="cannot tell which"):
        await stack.kubelet.admit(a)


async def test_pod_resources_tells_which_of_two_same_sized_pods_is_admitted(stack: Stack) -> None:
    a = pod("a", FakeContainer("main", gpus=1))
    b = pod("b", FakeContainer("main", gpus=1))
    ra = await stack.reserve(a, {"main": (share(0, mem=2048),)})
    rb = await stack.reserve(b, {"main": (share(1, mem=9000),)})
    asked = stack.kubelet.pod_resources_calls
    second = await stack.kubelet.admit(b)  # the younger reservation first
    first = await stack.kubelet.admit(a)
    assert_own(second, rb)
    assert_own(first, ra)
    assert stack.kubelet.pod_resources_calls > asked


async def test_mps_isolation_answer(stack: Stack) -> None:
    p = pod("mps", FakeContainer("main", gpus=2))
    await stack.reserve(
        p, {"main": (share(0, mem=2048, core=300), share(1, mem=2048, core=300))}, Isolation.MPS
    )
    admitted = await stack.kubelet.admit(p)
    env = admitted.env("main")
    # By the container's CUDA ordinals, which CUDA_VISIBLE_DEVICES pins to the grant's order.
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-card-0,GPU-card-1"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M,1=2048M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    mounts = [m.container_path for m in admitted.answers["main"].mounts]
    assert mounts == [
        "/var/run/nvidia-container-devices/GPU-card-0",
        "/var/run/nvidia-container-devices/GPU-card-1",
        "/tmp/nvidia-mps",
    ]


async def test_a_pod_without_reservation_is_refused_with_a_clear_message(stack: Stack) -> None:
    with pytest.raises(AdmissionError, match="no container on n1 has a reservation"):
        await stack.kubelet.admit(pod("stray", FakeContainer("main", gpus=1)))
    assert IDENTITY.labels("refused")._value.get() >= 1


async def test_a_reconciliation_between_guessed_admissions_refuses_no_pod(stack: Stack) -> None:
    """Pods whose reservations look alike are steered oldest first, whatever order kubelet admits
    them in; a reconciliation in the middle of such a burst swaps the grants kubelet took. Then
    the youngest were admitted and the oldest were not, while the plugin still counted the oldest
    as answered: the next pod found no reservation to steer to, was given the lowest free slot, of
    a card another pod held whole, and was refused ("card 0 ... is held by 1 other(s)", seen in
    the DRA throughput benchmark's classic round)."""
    whole = {f"p{i}": (CardShare(share(i).uuid, i, 81920, 1000, exclusive=True),) for i in range(4)}
    pods = [pod(name, FakeContainer("main", gpus=1)) for name in whole]
    reserved = {p.name: await stack.reserve(p, {"main": whole[p.name]}) for p in pods}
    oldest_first, youngest_first = pods[:2], pods[:1:-1]
    for one in youngest_first:
        await stack.kubelet.admit(one)
    assert {f.kind for f in await stack.plugin.service.reconcile()} == {"swapped"}
    for one in oldest_first:
        await stack.kubelet.admit(one)  # refused here before
    await stack.plugin.service.reconcile()
    ledger = await stack.ledger()
    for one in pods:
        now = ledger.get(reserved[one.name].id)
        assert now is not None and now.state is AllocState.BOUND
        assert stack.kubelet.pod_devices[(one.uid, "main")] == now.grants[0].device_ids
    assert await stack.plugin.service.reconcile() == ()
