"""A card's reset and check: the fake NVML's model of them, the NVML adapter's check, and the
reset command's outcomes (a real subprocess, cut off when it hangs)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import pynvml
import pytest

from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Card
from gpuledger_dev.fake_nvml import FakeNvml, ManualClock
from gpuledger_dev.fleet import FleetError, parse_fleet
from gpuledger_dev.fleet_script import ResetResult, node_script
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.remediation import ResetOutcome
from gpuledger_inventory.repair import (
    CommandResetter,
    NvmlChecker,
    Ran,
    command_for,
    outcome_of,
    run_command,
    simulated,
)

pytestmark = pytest.mark.timeout(10)


def fake_of(profile: str, extra: str = "") -> tuple[FakeNvml, NvmlGpus]:
    fleet = parse_fleet(f"nodes:\n  - name: n1\n    profile: {profile}\n{extra}", "t.yaml")
    fake = FakeNvml(node_script(fleet, "n1"), clock=ManualClock())
    gpus = NvmlGpus(fake, fake.numa_node, "fake")
    gpus.open()
    gpus.scan()
    return fake, gpus


def uuid(fake: FakeNvml, index: int) -> CardUuid:
    return CardUuid(fake._cards[index].uuid)


def test_a_pending_row_remap_fails_the_check_until_a_reset_applies_it() -> None:
    fake, gpus = fake_of("h100-sxm-8", "    faults:\n      - {at: 1, card: 2, kind: remap_pending}\n")
    assert gpus.check(uuid(fake, 2), True) == ()
    fake.advance(1)
    assert gpus.check(uuid(fake, 2), False) == ()  # expected before a reset, which applies it
    assert gpus.check(uuid(fake, 2), True) == ("a row remap is pending",)
    h = fake.nvmlDeviceGetHandleByUUID(uuid(fake, 2))
    assert fake.nvmlDeviceGetTotalEccErrors(h, 1, pynvml.NVML_VOLATILE_ECC) == 1
    assert fake.gpu_reset(uuid(fake, 2)).code == 0
    assert fake.nvmlDeviceGetRemappedRows(h) == (0, 1, 0, 0)
    assert fake.nvmlDeviceGetTotalEccErrors(h, 1, pynvml.NVML_VOLATILE_ECC) == 0
    assert fake.nvmlDeviceGetTotalEccErrors(h, 1, pynvml.NVML_AGGREGATE_ECC) == 1
    assert gpus.check(uuid(fake, 2), True) == ()
    assert gpus.check(uuid(fake, 3), True) == ()


def test_a_failed_remap_stays_after_a_reset() -> None:
    fake, gpus = fake_of("a100-sxm-8", "    faults:\n      - {at: 0, card: 0, kind: remap_failure}\n")
    fake.advance(0)
    fake.gpu_reset(uuid(fake, 0))
    assert gpus.check(uuid(fake, 0), True) == ("row remapping failed",)


def test_older_cards_retire_pages_and_do_not_remap_rows() -> None:
    fake, gpus = fake_of("dgx1-v100", "    faults:\n      - {at: 0, card: 1, kind: pages_pending}\n")
    fake.advance(0)
    h = fake.nvmlDeviceGetHandleByUUID(uuid(fake, 1))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetRemappedRows(h)
    assert gpus.check(uuid(fake, 1), True) == ("a page retirement is pending",)
    fake.gpu_reset(uuid(fake, 1))
    assert fake.nvmlDeviceGetRetiredPagesPendingStatus(h) == pynvml.NVML_FEATURE_DISABLED


def test_cards_without_ecc_answer_not_supported_and_pass() -> None:
    fake, gpus = fake_of("rtx3090-1")
    h = fake.nvmlDeviceGetHandleByUUID(uuid(fake, 0))
    for call in (fake.nvmlDeviceGetRetiredPagesPendingStatus, fake.nvmlDeviceGetRemappedRows):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(h)
    assert gpus.check(uuid(fake, 0), True) == ()


def test_a_lost_card_fails_the_check_and_comes_back_after_a_reset_unless_scripted_not_to() -> None:
    fake, gpus = fake_of("h100-sxm-8", "    resets:\n      - {card: 5, returns: false}\n")
    fake.lose(4)
    fake.lose(5)
    assert gpus.check(uuid(fake, 4), True) == ("NVML says the card is lost",)
    assert fake.gpu_reset(uuid(fake, 4)).code == 0
    assert gpus.check(uuid(fake, 4), True) == ()
    assert fake.gpu_reset(uuid(fake, 5)).code != 0
    assert gpus.check(uuid(fake, 5), True) == ("NVML says the card is lost",)
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetHandleByUUID("GPU-nope")


def test_resets_follow_the_script_per_card_in_order() -> None:
    script = (
        "    resets:\n      - {card: 1, result: fail, seconds: 2}\n      - {card: 1, result: hang}\n"
        "      - {card: 0, result: unsupported}\n"
    )
    fake, _ = fake_of("h100-sxm-8", script)
    fake.set_processes(2, [(77, 10, None)])
    assert outcomes(fake, 1, 1, 1, 0, 2) == [
        (ResetOutcome.FAILED, 2.0),
        (ResetOutcome.HUNG, None),
        (ResetOutcome.OK, 0.5),
        (ResetOutcome.UNSUPPORTED, 0.1),
        (ResetOutcome.FAILED, 0.1),  # refused: the card has a process
    ]


def outcomes(fake: FakeNvml, *cards: int) -> list[tuple[ResetOutcome, float | None]]:
    found = []
    for index in cards:
        answer = fake.gpu_reset(uuid(fake, index))
        ran = Ran(None if answer.seconds is None else answer.code, answer.output)
        found.append((outcome_of(ran, 1.0)[0], answer.seconds))
    return found


def test_a_bad_reset_script_names_its_field() -> None:
    with pytest.raises(FleetError, match=r"resets\[0\].result"):
        fake_of("h100-sxm-8", "    resets:\n      - {card: 1, result: explode}\n")
    assert ResetResult("hang") is ResetResult.HANG


CARD = Card(CardUuid("GPU-1"), 3, "m", 10, pci_bus_id="00000000:1B:00.0")


def test_a_command_names_the_card() -> None:
    assert command_for("nvidia-smi --gpu-reset -i {uuid}", CARD) == ["nvidia-smi", "--gpu-reset", "-i", "GPU-1"]
    assert command_for("probe --index={index} '{bus_id}'", CARD) == ["probe", "--index=3", "00000000:1B:00.0"]


@pytest.mark.parametrize(
    ("script", "outcome", "detail"),
    [
        ("echo reset done", ResetOutcome.OK, "reset done"),
        ("echo 'Resetting GPU is not supported.'; exit 3", ResetOutcome.UNSUPPORTED, "not supported"),
        ("echo 'In use by another client' >&2; exit 255", ResetOutcome.FAILED, "exit 255: In use"),
        ("sleep 30", ResetOutcome.HUNG, "cut off after 0.3s"),
    ],
)
async def test_the_reset_command_s_end_says_how_it_went(script: str, outcome: ResetOutcome, detail: str) -> None:
    resetter = CommandResetter(f"sh -c {script!r}", 0.3)
    start = time.monotonic()
    got, said = await resetter.reset(CARD)
    assert (got, detail in said) == (outcome, True)
    assert time.monotonic() - start < 5


async def test_a_hung_command_is_killed_with_its_children() -> None:
    ran = await run_command(["sh", "-c", "sleep 30 & sleep 30; wait"], 0.2)
    assert ran.code is None


async def test_a_missing_command_fails() -> None:
    ran = await run_command(["/nonexistent/reset-tool"], 1.0)
    assert ran.code == 127


async def test_the_fake_reset_is_cut_off_when_it_hangs() -> None:
    fake, _ = fake_of("h100-sxm-8", "    resets:\n      - {card: 1, result: hang}\n")
    resetter = CommandResetter("nvidia-smi --gpu-reset -i {uuid}", 1.0, simulated(_answer(fake)))
    card = Card(uuid(fake, 1), 1, "m", 10)
    assert (await resetter.reset(card))[0] is ResetOutcome.HUNG
    assert await resetter.reset(card) == (ResetOutcome.OK, "GPU 00000000:2D:00.0 was successfully reset.")


def _answer(fake: FakeNvml) -> Callable[[str], tuple[float | None, int, str]]:
    def answer(card_uuid: str) -> tuple[float | None, int, str]:
        done = fake.gpu_reset(card_uuid)
        return done.seconds, done.code, done.output

    return answer


async def test_the_probe_runs_only_once_nvml_finds_nothing_wrong() -> None:
    fake, gpus = fake_of("h100-sxm-8")
    card = Card(uuid(fake, 1), 1, "m", 10)
    assert await NvmlChecker(gpus, f"{sys.executable} -c 'raise SystemExit(4)'", 5.0).check(card, True) == (
        "the probe failed (exit 4)",
    )
    assert await NvmlChecker(gpus, "true", 5.0).check(card, True) == ()
    fake.lose(1)
    assert await NvmlChecker(gpus, "false", 5.0).check(card, True) == ("NVML says the card is lost",)
