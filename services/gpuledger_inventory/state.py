"""The node's current picture (scan, usage, health, NVML state) and the payloads built from it.

Pure: no I/O. The service updates a ``NodeState`` and publishes ``message()`` and ``heartbeat()``.
The shapes are documented in services/gpuledger_inventory/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gpuledger_core import codec
from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.model import Card, CardMode, Node
from gpuledger_inventory.health import HealthBook, Transition, transition_to
from gpuledger_inventory.inventory import CardInfo, CardUsage, GpuProcess, MigMode, Scan, Usage
from gpuledger_inventory.mig_book import MigBook
from gpuledger_inventory.remediation import RemediationBook, step_to

SCHEMA = 1


@dataclass(frozen=True, slots=True)
class Host:
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: tuple[tuple[str, str], ...] = ()


NOT_STARTED = "not started"


@dataclass(slots=True)
class NodeState:
    name: NodeName
    backend: str
    book: HealthBook
    host: Host = field(default_factory=Host)
    scan: Scan | None = None
    usage: Usage = field(default_factory=Usage)
    nvml_ok: bool = False
    nvml_error: str = NOT_STARTED
    nvml_since: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    remedies: RemediationBook = field(default_factory=RemediationBook)
    mig: MigBook = field(default_factory=MigBook)

    def apply_scan(self, scan: Scan, now: float) -> list[Transition]:
        """Take a new scan; a card that answers GpuIsLost keeps its last known description."""
        previous = {c.card.index: c for c in self.scan.cards} if self.scan else {}
        kept = tuple(previous[i] for i in scan.lost if i in previous)
        cards = tuple(sorted(scan.cards + kept, key=lambda c: c.card.index))
        self.scan = replace(scan, cards=cards)
        self.mig.seen(self.scan)
        return [t for c in kept for t in self.book.on_lost(c.uuid, now)]

    def apply_usage(self, usage: Usage, now: float) -> list[Transition]:
        self.usage = usage
        return [t for c in usage.cards if c.lost for t in self.book.on_lost(c.uuid, now)]

    def nvml_down(self, error: str, now: float) -> list[Transition]:
        if self.nvml_ok or self.nvml_error != error:
            self.nvml_ok, self.nvml_error, self.nvml_since = False, error, now
        return self.book.on_nvml_down(self.uuids(), error, now)

    def nvml_up(self, now: float) -> list[Transition]:
        if not self.nvml_ok:
            self.nvml_ok, self.nvml_error, self.nvml_since = True, "", now
        return self.book.on_nvml_up(now)

    def known(self) -> bool:
        """Whether the node can say what cards it has: a scan, or NVML's failure to give one. Before
        either, a publication would tell the ledger the node has no cards (and lose their health)."""
        return self.scan is not None or self.nvml_error != NOT_STARTED

    def uuids(self) -> list[CardUuid]:
        return [c.uuid for c in self.scan.cards] if self.scan else []

    def card_info(self, uuid: str | None = None, index: int | None = None) -> CardInfo | None:
        for info in self.scan.cards if self.scan else ():
            if info.uuid == uuid or (index is not None and info.card.index == index):
                return info
        return None

    # --- payloads ------------------------------------------------------------------------------

    def card(self, info: CardInfo) -> Card:
        health = self.book.of(info.uuid)
        remedy = self.remedies.of(info.uuid).remedy
        if info.mig_mode is MigMode.ENABLED:  # its GPU instances, as the MIG book sees them
            instances = self.mig.instances(info)
            return replace(info.card, health=health.health, health_reason=health.reason, remedy=remedy,
                           mode=CardMode.MIG, instances=instances)  # fmt: skip
        return replace(info.card, health=health.health, health_reason=health.reason, remedy=remedy)

    def node(self) -> Node:
        scan = self.scan or Scan(())
        labels = dict(self.host.labels) | self.labels
        return Node(
            name=self.name,
            cards=tuple(self.card(c) for c in scan.cards),
            links=scan.links,
            cpu_milli=self.host.cpu_milli,
            memory_mib=self.host.memory_mib,
            labels=tuple(sorted(labels.items())),
        )

    def extra(self) -> dict[str, Any]:
        scan = self.scan or Scan(())
        return {
            "schema": SCHEMA,
            "backend": self.backend,
            "nvml": {"ok": self.nvml_ok, "error": self.nvml_error, "since": self.nvml_since},
            "driver_version": scan.driver_version,
            "cuda_driver_version": scan.cuda_version,
            "cards": [self._card_extra(c) for c in scan.cards],
            "problems": list(scan.problems),
            "health_log": [transition_to(t) for t in self.book.log],
        }

    def _card_extra(self, info: CardInfo) -> dict[str, Any]:
        usage = self.usage.of(info.uuid) or CardUsage(info.uuid)
        health = self.book.of(info.uuid)
        cc = info.compute_capability
        return {
            "uuid": info.uuid,
            "index": info.card.index,
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
            "memory_used_mib": usage.memory_used_mib,
            "nvswitch_links": info.nvswitch_links,
            "mig": {
                "mode": info.mig_mode.value,
                "pending": info.mig_pending.value,
                "instances": [
                    {
                        "uuid": m.uuid,
                        "gpu_instance": m.gpu_instance,
                        "compute_instance": m.compute_instance,
                        "memory_mib": m.memory_mib,
                        "slices": m.slices,
                        "multiprocessors": m.multiprocessors,
                    }
                    for m in info.mig
                ],
            },
            "processes": [self._process(p) for p in usage.processes],
            "health": {
                "state": health.health.value,
                "cause": health.cause.value,
                "reason": health.reason,
                "since": health.since,
                "by": health.by,
                "action": health.action.value,
            },
            "remediation": self._remediation(info),
        }

    def _process(self, p: GpuProcess) -> dict[str, Any]:
        """A process, with its pod and container where processes are attributed (else no such keys:
        a reader cannot tell a process in no pod from one nobody looked for)."""
        found: dict[str, Any] = {"pid": p.pid, "used_mib": p.used_mib, "mig_uuid": p.mig_uuid}
        if p.sm_percent is not None:
            found["sm_percent"] = p.sm_percent
        if self.usage.attributed:
            found |= {"pod_uid": p.pod_uid, "container_id": p.container_id}
        return found

    def _remediation(self, info: CardInfo) -> dict[str, Any]:
        card = self.remedies.of(info.uuid)
        return {"stage": card.stage.value, "since": card.since, "history": [step_to(s) for s in card.history]}

    def message(self, now: float) -> dict[str, Any]:
        return {"node": codec.node_to(self.node()), "at": now, "extra": self.extra()}

    def heartbeat(self, now: float, seq: int) -> dict[str, Any]:
        return {"node": self.name, "at": now, "seq": seq}


def same_content(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """Two inventory messages say the same thing (whatever their time)."""
    return a is not None and a["node"] == b["node"] and a["extra"] == b["extra"]
