"""What the node's inventory knows of its MIG instances beyond what NVML says: which it made on
demand (the records, so that the rest are static), which are faulted, and which it may destroy
(docs/mig.md, "The node's part: instances made and destroyed"). Pure: no I/O, no clock.

- A **record** (card, placement, holder, when) is written to the state file *before* the instance
  is made. At each scan a record whose instance is not there is forgotten, unless it is being made
  (``pending``); so at a start, records whose instance exists are on-demand instances, and those
  whose instance is gone (a crash before creating, or someone destroyed it) are forgotten.
- Every other GPU instance is **static**: made by an operator, used, never destroyed.
- An on-demand instance whose placement no live allocation of the node's ledger holds is
  **due** once it has been unheld for ``keep_s`` (counted from its making, the last time the
  ledger showed it held, or the inventory's start, whichever is latest).
- A **fault** (an XID inside the instance) is kept by its MIG device's UUID until the instance is
  gone or an operator marks its card healthy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpuledger_core.ids import CardUuid
from gpuledger_core.model import MigInstance, MigSlot, Remedy
from gpuledger_inventory.inventory import CardInfo, GpuInstance, MigMode, Scan

Key = tuple[CardUuid, MigSlot]


@dataclass(frozen=True, slots=True)
class MigRecord:
    """An instance gpuledger made (or is making) on demand, for ``holder``, at ``at``."""

    card: CardUuid
    slot: MigSlot
    holder: str
    at: float

    @property
    def key(self) -> Key:
        return (self.card, self.slot)


@dataclass(frozen=True, slots=True)
class MigFault:
    """Why a MIG instance (by its MIG device's UUID) is unhealthy, and whether its holder must move."""

    card: CardUuid
    reason: str
    remedy: Remedy
    since: float


def slot_of(gi: GpuInstance) -> MigSlot:
    return MigSlot(gi.profile, gi.start, gi.size)


def device_of(info: CardInfo, gi: GpuInstance) -> str:
    """The MIG device UUID of the GPU instance's first compute instance; empty when it has none."""
    found = [m for m in info.mig if m.gpu_instance == gi.id]
    return min(found, key=lambda m: m.compute_instance).uuid if found else ""


def mig_cards(scan: Scan | None) -> Iterator[CardInfo]:
    """The scanned cards in MIG mode whose GPU instances were read."""
    for info in scan.cards if scan else ():
        if info.mig_mode is MigMode.ENABLED and info.gpu_instances is not None:
            yield info


@dataclass(slots=True)
class MigBook:
    records: dict[Key, MigRecord] = field(default_factory=dict)
    faults: dict[str, MigFault] = field(default_factory=dict)  # MIG device UUID -> its fault
    pending: set[Key] = field(default_factory=set)  # being made now (not forgotten by a scan)
    held: frozenset[Key] = frozenset()  # what the node's ledger holds, as last seen
    held_at: dict[Key, float] = field(default_factory=dict)  # when a record's placement was last seen held
    since: float = 0.0  # the inventory's start: nothing is due before keep_s after it
    forgotten: list[MigRecord] = field(default_factory=list)  # forgotten by scans, not yet saved

    # --- the published instances -----------------------------------------------------------------

    def instances(self, info: CardInfo) -> tuple[MigInstance, ...]:
        """The card's GPU instances as the ledger holds them: static unless recorded, with their
        MIG device's UUID and fault."""
        found = []
        for gi in info.gpu_instances or ():
            slot, uuid = slot_of(gi), device_of(info, gi)
            fault = self.faults.get(uuid) if uuid else None
            static = (info.uuid, slot) not in self.records
            if fault is None:
                found.append(MigInstance(slot, static, uuid))
            else:
                found.append(MigInstance(slot, static, uuid, fault.reason, fault.remedy))
        return tuple(found)

    # --- records ---------------------------------------------------------------------------------

    def intend(self, card: CardUuid, slot: MigSlot, holder: str, now: float) -> None:
        """An instance about to be made: recorded (and pending) before NVML is asked."""
        record = MigRecord(card, slot, holder, now)
        self.records[record.key] = record
        self.pending.add(record.key)

    def made(self, key: Key) -> None:
        self.pending.discard(key)

    def forget(self, key: Key) -> None:
        self.records.pop(key, None)
        self.pending.discard(key)
        self.held_at.pop(key, None)

    def seen(self, scan: Scan | None) -> list[MigRecord]:
        """Forget the records and faults whose instance the scan does not show (the records being
        made excepted); the records forgotten. Cards whose instances were not read keep theirs."""
        read = {info.uuid: info for info in mig_cards(scan)}
        unread = {info.uuid for info in scan.cards if info.uuid not in read} if scan else set()
        gone = []
        for key, record in list(self.records.items()):
            if key in self.pending or record.card in unread:
                continue
            info = read.get(record.card)
            if info is None or all(slot_of(gi) != record.slot for gi in info.gpu_instances or ()):
                gone.append(record)
                self.forget(key)
        self.forgotten += gone
        devices = {m.uuid for info in read.values() for m in info.mig}
        for uuid, fault in list(self.faults.items()):
            if uuid not in devices and fault.card not in unread:
                del self.faults[uuid]
        return gone

    # --- holders and what is due -----------------------------------------------------------------

    def set_held(self, held: Iterable[Key], now: float) -> None:
        """The placements the node's ledger's live allocations hold now. A record held before or
        now was held until ``now`` (its keep counts from its release as this ledger shows it)."""
        before, self.held = self.held, frozenset(held)
        for key in (before | self.held) & self.records.keys():
            self.held_at[key] = now

    def due(self, scan: Scan | None, now: float, keep_s: float) -> list[tuple[MigRecord, GpuInstance]]:
        """The on-demand instances to destroy now: unheld for ``keep_s``."""
        found = []
        for info in mig_cards(scan):
            for gi in info.gpu_instances or ():
                key = (info.uuid, slot_of(gi))
                record = self.records.get(key)
                if record is None or key in self.pending or key in self.held:
                    continue
                if now - max(record.at, self.held_at.get(key, record.at), self.since) >= keep_s:
                    found.append((record, gi))
        return found

    def next_due(self, keep_s: float) -> float | None:
        """When the next unheld record comes due (None: none is unheld)."""
        times = [
            max(r.at, self.held_at.get(k, r.at), self.since) + keep_s
            for k, r in self.records.items()
            if k not in self.held and k not in self.pending
        ]
        return min(times, default=None)

    # --- faults ----------------------------------------------------------------------------------

    def fault(self, card: CardUuid, device: str, reason: str, remedy: Remedy, now: float) -> bool:
        """Mark the instance of MIG device ``device`` faulted; a fault already there is kept, its
        remedy raised to ``remedy``. Whether anything changed."""
        known = self.faults.get(device)
        if known is not None and (known.remedy is Remedy.DRAIN or remedy is Remedy.NONE):
            return False
        self.faults[device] = MigFault(card, reason, remedy, now if known is None else known.since)
        return True

    def clear_faults(self, card: CardUuid) -> list[str]:
        """An operator's word that the card is healthy: its instances' faults are gone; their UUIDs."""
        cleared = [uuid for uuid, f in self.faults.items() if f.card == card]
        for uuid in cleared:
            del self.faults[uuid]
        return cleared

    # --- the state file --------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "records": [
                {"card": r.card, **_slot_to(r.slot), "holder": r.holder, "at": r.at} for r in self.records.values()
            ],
            "faults": {
                uuid: {"card": f.card, "reason": f.reason, "remedy": f.remedy.value, "since": f.since}
                for uuid, f in self.faults.items()
            },
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> MigBook:
        """A saved book; raises ValueError, KeyError or TypeError for one that is not."""
        book = cls()
        for r in raw.get("records", []):
            slot = MigSlot(str(r["profile"]), int(r["start"]), int(r["size"]))
            record = MigRecord(CardUuid(str(r["card"])), slot, str(r["holder"]), float(r["at"]))
            book.records[record.key] = record
        for uuid, f in raw.get("faults", {}).items():
            book.faults[str(uuid)] = MigFault(CardUuid(str(f["card"])), str(f["reason"]), Remedy(f["remedy"]),
                                              float(f["since"]))  # fmt: skip
        return book

    def empty(self) -> bool:
        """Nothing to save: no record and no fault."""
        return not self.records and not self.faults


def _slot_to(slot: MigSlot) -> dict[str, Any]:
    return {"profile": slot.profile, "start": slot.start, "size": slot.size}
