"""The plugin's service waits out a ledger that will not answer or will not take a write for a
while, since kubelet fails a pod for good on an error and follows whatever hint it is given: a
fake ledger port, no NATS. The server's deadline (not here) bounds the wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace

import pytest

from gpuledger_common.settings import SettingsError, load
from gpuledger_core.errors import Conflict, FailedPrecondition, GpuledgerError, Unavailable
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, release, reserve
from gpuledger_core.model import AllocState, Grant
from gpuledger_core.slots import assign_device_ids
from gpuledger_plugin import waits as waits_module
from gpuledger_plugin.answer import AnswerPolicy
from gpuledger_plugin.kubelet_findings import KubeletView
from gpuledger_plugin.metrics import UNBOUND_LOST
from gpuledger_plugin.preferred import LocalPlacement
from gpuledger_plugin.service import PluginService
from gpuledger_plugin.settings import PluginSettings

from .plugin_fixtures import SLOTS, ids_of, ledger_with, pod, share

pytestmark = pytest.mark.timeout(5)
OUTAGE = Unavailable("cannot read the ledger of n1: JetStream did not take it (no stream leader answered)")
REFUSED_WRITE = Conflict("the ledger of n1 kept changing; gave up after 12 attempts")


class FlakyLedger:
    """The node's ledger, whose next reads and writes fail with the errors queued for them."""

    def __init__(self, ledger: NodeLedger) -> None:
        self.ledger = ledger
        self.reads: list[GpuledgerError] = []
        self.writes: list[GpuledgerError] = []
        self.answering = True  # its failures are JetStream's "not now", not silence

    def answered_at(self) -> float:
        return time.monotonic() if self.answering else float("-inf")

    async def read(self) -> NodeLedger | None:
        if self.reads:
            raise self.reads.pop(0)
        return self.ledger

    async def mutate(self, transition: Callable[[NodeLedger | None], NodeLedger | None]) -> NodeLedger | None:
        if self.writes:
            raise self.writes.pop(0)
        new = transition(self.ledger)
        assert new is not None
        self.ledger = new
        return new

    async def watch(self) -> AsyncGenerator[NodeLedger | None, None]:
        yield self.ledger


class NoPods:
    async def list(self) -> KubeletView:
        return {}


@pytest.fixture(autouse=True)
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waits_module, "OUTAGE_PAUSE_S", 0.001)
    monkeypatch.setattr(waits_module, "OUTAGE_PAUSE_MAX_S", 0.001)


