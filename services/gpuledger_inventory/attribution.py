"""NVML's processes joined to the pods that run them (docs/audit.md, "Attribution").

``Attributing`` is a ``Gpus`` over another: its ``usage`` is the inner one's with each process's
pod UID and container ID read from the process's cgroup (``cgroups.ProcCgroups``), in the same
worker thread as the NVML calls; every other call goes through unchanged. Its cost per card and
poll is measured by ``benchmarks/audit_cost.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuledger_core.ids import CardUuid
from gpuledger_inventory.cgroups import PodProcess
from gpuledger_inventory.inventory import CardUsage, GpuEvent, GpuProcess, Scan, Usage
from gpuledger_inventory.nvml import Gpus

PodOf = Callable[[int], PodProcess | None]


def attribute(usage: Usage, pod_of: PodOf) -> Usage:
    """``usage`` with each process's pod and container (None where its cgroup names none)."""
    return Usage(tuple(_card(card, pod_of) for card in usage.cards), attributed=True)


def _card(card: CardUsage, pod_of: PodOf) -> CardUsage:
    if not card.processes:
        return card
    return replace(card, processes=tuple(_process(p, pod_of(p.pid)) for p in card.processes))


def _process(process: GpuProcess, where: PodProcess | None) -> GpuProcess:
    if where is None:
        return process
    return replace(process, pod_uid=where.pod_uid, container_id=where.container_id)


class Attributing:
    """A ``Gpus`` whose usage names each process's pod; everything else is the inner one's."""

    def __init__(self, gpus: Gpus, pod_of: PodOf) -> None:
        self.inner, self.pod_of = gpus, pod_of
        self.backend = gpus.backend

    def usage(self, scan: Scan) -> Usage:
        return attribute(self.inner.usage(scan), self.pod_of)

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def scan(self) -> Scan:
        return self.inner.scan()

    def watch(self, scan: Scan) -> dict[CardUuid, str]:
        return self.inner.watch(scan)

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        return self.inner.wait(timeout_ms)

    def check(self, uuid: CardUuid, reset: bool) -> tuple[str, ...]:
        return self.inner.check(uuid, reset)

    def __getattr__(self, name: str) -> Any:  # the fake NVML's extras (``nvml`` for its reset)
        return getattr(self.inner, name)
