"""A card's reset and check, behind two small ports (``Resetter``, ``Checker``).

NVML has no call that resets a GPU (pynvml offers reset only for clocks, counters and NVLink
counters), so the reset is a configured command, ``nvidia-smi --gpu-reset -i {uuid}`` by default,
run with a timeout: one that has not ended by then is killed with its process group and counted as
hung. Its exit says how it went; an output that says "not supported" means the card or driver
cannot be reset this way. The check asks NVML (``Gpus.check``: the card answers, nothing pending)
and then runs an optional probe command (a short allocation of the card's memory, say), with the
same timeout. ``{uuid}``, ``{index}`` and ``{bus_id}`` in a command are the card's.

The fake fleet answers the reset command itself (``simulated``): the same outcomes, on the fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuledger_core.model import Card
from gpuledger_inventory.nvml import Gpus
from gpuledger_inventory.remediation import ResetOutcome

OUTPUT_KEPT = 300  # characters of a command's output kept for the record


@dataclass(frozen=True, slots=True)
class Ran:
    """How a command ended: its exit code (None: cut off at the timeout) and its output's tail."""

    code: int | None
    output: str = ""


Run = Callable[[Sequence[str], float], Awaitable[Ran]]


class Resetter(Protocol):
    async def reset(self, card: Card) -> tuple[ResetOutcome, str]: ...


class Checker(Protocol):
    async def check(self, card: Card, reset: bool) -> tuple[str, ...]: ...


async def run_command(argv: Sequence[str], timeout_s: float) -> Ran:
    """Run ``argv`` in its own process group; kill the group if it outlives ``timeout_s``."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True
        )
    except OSError as err:
        return Ran(127, f"cannot run {argv[0]}: {err}")
    try:
        async with asyncio.timeout(timeout_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return Ran(None)
    return Ran(proc.returncode, out.decode(errors="replace").strip()[-OUTPUT_KEPT:])


def simulated(answer: Callable[[str], tuple[float | None, int, str]]) -> Run:
    """A runner for the fake fleet: ``answer(uuid)`` says how long the reset of that card takes
    (None: for ever) and how it exits; the wait is real time, so the timeout cuts a hang off."""

    async def run(argv: Sequence[str], timeout_s: float) -> Ran:
        seconds, code, output = answer(argv[-1])
        try:
            async with asyncio.timeout(timeout_s):
                await (asyncio.sleep(seconds) if seconds is not None else asyncio.Event().wait())
        except TimeoutError:
            return Ran(None)
        return Ran(code, output)

    return run


def command_for(template: str, card: Card) -> list[str]:
    values = {"{uuid}": card.uuid, "{index}": str(card.index), "{bus_id}": card.pci_bus_id}
    argv = shlex.split(template)
    for key, value in values.items():
        argv = [arg.replace(key, value) for arg in argv]
    return argv


def outcome_of(ran: Ran, timeout_s: float) -> tuple[ResetOutcome, str]:
    if ran.code is None:
        return ResetOutcome.HUNG, f"cut off after {timeout_s:g}s"
    if ran.code == 0:
        return ResetOutcome.OK, ran.output
    if "not supported" in ran.output.lower():
        return ResetOutcome.UNSUPPORTED, ran.output
    return ResetOutcome.FAILED, f"exit {ran.code}: {ran.output}" if ran.output else f"exit {ran.code}"


@dataclass(frozen=True, slots=True)
class CommandResetter:
    command: str
    timeout_s: float
    run: Run = run_command

    async def reset(self, card: Card) -> tuple[ResetOutcome, str]:
        return outcome_of(await self.run(command_for(self.command, card), self.timeout_s), self.timeout_s)


@dataclass(frozen=True, slots=True)
class NvmlChecker:
    """NVML's word on the card, then the probe command (if any) once NVML finds nothing wrong."""

    gpus: Gpus
    probe: str = ""
    timeout_s: float = 60.0
    run: Run = run_command

    async def check(self, card: Card, reset: bool) -> tuple[str, ...]:
        problems = await asyncio.to_thread(self.gpus.check, card.uuid, reset)
        if problems or not self.probe:
            return problems
        ran = await self.run(command_for(self.probe, card), self.timeout_s)
        if ran.code is None:
            return (f"the probe was cut off after {self.timeout_s:g}s",)
        if ran.code != 0:
            return (f"the probe failed (exit {ran.code}){': ' + ran.output if ran.output else ''}",)
        return ()