def service_of(ledger: FlakyLedger) -> PluginService:
    return PluginService("n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS)


def reserved() -> FlakyLedger:
    """One pod reserved on card 3 (the local ranking would offer card 0)."""
    return FlakyLedger(ledger_with(pod("p", Grant("main", (share(3),)))))


OFFERED = [f"GPU-{card}::{slot}" for card in range(4) for slot in range(SLOTS)]  # every device, as kubelet offers them


async def test_preferred_waits_for_the_ledger_rather_than_ranking_cards_without_it() -> None:
    ledger = reserved()
    ledger.reads = [OUTAGE] * 5
    hint = await service_of(ledger).preferred(OFFERED, [], 1)
    assert hint == list(ids_of(ledger.ledger, "p"))
    assert not ledger.reads


async def test_preferred_steers_from_the_last_known_ledger_when_the_ledger_does_not_answer_in_time() -> None:
    """kubelet fails the pod on an error from GetPreferredAllocation (seen on the real kubelet): after
    ``preferred_wait_s`` the hint comes from the watch's copy of the node's ledger."""
    ledger = reserved()
    ledger.reads = [OUTAGE] * 10_000
    service = PluginService("n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS, preferred_wait_s=0.05)
    await service._seen(ledger.ledger)  # what the watch brought before the outage
    hint = await service.preferred(OFFERED, [], 1)
    assert hint == list(ids_of(ledger.ledger, "p"))
    assert ledger.reads  # it stopped asking the ledger


async def test_allocate_admits_from_the_last_known_ledger_and_binds_once_the_ledger_is_back() -> None:
    """The reservation was written before the bind and the watch brought it: with the ledger away
    past ``allocate_wait_s`` the container is admitted with its cards, and bound when it answers."""
    ledger = reserved()
    ledger.reads = [OUTAGE] * 10_000
    service = PluginService("n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS, allocate_wait_s=0.05)
    await service._seen(ledger.ledger)
    ids = ids_of(ledger.ledger, "p")
    outcome = await service.allocate(ids)
    assert (outcome.allocation_id, outcome.how) == ("a-p", "unbound")
    assert outcome.answer.envs["CUDA_VISIBLE_DEVICES"] == "GPU-3"
    allocation = ledger.ledger.get(outcome.allocation_id)
    assert allocation is not None and allocation.state is AllocState.RESERVED  # not written yet

    ledger.writes = [OUTAGE] * 3  # still away for a moment, then back
    binding = asyncio.ensure_future(service.bind_unbound_forever())
    try:
        for _ in range(200):
            bound = ledger.ledger.get(outcome.allocation_id)
            if bound is not None and bound.state is AllocState.BOUND:
                break
            await asyncio.sleep(0.01)
        assert bound is not None and bound.state is AllocState.BOUND and not service.unbound
    finally:
        binding.cancel()


async def test_allocate_from_the_last_known_ledger_takes_other_slots_of_the_reserved_card_not_other_cards() -> None:
    """A restarted kubelet may give the pod other slots of its card: admitted, and the bind moves the
    grant onto them; other cards than reserved are the ledger's to give."""
    ledger = reserved()  # card 3, slot 0
    ledger.reads = [OUTAGE] * 10_000
    service = PluginService("n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS, allocate_wait_s=0.05)
    await service._seen(ledger.ledger)
    with pytest.raises(Unavailable, match="holds no reservation"):
        await service.allocate(["GPU-0::1"])
    outcome = await service.allocate(["GPU-3::1"])
    assert outcome.how == "unbound" and outcome.answer.envs["CUDA_VISIBLE_DEVICES"] == "GPU-3"
    ((ref, (expected, ids)),) = service.unbound.items()
    assert ref == ("a-p", 0) and expected == frozenset(ids_of(ledger.ledger, "p")) and ids == ("GPU-3::1",)


async def test_a_bind_whose_reservation_is_gone_when_the_ledger_is_back_is_given_up_and_counted() -> None:
    ledger = reserved()
    ledger.reads = [OUTAGE] * 10_000
    service = PluginService("n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS, allocate_wait_s=0.05)
    await service._seen(ledger.ledger)
    outcome = await service.allocate(ids_of(ledger.ledger, "p"))
    ledger.ledger = release(ledger.ledger, outcome.allocation_id, 0.0, "lease ran out while the node was cut off")
    before = UNBOUND_LOST._value.get()
    binding = asyncio.ensure_future(service.bind_unbound_forever())
    try:
        for _ in range(200):
            if not service.unbound:
                break
            await asyncio.sleep(0.01)
        assert not service.unbound and UNBOUND_LOST._value.get() == before + 1
    finally:
        binding.cancel()


async def test_allocate_waits_out_an_election_longer_than_a_lost_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """JetStream answers "not now" (a leader election): Allocate waits for the ledger past
    ``unreachable_wait_s`` and binds through it, not from the copy."""
    monkeypatch.setattr(waits_module, "OUTAGE_PAUSE_S", 0.01)
    monkeypatch.setattr(waits_module, "OUTAGE_PAUSE_MAX_S", 0.01)
    ledger = reserved()
    ledger.reads = [OUTAGE] * 40
    service = PluginService(
        "n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS, allocate_wait_s=4.0, unreachable_wait_s=0.05
    )
    await service._seen(ledger.ledger)
    started = asyncio.get_running_loop().time()
    outcome = await service.allocate(ids_of(ledger.ledger, "p"))
    assert asyncio.get_running_loop().time() - started > 0.2  # it did wait (40 tries, 10 ms apart at least)
    assert outcome.how != "unbound" and not ledger.reads
    bound = ledger.ledger.get(outcome.allocation_id)
    assert bound is not None and bound.state is AllocState.BOUND


async def test_with_nothing_answering_allocate_and_preferred_go_on_without_the_ledger_soon() -> None:
    """Nothing answers, not even JetStream's "not now": waiting ``allocate_wait_s`` for an election
    would only hold up kubelet's admissions. After ``unreachable_wait_s`` the hint and the answer come from
    the node's last known ledger, and a container it holds no reservation for is refused, naming why."""
    ledger = reserved()
    ledger.reads = [OUTAGE] * 1_000_000
    ledger.answering = False
    service = PluginService(
        "n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS,
        preferred_wait_s=4.0, allocate_wait_s=4.0, unreachable_wait_s=0.2,
    )  # fmt: skip
    await service._seen(ledger.ledger)
    loop = asyncio.get_running_loop()
    started = loop.time()
    hint = await service.preferred(OFFERED, [], 1)
    assert hint == list(ids_of(ledger.ledger, "p")) and loop.time() - started < 2.0
    started = loop.time()
    outcome = await service.allocate(hint)
    assert outcome.how == "unbound" and loop.time() - started < 2.0
    with pytest.raises(Unavailable, match=r"NATS has answered nothing for \d\.\ds .*holds no reservation"):
        await service.allocate(["GPU-0::0"])


async def test_allocate_without_the_ledger_or_a_known_reservation_fails_in_time_with_the_reason() -> None:
    ledger = reserved()
    ledger.reads = [OUTAGE] * 10_000
    service = PluginService("n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS, allocate_wait_s=0.05)
    with pytest.raises(Unavailable, match=r"did not answer within 0\.05s .*, and the node's last known ledger"):
        await service.allocate(["GPU-0::0"])


@pytest.mark.parametrize("error", [OUTAGE, REFUSED_WRITE], ids=["unavailable", "conflict"])
async def test_allocate_tries_again_until_the_write_is_taken(error: GpuledgerError) -> None:
    ledger = reserved()
    ledger.writes = [error] * 5  # more than a few immediate retries would cover
    ids = ids_of(ledger.ledger, "p")
    outcome = await service_of(ledger).allocate(ids)
    assert outcome.allocation_id == "a-p"
    bound = ledger.ledger.get(outcome.allocation_id)
    assert bound is not None
    assert bound.state is AllocState.BOUND


async def test_allocate_refuses_at_once_what_waiting_does_not_mend() -> None:
    ledger = reserved()
    ledger.writes = [OUTAGE]
    with pytest.raises(FailedPrecondition, match="no container on n1 has a reservation"):
        await service_of(ledger).allocate(["GPU-0::0", "GPU-1::0"])
    assert ledger.writes == [OUTAGE]  # nothing was written, nor tried


def test_a_wait_as_long_as_the_answer_deadline_is_refused_by_name() -> None:
    """A wait that the deadline would cut short leaves no time to answer from the copy."""
    with pytest.raises(SettingsError, match=r"^allocate_wait_s: must be below answer_timeout_s \(10\), got 12"):
        load(PluginSettings, ["--node", "n1", "--answer-timeout-s", "10"], {})
    settings = load(PluginSettings, ["--node", "n1", "--answer-timeout-s", "10", "--allocate-wait-s", "8"], {})
    assert (settings.preferred_wait_s, settings.allocate_wait_s, settings.unreachable_wait_s) == (5.0, 8.0, 3.0)


async def test_a_reservation_released_while_it_is_bound_is_identified_again_on_the_fresh_ledger() -> None:
    """The reservation the device IDs belonged to is released between the read and the bind (its
    pod's bind was done again, under another allocation): the container is identified again on
    the ledger as it is now, and gets the reservation that is there, instead of a NotFound that
    kubelet turns into a failed pod."""
    first = reserved()  # pod "p" on card 3
    ids = ids_of(first.ledger, "p")
    again = pod("p", Grant("main", (share(1),)))
    again = replace(again, id=AllocationId("a-p-again"))
    released = release(first.ledger, AllocationId("a-p"), 0.0, "bound again elsewhere")
    moved = reserve(released, assign_device_ids(released, again, SLOTS))

    class Racing(FlakyLedger):
        async def mutate(self, transition: Callable[[NodeLedger | None], NodeLedger | None]) -> NodeLedger | None:
            if self.ledger is not moved:
                self.ledger = moved  # the release lands just before this write
            return await super().mutate(transition)

    ledger = Racing(first.ledger)
    outcome = await service_of(ledger).allocate(ids)
    assert outcome.allocation_id == "a-p-again"
    bound = ledger.ledger.get(AllocationId("a-p-again"))
    assert bound is not None and bound.state is AllocState.BOUND and sorted(bound.grants[0].device_ids) == sorted(ids)


class SlowLedger(FlakyLedger):
    """A ledger whose reads hang until ``release`` is set, as a read does while NATS is frozen."""

    def __init__(self, ledger: NodeLedger) -> None:
        super().__init__(ledger)
        self.release = asyncio.Event()
        self.answering = False

    async def read(self) -> NodeLedger | None:
        await self.release.wait()
        return self.ledger


async def test_a_reconciliation_waiting_for_the_ledger_holds_up_none_of_kubelets_calls() -> None:
    """Seen on the real kubelet with nats-server frozen: the reconciliation's read of the ledger
    (up to 12 s) held the lock that kubelet's calls take, so the first pod's GetPreferredAllocation
    waited for it before its own wait began. The read happens before the lock now."""
    ledger = SlowLedger(reserved().ledger)
    service = PluginService(
        "n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS,
        preferred_wait_s=4.0, allocate_wait_s=4.0, unreachable_wait_s=0.2,
    )  # fmt: skip
    await service._seen(ledger.ledger)
    reconciling = asyncio.create_task(service.reconcile())
    await asyncio.sleep(0.05)  # the reconciliation is waiting for its read
    loop = asyncio.get_running_loop()
    started = loop.time()
    hint = await service.preferred(OFFERED, [], 1)
    outcome = await service.allocate(hint)
    assert outcome.how == "unbound" and loop.time() - started < 1.5  # each call's own 0.2 s, not the read's
    assert not reconciling.done()
    ledger.release.set()
    await asyncio.wait_for(reconciling, 2)
