"""The fake NVML's event and process calls: event sets made, registered and freed, the event
types a card supports, waiting for the next event, and the compute processes on a card or MIG
device.

``nvmlEventSetWait`` blocks until an event or the timeout, then raises ``NVMLError_Timeout``; a
fault that falls due while it waits wakes it.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fake_nvml.mig_state import FakeMig
from gpuledger_dev.fake_nvml.model import ALL_INSTANCES, Event, EventSet, FakeCard, MiB
from gpuledger_dev.fake_nvml.state import NvmlState

_BASE_EVENTS = _nvml.nvmlEventTypeXidCriticalError | _nvml.nvmlEventTypePState | _nvml.nvmlEventTypeClock
_ECC_EVENTS = _nvml.nvmlEventTypeSingleBitEccError | _nvml.nvmlEventTypeDoubleBitEccError


class EventCalls(NvmlState):
    """The event and process calls of pynvml."""

    # --- processes -----------------------------------------------------------------------------

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        found = self._any("nvmlDeviceGetComputeRunningProcesses", handle)
        card = self._cards[found.parent] if isinstance(found, FakeMig) else found
        rows = [p for p in card.processes if not isinstance(found, FakeMig) or p[2] == found.where]
        return [_process(pid, mem, where) for pid, mem, where in rows]

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        """A sample per process with SM time on the card, stamped now (microseconds since the
        epoch, as NVML stamps them); ``NVMLError_NotFound`` when none is newer than ``timeStamp``,
        as NVML answers. Not on a MIG device: NVML does not sample processes per instance."""
        found = self._any("nvmlDeviceGetProcessUtilization", handle)
        if isinstance(found, FakeMig):
            raise _nvml.NVMLError_NotSupported()
        now = int(time.time() * 1_000_000)
        running = {pid for pid, _, _ in found.processes}
        samples = [(pid, sm) for pid, sm in sorted(found.sm_percent.items()) if pid in running]
        if not samples or now <= timeStamp:
            raise _nvml.NVMLError_NotFound()
        return [_utilization(pid, sm, now) for pid, sm in samples]

    # --- events --------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        with self._cond:
            self._enter("nvmlEventSetCreate")
            event_set = EventSet(len(self._events))
            self._sets[ctypes.addressof(event_set.handle)] = event_set
            return ctypes.pointer(event_set.handle)

    def _set(self, event_set: Any) -> EventSet:
        if not isinstance(event_set, _nvml.c_nvmlEventSet_t) or not event_set:
            raise ctypes.ArgumentError("expected a c_nvmlEventSet_t")
        found = self._sets.get(ctypes.addressof(event_set.contents))
        if found is None:
            raise _nvml.NVMLError_InvalidArgument()
        return found

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        with self._cond:
            self._enter("nvmlEventSetFree")
            self._sets.pop(ctypes.addressof(self._set(eventSet).handle))

    def _supported(self, card: FakeCard) -> int:
        if not card.events_supported:
            raise _nvml.NVMLError_NotSupported()
        mask = _BASE_EVENTS | (_ECC_EVENTS if card.arch.ecc else 0)
        return int(mask | (_nvml.nvmlEventMigConfigChange if card.mig is not None else 0))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._supported(self._card("nvmlDeviceGetSupportedEventTypes", handle))

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        found = self._any("nvmlDeviceRegisterEvents", handle)
        if isinstance(found, FakeMig) or eventTypes & ~self._supported(found):
            raise _nvml.NVMLError_NotSupported()
        with self._cond:
            registered = self._set(eventSet).registered
            registered[found.index] = registered.get(found.index, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        with self._cond:
            deadline = time.monotonic() + timeoutms / 1000
            while True:
                self._enter("nvmlEventSetWait")
                event_set = self._set(eventSet)
                event = self._take(event_set)
                if event is not None:
                    return _event_data(self._cards[event.card].handle, event)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _nvml.NVMLError_Timeout()
                due = self._next_due()
                self._cond.wait(left if due is None else min(left, max(due, 0.001)))

    def _take(self, event_set: EventSet) -> Event | None:
        while event_set.cursor < len(self._events):
            event = self._events[event_set.cursor]
            event_set.cursor += 1
            if event_set.registered.get(event.card, 0) & event.kind:
                return event
        return None


def _process(pid: int, memory_mib: int | None, where: tuple[int, int] | None) -> Any:
    gi, ci = (ALL_INSTANCES, ALL_INSTANCES) if where is None else where
    return _nvml.nvmlFriendlyObject(
        {
            "pid": pid,
            "usedGpuMemory": None if memory_mib is None else memory_mib * MiB,
            "gpuInstanceId": gi,
            "computeInstanceId": ci,
        }
    )


def _utilization(pid: int, sm_percent: int, stamp: int) -> Any:
    sample = _nvml.c_nvmlProcessUtilizationSample_t()
    sample.pid, sample.timeStamp, sample.smUtil = pid, stamp, sm_percent
    sample.memUtil = sample.encUtil = sample.decUtil = 0
    return sample


def _event_data(handle: Any, event: Event) -> Any:
    return _nvml.nvmlFriendlyObject(
        {
            "device": ctypes.pointer(handle),
            "eventType": event.kind,
            "eventData": event.data,
            "gpuInstanceId": event.gi,
            "computeInstanceId": event.ci,
        }
    )
