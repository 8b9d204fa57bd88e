"""Allocate for a container holding MIG instances, through the plugin's service with a fake ledger
port and a fake inventory: the instance is made on the bound grant's placement, the answer names
it; a failed make fails the call with the inventory's reason and releases the allocation naming
card and profile; a call cut short while making releases it too; from the last known ledger
(the ledger away) a failed make leaves nothing to bind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core.errors import FailedPrecondition, InvalidArgument
from gpuledger_core.ids import AllocationId
from gpuledger_core.model import AllocState, MigSlot
from gpuledger_plugin import waits as waits_module
from gpuledger_plugin.answer import AnswerPolicy
from gpuledger_plugin.mig_resources import accepts
from gpuledger_plugin.preferred import LocalPlacement
from gpuledger_plugin.service import PluginService

from .test_plugin_mig import SLOTS, ledger_with
from .test_plugin_waits import OUTAGE, FlakyLedger, NoPods

pytestmark = pytest.mark.timeout(5)
PROFILE = "gpuledger.io/mig-1g.5gb"


class FakeInventory:
    """Answers ``mig.make`` as the node's inventory would, or with the error it is given."""

    def __init__(self, error: Exception | None = None, delay: float = 0.0) -> None:
        self.error, self.delay = error, delay
        self.asked: list[tuple[str, MigSlot, str]] = []

    async def make(self, card: str, slot: MigSlot, holder: str) -> MadeMig:
        self.asked.append((card, slot, holder))
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return MadeMig(f"MIG-{card}-{slot.start}", 7 + slot.start, 0, 1, 11)


@pytest.fixture(autouse=True)
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waits_module, "OUTAGE_PAUSE_S", 0.001)
    monkeypatch.setattr(waits_module, "OUTAGE_PAUSE_MAX_S", 0.001)


def setup(
    inventory: FakeInventory, policy: AnswerPolicy | None = None, allocate_wait_s: float = 1.0
) -> tuple[FlakyLedger, PluginService]:
    ledger = FlakyLedger(ledger_with(("p", "1g.5gb", None)))
    answers = policy or AnswerPolicy()
    service = PluginService(
        "n1", ledger, LocalPlacement(), NoPods(), answers, SLOTS, allocate_wait_s=allocate_wait_s, maker=inventory
    )
    return ledger, service


def state(ledger: FlakyLedger) -> tuple[AllocState, str]:
    found = ledger.ledger.get(AllocationId("p"))
    assert found is not None
    return found.state, found.reason


async def test_the_instance_is_made_on_the_reserved_placement_and_named_in_the_answer() -> None:
    inventory = FakeInventory()
    ledger, service = setup(inventory)
    await service._seen(ledger.ledger)
    outcome = await service.allocate(["GPU-1::0"], service.accepts(PROFILE))
    assert inventory.asked == [("GPU-1", MigSlot("1g.5gb", 0, 1), "p")]
    assert outcome.answer.envs["CUDA_VISIBLE_DEVICES"] == "MIG-GPU-1-0"
    assert outcome.instances is None
    assert state(ledger) == (AllocState.BOUND, "")


async def test_a_failed_make_fails_allocate_with_the_reason_and_releases_the_allocation() -> None:
    refusal = InvalidArgument("start", "card GPU-1: 1g.5gb has no placement at 0 (NVML said so)")
    ledger, service = setup(FakeInventory(refusal))
    await service._seen(ledger.ledger)
    with pytest.raises(FailedPrecondition) as caught:
        await service.allocate(["GPU-1::0"], service.accepts(PROFILE))
    message = str(caught.value)
    assert "MIG instance 1g.5gb at 0 on card 1 (GPU-1)" in message and "NVML said so" in message
    found, reason = state(ledger)
    assert found is AllocState.RELEASED
    assert "1g.5gb" in reason and "card 1 (GPU-1)" in reason and "NVML said so" in reason
    assert 0 not in service.served.get(AllocationId("p"), set())


async def test_an_answer_the_node_cannot_apply_releases_the_allocation(tmp_path: Path) -> None:
    policy = AnswerPolicy(device_specs=True, device_dir=str(tmp_path))  # no device node exists there
    ledger, service = setup(FakeInventory(), policy)
    await service._seen(ledger.ledger)
    with pytest.raises(FailedPrecondition, match="device nodes"):
        await service.allocate(["GPU-1::0"], service.accepts(PROFILE))
    assert state(ledger)[0] is AllocState.RELEASED


async def test_a_call_cut_short_while_making_releases_the_allocation() -> None:
    ledger, service = setup(FakeInventory(delay=10.0))
    await service._seen(ledger.ledger)
    call = asyncio.ensure_future(service.allocate(["GPU-1::0"], service.accepts(PROFILE)))
    await asyncio.sleep(0.1)
    call.cancel()  # the server's answer_timeout_s
    with pytest.raises(asyncio.CancelledError):
        await call
    for _ in range(50):
        if state(ledger)[0] is AllocState.RELEASED:
            break
        await asyncio.sleep(0.01)
    assert state(ledger)[0] is AllocState.RELEASED
    assert "ran out of time" in state(ledger)[1]


async def test_from_the_last_known_ledger_a_failed_make_leaves_nothing_to_bind() -> None:
    ledger, service = setup(FakeInventory(InvalidArgument("card", "gone")), allocate_wait_s=0.05)
    await service._seen(ledger.ledger)
    ledger.reads = [OUTAGE] * 10_000
    with pytest.raises(FailedPrecondition, match="gone"):
        await service.allocate(["GPU-1::0"], accepts(PROFILE))
    assert service.unbound == {}
    assert state(ledger)[0] is AllocState.RESERVED  # its lease runs out; the ledger was away to release it
