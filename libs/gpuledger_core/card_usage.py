"""What NVML sees on each card, as the node's inventory reports it: compute processes, their
memory and, where the inventory attributes them, their pods (docs/audit.md). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ProcessUse:
    """One compute process on a card: its memory and the pod (and container) it runs in."""

    used_mib: int
    pod_uid: str | None = None
    container_id: str | None = None
    sm_percent: int | None = None  # its share of the card's SM time lately; None: not sampled


@dataclass(frozen=True, slots=True)
class Usage:
    """Compute processes on a card and the memory they use, and each process's pod where the
    inventory attributes them (None: it does not, and nobody can tell whose a process is)."""

    processes: int = 0
    used_mib: int = 0
    attributed: tuple[ProcessUse, ...] | None = None


def usage_of(extra: object) -> dict[str, Usage]:
    """Processes per card from an inventory message's ``extra`` (absent or malformed: none). An
    inventory that attributes names ``pod_uid`` in every process (null for one in no pod)."""
    cards = extra.get("cards") if isinstance(extra, dict) else None
    found: dict[str, Usage] = {}
    for card in cards if isinstance(cards, list) else ():
        processes = card.get("processes") if isinstance(card, dict) else None
        if not isinstance(processes, list) or not isinstance(card.get("uuid"), str):
            continue
        rows = [p for p in processes if isinstance(p, dict)]
        attributed = tuple(_process(p) for p in rows) if any("pod_uid" in p for p in rows) else None
        found[card["uuid"]] = Usage(len(processes), sum(_mib(p) for p in rows), attributed)
    return found


def _mib(p: Mapping[str, Any]) -> int:
    value = p.get("used_mib")
    return value if type(value) is int and value > 0 else 0


def _process(p: Mapping[str, Any]) -> ProcessUse:
    pod, container, sm = p.get("pod_uid"), p.get("container_id"), p.get("sm_percent")
    return ProcessUse(
        _mib(p),
        pod if isinstance(pod, str) and pod else None,
        container if isinstance(container, str) else None,
        min(sm, 100) if type(sm) is int and sm >= 0 else None,
    )
