"""A fake of the pynvml functions gpuledger calls, driven by a fleet node (see fleet_script.py).

``FakeNvml`` stands in for the ``pynvml`` module object: the same function names, argument
conventions and return shapes, with the quirks of the real binding (reference section C):

- errors are pynvml's own ``NVMLError_*`` classes, so ``except pynvml.NVMLError_NotSupported``
  works against either;
- handles are fresh ``c_nvmlDevice_t`` pointers on every call (compare them and you lose, as with
  the real library); structs are pynvml's own, so bytes stay bytes inside them (``pci.busId``);
- ``nvmlDeviceIsMigDeviceHandle`` returns a ``c_uint``; ``NVML_P2P_CAPS_INDEX_READ`` is the tuple
  ``(0,)`` and passing it fails like the raw ctypes call does;
- MIG queries on cards without MIG raise NotSupported; empty MIG slots raise NotFound;
- on NVSwitch systems every NVLink's remote device is a SWITCH and only the NVLink P2P status tells
  which GPUs are joined;
- ``nvmlEventSetWait`` blocks until an event or the timeout, then raises ``NVMLError_Timeout``.

Scripted faults fire on the fake's clock: a real monotonic clock by default, or a ``ManualClock``
that tests move with ``advance()`` (no sleeping). Tests can also inject faults directly.
"""

from __future__ import annotations

import ctypes
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fleet_script import FaultKind, FaultSpec, MigProfile, NodeScript, mig_profiles

MiB = 1024 * 1024
ALL_INSTANCES = 0xFFFFFFFF
XID_FALLEN_OFF_BUS = 79
_SWITCH_BUS_IDS = tuple(f"00000000:{b:02X}:00.0" for b in (0xC5, 0xC6, 0xC7, 0xC8))
_BASE_EVENTS = (
    _nvml.nvmlEventTypeXidCriticalError | _nvml.nvmlEventTypePState | _nvml.nvmlEventTypeClock
)
_ECC_EVENTS = _nvml.nvmlEventTypeSingleBitEccError | _nvml.nvmlEventTypeDoubleBitEccError


@dataclass(frozen=True, slots=True)
class Arch:
    key: str
    capability: tuple[int, int]
    nvlinks: int  # NVLink ports on the chip
    pci_device_id: int
    ecc: bool = True


_ARCHES = (
    Arch("H100", (9, 0), 18, 0x233010DE),
    Arch("H200", (9, 0), 18, 0x233510DE),
    Arch("A100-SXM4-40GB", (8, 0), 12, 0x20B010DE),
    Arch("A100-SXM4-80GB", (8, 0), 12, 0x20B210DE),
    Arch("A100-PCIE", (8, 0), 12, 0x20F110DE),
    Arch("V100", (7, 0), 6, 0x1DB510DE),
    Arch("RTX 3090", (8, 6), 4, 0x220410DE, ecc=False),
    Arch("P4", (6, 1), 0, 0x1BB310DE),
)
_DEFAULT_ARCH = Arch("", (8, 0), 0, 0x20B210DE)


def arch_of(model: str) -> Arch:
    return next((a for a in _ARCHES if a.key in model), _DEFAULT_ARCH)


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass(slots=True)
class _Mig:
    parent: int
    slot: int
    profile: MigProfile
    uuid: str
    handle: Any = field(default_factory=_nvml.struct_c_nvmlDevice_t)

    @property
    def gi(self) -> int:
        return self.slot + 1


@dataclass(slots=True)
class _Card:
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa: int | None
    bus_id: str
    arch: Arch
    links: list[tuple[int, str]]  # (remote device type, remote bus id) per active NVLink
    migs: list[_Mig] | None  # None: no MIG on this card; []: MIG capable, disabled
    processes: list[tuple[int, int | None, int | None]] = field(
        default_factory=list
    )  # pid, MiB, mig slot
    lost: bool = False
    events_supported: bool = True
    handle: Any = field(default_factory=_nvml.struct_c_nvmlDevice_t)


