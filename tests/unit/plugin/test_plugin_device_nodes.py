"""With device specs on, Allocate names each card's device node on the host; one that does not
exist is refused before anything is bound, with a message naming the paths: the runtime would
fail the container without naming a card, or start it without its cards."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.model import AllocState
from gpuledger_plugin.answer import AnswerPolicy
from gpuledger_plugin.preferred import LocalPlacement
from gpuledger_plugin.service import PluginService

from .plugin_fixtures import SLOTS, ids_of
from .test_plugin_waits import FlakyLedger, NoPods, reserved

pytestmark = pytest.mark.timeout(5)


def service_of(ledger: FlakyLedger, device_dir: Path) -> PluginService:
    policy = AnswerPolicy(device_specs=True, device_dir=str(device_dir))
    return PluginService("n1", ledger, LocalPlacement(), NoPods(), policy, SLOTS)


def make(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).touch()


async def test_the_answer_names_the_device_nodes_under_the_device_dir(tmp_path: Path) -> None:
    make(tmp_path, "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia3")
    ledger = reserved()  # card 3
    outcome = await service_of(ledger, tmp_path).allocate(ids_of(ledger.ledger, "p"))
    assert {d.host_path for d in outcome.answer.devices} == {
        str(tmp_path / n) for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia3")
    }


async def test_a_missing_device_node_is_refused_before_anything_is_bound(tmp_path: Path) -> None:
    make(tmp_path, "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0")  # card 3's node is missing
    ledger = reserved()
    with pytest.raises(FailedPrecondition, match=f"device nodes {tmp_path / 'nvidia3'} do not exist"):
        await service_of(ledger, tmp_path).allocate(ids_of(ledger.ledger, "p"))
    (allocation,) = ledger.ledger.allocations
    assert allocation.state is AllocState.RESERVED  # nothing bound


async def test_a_grant_moved_to_another_card_is_checked_on_the_card_it_moves_to(tmp_path: Path) -> None:
    """kubelet gave other devices than the hint (a card of its own choice): the ledger moves the
    grant there, and the device nodes checked are that card's, not the reserved one's."""
    make(tmp_path, "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia3")  # the reserved card's only
    ledger = reserved()  # card 3
    with pytest.raises(FailedPrecondition, match=f"device nodes {tmp_path / 'nvidia0'} do not exist"):
        await service_of(ledger, tmp_path).allocate(["GPU-0::0"])
    (allocation,) = ledger.ledger.allocations
    assert allocation.state is AllocState.RESERVED and allocation.grants[0].cards[0].index == 3  # nothing moved
    make(tmp_path, "nvidia0")
    outcome = await service_of(ledger, tmp_path).allocate(["GPU-0::0"])
    assert outcome.how == "rehomed" and str(tmp_path / "nvidia0") in {d.host_path for d in outcome.answer.devices}
