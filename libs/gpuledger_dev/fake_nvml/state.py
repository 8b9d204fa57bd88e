"""The fake NVML's state, and what every call goes through: the node's cards, the clock and the
scripted faults that fire on it, the controls tests drive it with, and the checks each call makes
(counted, NVML up and initialised, a handle resolved to its card or MIG instance).

Each family of calls (``devices``, ``mig``, ``events``) is a class over this state; ``FakeNvml``
is all of them.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fake_nvml.mig_state import FakeMig
from gpuledger_dev.fake_nvml.model import (
    ALL_INSTANCES,
    XID_FALLEN_OFF_BUS,
    Event,
    EventSet,
    FakeCard,
    Process,
    cards_of,
)
from gpuledger_dev.fleet_script import FaultKind, FaultSpec, NodeScript


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class NvmlState:
    """One node's NVML state: its cards, its clock and faults, and the event queue."""

    def __init__(
        self,
        sim: NodeScript,
        clock: Callable[[], float] | None = None,
        driver_version: str = "560.35.03",
        cuda_version: int = 12060,
    ) -> None:
        self._sim = sim
        self._clock = clock or time.monotonic
        self._start = self._clock()
        self._cond = threading.Condition()
        self._driver, self._cuda = driver_version, cuda_version
        self._refs = 0
        self._down_forced = False
        self._pending = sorted(sim.faults, key=lambda f: f.at)
        self._events: list[Event] = []
        self._sets: dict[int, EventSet] = {}
        self.calls: dict[str, int] = {}
        self._cards = cards_of(sim)

    # --- test controls -------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move a ManualClock forward; faults that fall due fire now."""
        if not isinstance(self._clock, ManualClock):
            raise TypeError("advance() needs the fake to run on a ManualClock")
        with self._cond:
            self._clock.now += seconds
            self._fire_due()
            self._cond.notify_all()

    def inject_xid(self, card: int, xid: int, gi: int | None = None, ci: int | None = None) -> None:
        """An XID event; inside a MIG device when given its GPU (and compute) instance ID."""
        gi_id = ALL_INSTANCES if gi is None else gi
        ci_id = ALL_INSTANCES if ci is None else ci
        self._push(Event(card, _nvml.nvmlEventTypeXidCriticalError, xid, gi_id, ci_id))

    def inject_ecc(self, card: int, double: bool = True) -> None:
        with self._cond:
            self._ecc_event(card, double)
            self._cond.notify_all()

    def lose(self, card: int) -> None:
        with self._cond:
            self._cards[card].lost = True
            self._events.append(Event(card, _nvml.nvmlEventTypeXidCriticalError, XID_FALLEN_OFF_BUS))
            self._cond.notify_all()

    def set_nvml_down(self, down: bool) -> None:
        with self._cond:
            self._down_forced = down
            self._cond.notify_all()

    def set_processes(self, card: int, processes: list[Process]) -> None:
        """(pid, MiB or None, (GPU instance ID, compute instance ID) or None) per process."""
        with self._cond:
            self._cards[card].processes = list(processes)

    def set_utilization(self, card: int, sm_percent: dict[int, int]) -> None:
        """Each process's (pid) share of the card's SM time in the last samples, in percent, as
        ``nvmlDeviceGetProcessUtilization`` reports it (a pid not running on the card is not)."""
        with self._cond:
            self._cards[card].sm_percent = dict(sm_percent)

    def set_events_supported(self, card: int, supported: bool) -> None:
        self._cards[card].events_supported = supported

    def numa_node(self, sysfs_bus_id: str) -> int | None:
        """What /sys/bus/pci/devices/<bus id>/numa_node says for this fake's cards."""
        card = next((c for c in self._cards if c.bus_id[4:].lower() == sysfs_bus_id), None)
        return None if card is None else card.numa

    def _push(self, event: Event) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    # --- time and faults -----------------------------------------------------------------------

    def _elapsed(self) -> float:
        return self._clock() - self._start

    def _fire_due(self) -> None:
        now = self._elapsed()
        while self._pending and self._pending[0].at <= now:
            self._fire(self._pending.pop(0))

    def _fire(self, fault: FaultSpec) -> None:
        if fault.kind is FaultKind.NVML_DOWN or fault.card is None:
            return  # a window, checked by _down()
        if fault.kind is FaultKind.LOST:
            self._cards[fault.card].lost = True
            self._events.append(Event(fault.card, _nvml.nvmlEventTypeXidCriticalError, XID_FALLEN_OFF_BUS))
        elif fault.kind is FaultKind.XID:
            gi, ci = self._fleet_mig(fault.card, fault.mig)
            self._events.append(Event(fault.card, _nvml.nvmlEventTypeXidCriticalError, fault.xid or 0, gi, ci))
        else:
            ecc = self._cards[fault.card].ecc
            ecc.remap_pending |= fault.kind is FaultKind.REMAP_PENDING
            ecc.remap_failure |= fault.kind is FaultKind.REMAP_FAILURE
            ecc.pages_pending |= fault.kind is FaultKind.PAGES_PENDING
            self._ecc_event(fault.card, fault.kind is not FaultKind.ECC_SINGLE)

    def _fleet_mig(self, card: int, index: int | None) -> tuple[int, int]:
        """The (GPU instance, compute instance) IDs of the fleet file's MIG instance ``index``;
        NVML's "all instances" for none, or for one a reset or a destroy has taken away."""
        mig = self._cards[card].mig
        if index is None or mig is None or index >= len(mig.fleet):
            return ALL_INSTANCES, ALL_INSTANCES
        where = mig.fleet[index]
        if all(d.where != where for d in mig.devices()):
            return ALL_INSTANCES, ALL_INSTANCES
        return where

    def _ecc_event(self, card: int, double: bool) -> None:
        self._cards[card].ecc.count(double)
        kind = _nvml.nvmlEventTypeDoubleBitEccError if double else _nvml.nvmlEventTypeSingleBitEccError
        self._events.append(Event(card, kind, 0))

    def _down(self) -> bool:
        if self._down_forced:
            return True
        now = self._elapsed()
        return any(
            f.kind is FaultKind.NVML_DOWN and f.at <= now and (f.until is None or now < f.until)
            for f in self._sim.faults
        )

    def _next_due(self) -> float | None:
        times = [f.at for f in self._pending]
        times += [f.until for f in self._sim.faults if f.kind is FaultKind.NVML_DOWN and f.until is not None]
        future = [t - self._elapsed() for t in times if t > self._elapsed()]
        return min(future) if future else None

    # --- plumbing ------------------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        """Every call: count it, fire due faults, check that NVML is up and initialised."""
        self.calls[name] = self.calls.get(name, 0) + 1
        self._fire_due()
        if self._refs == 0:
            raise _nvml.NVMLError_Uninitialized()
        if self._down():
            raise _nvml.NVMLError_Unknown()

    def _resolve(self, handle: Any, argno: int = 1) -> FakeCard | FakeMig:
        if not isinstance(handle, _nvml.c_nvmlDevice_t) or not handle:
            raise ctypes.ArgumentError(f"argument {argno}: TypeError: expected a c_nvmlDevice_t")
        address = ctypes.addressof(handle.contents)
        for card in self._cards:
            if ctypes.addressof(card.handle) == address:
                if card.lost:
                    raise _nvml.NVMLError_GpuIsLost()
                return card
            for mig in card.mig.devices() if card.mig else ():
                if ctypes.addressof(mig.handle) == address:
                    if card.lost:
                        raise _nvml.NVMLError_GpuIsLost()
                    return mig
        raise _nvml.NVMLError_InvalidArgument()

    def _card(self, name: str, handle: Any) -> FakeCard:
        """A call that takes a physical device: MIG handles are refused."""
        with self._cond:
            self._enter(name)
            found = self._resolve(handle)
        if isinstance(found, FakeMig):
            raise _nvml.NVMLError_InvalidArgument()
        return found

    def _pair(self, name: str, device1: Any, device2: Any) -> tuple[FakeCard, FakeCard]:
        with self._cond:
            self._enter(name)
            a, b = self._resolve(device1), self._resolve(device2, 2)
        if isinstance(a, FakeMig) or isinstance(b, FakeMig):
            raise _nvml.NVMLError_InvalidArgument()
        return a, b

    def _any(self, name: str, handle: Any) -> FakeCard | FakeMig:
        with self._cond:
            self._enter(name)
            return self._resolve(handle)