@dataclass(slots=True)
class _Event:
    card: int
    kind: int
    data: int
    gi: int = ALL_INSTANCES
    ci: int = ALL_INSTANCES


@dataclass(slots=True)
class _EventSet:
    cursor: int
    registered: dict[int, int] = field(default_factory=dict)  # card index -> mask
    handle: Any = field(default_factory=_nvml.struct_c_nvmlEventSet_t)


def _bus_id(index: int) -> str:
    return f"00000000:{0x1B + 0x12 * index:02X}:00.0"


def _pci(bus_id: str, device_id: int = 0) -> Any:
    info = _nvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id.encode()
    info.domain, bus, dev = 0, int(bus_id[9:11], 16), int(bus_id[12:14], 16)
    info.bus, info.device, info.pciDeviceId, info.pciSubSystemId = bus, dev, device_id, 0
    return info


class FakeNvml:
    """One node's NVML, as the ``pynvml`` module would present it."""

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
        self._events: list[_Event] = []
        self._sets: dict[int, _EventSet] = {}
        self.calls: dict[str, int] = {}
        self._cards = [self._build_card(i) for i in range(len(sim.node.cards))]
        self._links_for_cards()
        for p in sim.processes:
            self._cards[p.card].processes.append((p.pid, p.memory_mib, p.mig))

    # --- module surface that is not a function: constants and exception classes ----------------

    def __getattr__(self, name: str) -> Any:
        value = getattr(_nvml, name)
        is_error = isinstance(value, type) and issubclass(value, Exception)
        if is_error or not callable(value) or name == "nvmlExceptionClass":
            return value
        raise AttributeError(f"the fake NVML does not implement {name}")

    # --- building ------------------------------------------------------------------------------

    def _build_card(self, i: int) -> _Card:
        spec = self._sim.node.cards[i]
        layout = self._sim.layout(i)
        migs: list[_Mig] | None = None
        if mig_profiles(spec.model, spec.memory_mib) is not None:
            migs = []
            for slot, prof in enumerate(layout.instances if layout else ()):
                mig_uuid = f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, f'{spec.uuid}/{slot}')}"
                migs.append(_Mig(i, slot, prof, mig_uuid))
        arch = arch_of(spec.model)
        bus = spec.pci_bus_id or _bus_id(i)
        return _Card(i, spec.uuid, spec.model, spec.memory_mib, spec.numa, bus, arch, [], migs)

    def _links_for_cards(self) -> None:
        for link in self._sim.node.links:
            if link.nvlinks == 0:
                continue
            a, b = self._cards[link.a], self._cards[link.b]
            if self._sim.nvswitch:
                for card in (a, b):
                    while len(card.links) < link.nvlinks:
                        card.links.append(
                            (
                                _nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
                                _SWITCH_BUS_IDS[len(card.links) % 4],
                            )
                        )
                continue
            a.links.extend([(_nvml.NVML_NVLINK_DEVICE_TYPE_GPU, b.bus_id)] * link.nvlinks)
            b.links.extend([(_nvml.NVML_NVLINK_DEVICE_TYPE_GPU, a.bus_id)] * link.nvlinks)

    # --- test controls -------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move a ManualClock forward; faults that fall due fire now."""
        if not isinstance(self._clock, ManualClock):
            raise TypeError("advance() needs the fake to run on a ManualClock")
        with self._cond:
            self._clock.now += seconds
            self._fire_due()
            self._cond.notify_all()

    def inject_xid(self, card: int, xid: int, mig: int | None = None) -> None:
        gi = ALL_INSTANCES if mig is None else mig + 1
        self._push(
            _Event(card, _nvml.nvmlEventTypeXidCriticalError, xid, gi, 0 if mig is not None else gi)
        )

    def inject_ecc(self, card: int, double: bool = True) -> None:
        kind = (
            _nvml.nvmlEventTypeDoubleBitEccError if double else _nvml.nvmlEventTypeSingleBitEccError
        )
        self._push(_Event(card, kind, 0))

    def lose(self, card: int) -> None:
        with self._cond:
            self._cards[card].lost = True
            self._events.append(
                _Event(card, _nvml.nvmlEventTypeXidCriticalError, XID_FALLEN_OFF_BUS)
            )
            self._cond.notify_all()

    def set_nvml_down(self, down: bool) -> None:
        with self._cond:
            self._down_forced = down
            self._cond.notify_all()

    def set_processes(self, card: int, processes: list[tuple[int, int | None, int | None]]) -> None:
        with self._cond:
            self._cards[card].processes = list(processes)

    def set_events_supported(self, card: int, supported: bool) -> None:
        self._cards[card].events_supported = supported

    def numa_node(self, sysfs_bus_id: str) -> int | None:
        """What /sys/bus/pci/devices/<bus id>/numa_node says for this fake's cards."""
        card = next((c for c in self._cards if c.bus_id[4:].lower() == sysfs_bus_id), None)
        return None if card is None else card.numa

    def _push(self, event: _Event) -> None:
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
            self._events.append(
                _Event(fault.card, _nvml.nvmlEventTypeXidCriticalError, XID_FALLEN_OFF_BUS)
            )
        elif fault.kind is FaultKind.XID:
            gi = ALL_INSTANCES if fault.mig is None else fault.mig + 1
            ci = ALL_INSTANCES if fault.mig is None else 0
            self._events.append(
                _Event(fault.card, _nvml.nvmlEventTypeXidCriticalError, fault.xid or 0, gi, ci)
            )
        else:
            double = fault.kind is FaultKind.ECC_DOUBLE
            kind = (
                _nvml.nvmlEventTypeDoubleBitEccError
                if double
                else _nvml.nvmlEventTypeSingleBitEccError
            )
            self._events.append(_Event(fault.card, kind, 0))

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
        times += [
            f.until
            for f in self._sim.faults
            if f.kind is FaultKind.NVML_DOWN and f.until is not None
        ]
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

    def _resolve(self, handle: Any, argno: int = 1) -> _Card | _Mig:
        if not isinstance(handle, _nvml.c_nvmlDevice_t) or not handle:
            raise ctypes.ArgumentError(f"argument {argno}: TypeError: expected a c_nvmlDevice_t")
        address = ctypes.addressof(handle.contents)
        for card in self._cards:
            if ctypes.addressof(card.handle) == address:
                if card.lost:
                    raise _nvml.NVMLError_GpuIsLost()
                return card
            for mig in card.migs or ():
                if ctypes.addressof(mig.handle) == address:
                    if card.lost:
                        raise _nvml.NVMLError_GpuIsLost()
                    return mig
        raise _nvml.NVMLError_InvalidArgument()

    def _card(self, name: str, handle: Any) -> _Card:
        """A call that takes a physical device: MIG handles are refused."""
        with self._cond:
            self._enter(name)
            found = self._resolve(handle)
        if isinstance(found, _Mig):
            raise _nvml.NVMLError_InvalidArgument()
        return found

    def _pair(self, name: str, device1: Any, device2: Any) -> tuple[_Card, _Card]:
        with self._cond:
            self._enter(name)
            a, b = self._resolve(device1), self._resolve(device2, 2)
        if isinstance(a, _Mig) or isinstance(b, _Mig):
            raise _nvml.NVMLError_InvalidArgument()
        return a, b

    def _any(self, name: str, handle: Any) -> _Card | _Mig:
        with self._cond:
            self._enter(name)
            return self._resolve(handle)

    # --- library -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._cond:
            self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
            if self._down():
                raise _nvml.NVMLError_DriverNotLoaded()
            self._refs += 1

    def nvmlShutdown(self) -> None:
        with self._cond:
            if self._refs == 0:
                raise _nvml.NVMLError_Uninitialized()
            self._refs -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._cond:
            self._enter("nvmlSystemGetDriverVersion")
        return self._driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        with self._cond:
            self._enter("nvmlSystemGetCudaDriverVersion")
        return self._cuda

    def nvmlDeviceGetCount(self) -> int:
        with self._cond:
            self._enter("nvmlDeviceGetCount")
        return len(self._cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        with self._cond:
            self._enter("nvmlDeviceGetHandleByIndex")
            if not 0 <= index < len(self._cards):
                raise _nvml.NVMLError_InvalidArgument()
            card = self._cards[index]
            if card.lost:
                raise _nvml.NVMLError_GpuIsLost()
            return ctypes.pointer(card.handle)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._card("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._card("nvmlDeviceGetMinorNumber", handle).index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._any("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._card("nvmlDeviceGetName", handle).model

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._card("nvmlDeviceGetCudaComputeCapability", handle).arch.capability

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        card = self._card("nvmlDeviceGetPciInfo", handle)
        return _pci(card.bus_id, card.arch.pci_device_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        found = self._any("nvmlDeviceGetMemoryInfo", handle)
        if isinstance(found, _Mig):
            card = self._cards[found.parent]
            total = found.profile.memory_mib
            used = sum(m or 0 for _, m, s in card.processes if s == found.slot)
        else:
            total = found.memory_mib
            used = sum(m or 0 for _, m, _ in found.processes)
        memory = _nvml.c_nvmlMemory_v2_t() if version else _nvml.c_nvmlMemory_t()
        if version:
            memory.version, memory.reserved = version, 512 * MiB
        memory.total, memory.used, memory.free = total * MiB, used * MiB, (total - used) * MiB
        return memory

    # --- topology ------------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a, b = self._pair("nvmlDeviceGetTopologyCommonAncestor", device1, device2)
        if a is b:
            return int(_nvml.NVML_TOPOLOGY_INTERNAL)
        return int(self._sim.node.link(a.index, b.index).pcie)

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: Any) -> int:
        if not isinstance(p2pIndex, int):
            raise ctypes.ArgumentError(
                "argument 3: TypeError: Don't know how to convert parameter 3"
            )
        a, b = self._pair("nvmlDeviceGetP2PStatus", device1, device2)
        link = self._sim.node.link(a.index, b.index)
        if p2pIndex == _nvml.NVML_P2P_CAPS_INDEX_NVLINK:
            ok = link.nvlinks > 0
        else:
            ok = link.nvlinks > 0 or link.pcie <= _nvml.NVML_TOPOLOGY_NODE
        return int(_nvml.NVML_P2P_STATUS_OK if ok else _nvml.NVML_P2P_STATUS_NOT_SUPPORTED)

    def _port(self, name: str, handle: Any, link: int) -> tuple[_Card, bool]:
        card = self._card(name, handle)
        if card.arch.nvlinks == 0 and not card.links:
            raise _nvml.NVMLError_NotSupported()
        if not 0 <= link < max(card.arch.nvlinks, len(card.links)):
            raise _nvml.NVMLError_InvalidArgument()
        return card, link < len(card.links)

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        _, active = self._port("nvmlDeviceGetNvLinkState", device, link)
        return int(_nvml.NVML_FEATURE_ENABLED if active else _nvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        card, active = self._port("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if not active:
            raise _nvml.NVMLError_NotSupported()
        return card.links[link][0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        card, active = self._port("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        if not active:
            raise _nvml.NVMLError_NotSupported()
        return _pci(card.links[link][1])

    # --- MIG -----------------------------------------------------------------------------------

    def _mig_card(self, name: str, handle: Any) -> tuple[_Card, list[_Mig]]:
        card = self._card(name, handle)
        if card.migs is None:
            raise _nvml.NVMLError_NotSupported()
        return card, card.migs

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        _, migs = self._mig_card("nvmlDeviceGetMigMode", device)
        mode = _nvml.NVML_DEVICE_MIG_ENABLE if migs else _nvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        _, migs = self._mig_card("nvmlDeviceGetMaxMigDeviceCount", device)
        return 7 if migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        _, migs = self._mig_card("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not 0 <= index < (7 if migs else 0):
            raise _nvml.NVMLError_InvalidArgument()
        if index >= len(migs):
            raise _nvml.NVMLError_NotFound()
        return ctypes.pointer(migs[index].handle)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> ctypes.c_uint:
        return ctypes.c_uint(
            int(isinstance(self._any("nvmlDeviceIsMigDeviceHandle", device), _Mig))
        )

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        found = self._any("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        if not isinstance(found, _Mig):
            raise _nvml.NVMLError_InvalidArgument()
        return ctypes.pointer(self._cards[found.parent].handle)

    def _mig(self, name: str, device: Any) -> _Mig:
        found = self._any(name, device)
        if not isinstance(found, _Mig):
            raise _nvml.NVMLError_InvalidArgument()
        return found

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", device).gi

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        self._mig("nvmlDeviceGetComputeInstanceId", device)
        return 0

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        mig = self._mig("nvmlDeviceGetAttributes", device)
        attrs = _nvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = mig.profile.multiprocessors
        attrs.gpuInstanceSliceCount = attrs.computeInstanceSliceCount = mig.profile.slices
        attrs.memorySizeMB = mig.profile.memory_mib
        return attrs

    # --- processes -----------------------------------------------------------------------------

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        found = self._any("nvmlDeviceGetComputeRunningProcesses", handle)
        card = self._cards[found.parent] if isinstance(found, _Mig) else found
        rows = [p for p in card.processes if not isinstance(found, _Mig) or p[2] == found.slot]
        return [_process(pid, mem, slot) for pid, mem, slot in rows]

    # --- events --------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        with self._cond:
            self._enter("nvmlEventSetCreate")
            event_set = _EventSet(len(self._events))
            self._sets[ctypes.addressof(event_set.handle)] = event_set
            return ctypes.pointer(event_set.handle)

    def _set(self, event_set: Any) -> _EventSet:
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

    def _supported(self, card: _Card) -> int:
        if not card.events_supported:
            raise _nvml.NVMLError_NotSupported()
        mask = _BASE_EVENTS | (_ECC_EVENTS if card.arch.ecc else 0)
        return int(mask | (_nvml.nvmlEventMigConfigChange if card.migs is not None else 0))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._supported(self._card("nvmlDeviceGetSupportedEventTypes", handle))

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        found = self._any("nvmlDeviceRegisterEvents", handle)
        if isinstance(found, _Mig) or eventTypes & ~self._supported(found):
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

    def _take(self, event_set: _EventSet) -> _Event | None:
        while event_set.cursor < len(self._events):
            event = self._events[event_set.cursor]
            event_set.cursor += 1
            if event_set.registered.get(event.card, 0) & event.kind:
                return event
        return None


def _process(pid: int, memory_mib: int | None, slot: int | None) -> Any:
    gi = ALL_INSTANCES if slot is None else slot + 1
    return _nvml.nvmlFriendlyObject(
        {
            "pid": pid,
            "usedGpuMemory": None if memory_mib is None else memory_mib * MiB,
            "gpuInstanceId": gi,
            "computeInstanceId": ALL_INSTANCES if slot is None else 0,
        }
    )


def _event_data(handle: Any, event: _Event) -> Any:
    return _nvml.nvmlFriendlyObject(
        {
            "device": ctypes.pointer(handle),
            "eventType": event.kind,
            "eventData": event.data,
            "gpuInstanceId": event.gi,
            "computeInstanceId": event.ci,
        }
    )
