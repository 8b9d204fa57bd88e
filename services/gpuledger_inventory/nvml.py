"""The NVML adapter: the one module that talks to pynvml, behind the small ``Gpus`` protocol.

Everything NVML returns is converted here, once, into the values of ``inventory.py``. The module
object is injected (``NvmlGpus(pynvml)`` or ``NvmlGpus(FakeNvml(...))``) so the same code runs on a
GPU and against the fake. All methods block; the service calls them from worker threads.

Error handling, by what the caller should do:
- NotSupported / FunctionNotFound / NoPermission on a query: that value is unknown (None);
- GpuIsLost: that card is lost (health), the rest of the node goes on;
- any other NVML error: ``NvmlUnavailable`` - NVML itself failed; every card turns unhealthy and
  the service re-initialises NVML with backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from gpuledger_core.errors import Unavailable
from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Card, PcieLevel
from gpuledger_inventory.inventory import (
    CardInfo,
    CardUsage,
    EventKind,
    GpuEvent,
    GpuInstance,
    GpuProcess,
    MigInstance,
    MigMode,
    Scan,
    Usage,
    cuda_version_text,
)
from gpuledger_inventory.mig_config import gpu_instances
from gpuledger_inventory.topology import (
    Pair,
    build_links,
    count_direct,
    count_switched,
    pairs,
    pcie_level,
    sysfs_bus_id,
)

log = logging.getLogger(__name__)

MiB = 1024 * 1024
ALL_INSTANCES = 0xFFFFFFFF
XID_CRITICAL, ECC_SINGLE, ECC_DOUBLE, MIG_CONFIG = 0x8, 0x1, 0x2, 0x100
HEALTH_EVENTS = XID_CRITICAL | ECC_DOUBLE | ECC_SINGLE | MIG_CONFIG


class NvmlUnavailable(Unavailable):
    """NVML itself failed (not loaded, not initialised, driver gone): retry later."""


class CardLost(Exception):
    """The card answered GpuIsLost: it fell off the bus."""


class _Unknown(Exception):
    """The value is not available on this card or driver."""


class Gpus(Protocol):
    """The port the service uses; ``NvmlGpus`` is the only implementation."""

    backend: str

    def open(self) -> None: ...
    def close(self) -> None: ...
    def scan(self) -> Scan: ...
    def usage(self, scan: Scan) -> Usage: ...
    def watch(self, scan: Scan) -> dict[CardUuid, str]: ...
    def wait(self, timeout_ms: int) -> GpuEvent | None: ...
    def check(self, uuid: CardUuid, reset: bool) -> tuple[str, ...]: ...


def sysfs_numa_node(bus_id: str, root: Path = Path("/sys")) -> int | None:
    """The NUMA node of a PCI device from sysfs (``bus_id`` as sysfs names it); -1 means none."""
    try:
        text = (root / "bus/pci/devices" / bus_id / "numa_node").read_text().strip()
        value = int(text)
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def load_pynvml() -> Any:
    import pynvml  # the only import of pynvml in gpuledger

    return pynvml


class NvmlGpus:
    def __init__(
        self,
        nvml: Any,
        numa_of: Callable[[str], int | None] = sysfs_numa_node,
        backend: str = "nvml",
    ) -> None:
        self._nvml, self._numa_of, self.backend = nvml, numa_of, backend
        self._open = False
        self._handles: dict[int, Any] = {}
        self._mig_handles: dict[int, list[tuple[str, Any]]] = {}
        self._sampled: dict[int, int] = {}  # card index -> the newest utilization sample read (us)
        self._scan = Scan(())
        self._events: Any = None
        self._wait_lock = threading.Lock()
        self._scan_lock = threading.Lock()

    @property
    def nvml(self) -> Any:
        """The module object NVML is called through (pynvml, or the fake)."""
        return self._nvml

    # --- calling NVML --------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> Any:
        nv = self._nvml
        try:
            return getattr(nv, name)(*args)
        except (
            nv.NVMLError_NotSupported,
            nv.NVMLError_FunctionNotFound,
            nv.NVMLError_NoPermission,
        ) as err:
            raise _Unknown(name) from err
        except nv.NVMLError_GpuIsLost as err:
            raise CardLost(name) from err
        except (nv.NVMLError_InvalidArgument, nv.NVMLError_NotFound, nv.NVMLError_Timeout):
            raise
        except nv.NVMLError as err:
            raise NvmlUnavailable(f"NVML failed in {name}: {err}") from err

    def _maybe(self, name: str, *args: Any) -> Any:
        try:
            return self._call(name, *args)
        except (_Unknown, self._nvml.NVMLError_InvalidArgument, self._nvml.NVMLError_NotFound):
            return None

    # --- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        if self._open:
            return
        try:
            self._nvml.nvmlInit()
        except Exception as err:  # NVMLError, or the library cannot even be loaded
            raise NvmlUnavailable(f"cannot initialise NVML: {err}") from err
        self._open = True

    def close(self) -> None:
        with self._wait_lock:
            self._free_events()
            if self._open:
                self._open = False
                try:
                    self._nvml.nvmlShutdown()
                except Exception as err:
                    log.debug("nvmlShutdown: %s", err)

    # --- scan ----------------------------------------------------------------------------------

    def scan(self) -> Scan:
        with self._scan_lock:  # the NVML loop's scan and a MIG change's may come at once
            return self._scan_now()

    def _scan_now(self) -> Scan:
        start = time.perf_counter()
        driver = self._maybe("nvmlSystemGetDriverVersion")
        cuda = self._maybe("nvmlSystemGetCudaDriverVersion")
        handles: dict[int, Any] = {}
        cards: list[CardInfo] = []
        remotes: dict[int, list[str]] = {}
        switch: dict[int, int] = {}
        lost: list[int] = []
        problems: list[str] = []
        self._mig_handles = {}
        for i in range(self._call("nvmlDeviceGetCount")):
            try:
                handle = self._call("nvmlDeviceGetHandleByIndex", i)
                info, remotes[i], switch[i] = self._read_card(i, handle, problems)
            except (CardLost, _Unknown, self._nvml.NVMLError_InvalidArgument) as err:
                lost.append(i)
                problems.append(f"card {i}: {type(err.__cause__ or err).__name__}")
                continue
            handles[i] = handle
            cards.append(info)
        links = self._links(handles, cards, remotes, switch)
        self._handles = handles
        self._scan = Scan(
            tuple(cards),
            links,
            driver,
            None if cuda is None else cuda_version_text(cuda),
            tuple(lost),
            tuple(problems),
            time.perf_counter() - start,
        )
        return self._scan

    def _read_card(self, i: int, h: Any, problems: list[str]) -> tuple[CardInfo, list[str], int]:
        uuid = CardUuid(self._call("nvmlDeviceGetUUID", h))
        index = self._maybe("nvmlDeviceGetIndex", h)
        pci = self._maybe("nvmlDeviceGetPciInfo", h)
        bus = _text(pci.busId) if pci is not None else ""
        mode, pending = self._mig_mode(h)
        mig = self._mig_instances(i, h) if mode is MigMode.ENABLED else ()
        gis = self._gpu_instances(i, h, problems) if mode is MigMode.ENABLED else ()
        memory = self._maybe("nvmlDeviceGetMemoryInfo", h)
        memory_mib = memory.total // MiB if memory is not None else sum(m.memory_mib or 0 for m in mig)
        if memory is None:
            problems.append(f"card {i}: memory size unknown")
        card = Card(
            uuid=uuid,
            index=i if index is None else index,
            model=self._maybe("nvmlDeviceGetName", h) or "unknown",
            memory_mib=memory_mib,
            numa=self._numa_of(sysfs_bus_id(bus)) if bus else None,
            minor=self._maybe("nvmlDeviceGetMinorNumber", h),
            pci_bus_id=bus,
        )
        capability = self._maybe("nvmlDeviceGetCudaComputeCapability", h)
        gpu_remotes, switch_links = self._nvlinks(h)
        cc = (int(capability[0]), int(capability[1])) if capability is not None else None
        return CardInfo(card, cc, mode, pending, mig, switch_links, gis), gpu_remotes, switch_links

    def _gpu_instances(self, i: int, h: Any, problems: list[str]) -> tuple[GpuInstance, ...] | None:
        """The GPU instances of a card in MIG mode (``mig_config``); None, and a problem, where
        NVML does not list them."""
        try:
            return gpu_instances(self._nvml, h)
        except self._nvml.NVMLError as err:
            problems.append(f"card {i}: its MIG GPU instances cannot be read: {err}")
            return None

    def _mig_mode(self, h: Any) -> tuple[MigMode, MigMode]:
        try:
            current, pending = self._call("nvmlDeviceGetMigMode", h)
        except _Unknown:
            return MigMode.DISABLED, MigMode.DISABLED  # no MIG on this card, as go-nvlib reads it
        except (self._nvml.NVMLError_InvalidArgument, self._nvml.NVMLError_NotFound):
            return MigMode.UNKNOWN, MigMode.UNKNOWN
        return _mig_mode(current), _mig_mode(pending)

    def _mig_instances(self, i: int, h: Any) -> tuple[MigInstance, ...]:
        found: list[MigInstance] = []
        handles: list[tuple[str, Any]] = []
        for slot in range(self._maybe("nvmlDeviceGetMaxMigDeviceCount", h) or 0):
            mh = self._maybe("nvmlDeviceGetMigDeviceHandleByIndex", h, slot)
            if mh is None or not bool(self._maybe("nvmlDeviceIsMigDeviceHandle", mh)):
                continue  # an empty slot
            uuid = self._call("nvmlDeviceGetUUID", mh)
            gi = self._maybe("nvmlDeviceGetGpuInstanceId", mh)
            ci = self._maybe("nvmlDeviceGetComputeInstanceId", mh)
            attrs = self._maybe("nvmlDeviceGetAttributes", mh)
            found.append(
                MigInstance(
                    uuid,
                    -1 if gi is None else gi,
                    -1 if ci is None else ci,
                    None if attrs is None else int(attrs.memorySizeMB),
                    None if attrs is None else int(attrs.gpuInstanceSliceCount),
                    None if attrs is None else int(attrs.multiprocessorCount),
                )
            )
            handles.append((uuid, mh))
        self._mig_handles[i] = handles
        return tuple(found)

    def _nvlinks(self, h: Any) -> tuple[list[str], int]:
        """Remote bus ids of active links that end at a GPU; the count of those at a switch."""
        nv = self._nvml
        gpu_remotes: list[str] = []
        switch = 0
        for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
            if self._maybe("nvmlDeviceGetNvLinkState", h, link) != nv.NVML_FEATURE_ENABLED:
                continue
            kind = self._maybe("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            if kind == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch += 1
            elif kind in (None, nv.NVML_NVLINK_DEVICE_TYPE_GPU):  # None: a driver too old to say
                remote = self._maybe("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
                if remote is not None:
                    gpu_remotes.append(_text(remote.busId))
        return gpu_remotes, switch

    def _links(
        self,
        handles: dict[int, Any],
        cards: list[CardInfo],
        remotes: dict[int, list[str]],
        switch: dict[int, int],
    ) -> tuple[Any, ...]:
        nv = self._nvml
        pcie: dict[Pair, PcieLevel] = {}
        for a, b in pairs(list(handles)):
            pcie[(a, b)] = pcie_level(self._maybe("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b]))
        bus_ids = {c.card.index: c.card.pci_bus_id for c in cards if c.card.pci_bus_id}
        nvlinks = count_direct(remotes, bus_ids)
        joined: set[Pair] = set()
        for a, b in pairs([i for i in handles if switch.get(i)]):
            # NVML_P2P_CAPS_INDEX_NVLINK is 2; pass plain ints (pynvml's READ constant is a tuple)
            status = self._maybe("nvmlDeviceGetP2PStatus", handles[a], handles[b], int(nv.NVML_P2P_CAPS_INDEX_NVLINK))
            if status == nv.NVML_P2P_STATUS_OK:
                joined.add((a, b))
        nvlinks.update(count_switched(switch, joined))
        return build_links(sorted(handles), pcie, nvlinks)

    # --- usage ---------------------------------------------------------------------------------

    def usage(self, scan: Scan) -> Usage:
        return Usage(tuple(self._card_usage(info) for info in scan.cards if info.card.index in self._handles))

    def _card_usage(self, info: CardInfo) -> CardUsage:
        h = self._handles[info.card.index]
        try:
            memory = self._maybe("nvmlDeviceGetMemoryInfo", h)
            targets: list[tuple[str | None, Any]] = [*self._mig_handles.get(info.card.index, [])] or [(None, h)]
            processes = tuple(p for mig_uuid, target in targets for p in self._processes(target, mig_uuid))
            sm = None if info.card.index in self._mig_handles else self._sm_percent(info.card.index, h)
        except CardLost:
            return CardUsage(info.uuid, lost=True)
        used = None if memory is None else int(memory.used) // MiB
        if sm is not None:
            processes = tuple(replace(p, sm_percent=sm.get(p.pid, 0)) for p in processes)
        return CardUsage(info.uuid, used, processes)

    def _sm_percent(self, index: int, h: Any) -> dict[int, int] | None:
        """Each process's mean share of the card's SM time in the samples since the last poll, in
        percent (``nvmlDeviceGetProcessUtilization``); a process in none used no SM time. None where
        the card or driver does not sample processes (and on a card in MIG mode, which NVML does
        not sample per instance)."""
        since = self._sampled.get(index, 0)
        try:
            samples = self._call("nvmlDeviceGetProcessUtilization", h, since)
        except self._nvml.NVMLError_NotFound:  # no sample since: nothing ran on the SMs
            return {}
        except (_Unknown, self._nvml.NVMLError_InvalidArgument):
            return None
        by_pid: dict[int, list[int]] = {}
        for sample in samples:
            by_pid.setdefault(int(sample.pid), []).append(int(sample.smUtil))
            since = max(since, int(sample.timeStamp))
        self._sampled[index] = since
        return {pid: round(sum(sm) / len(sm)) for pid, sm in by_pid.items()}

    def _processes(self, h: Any, mig_uuid: str | None) -> tuple[GpuProcess, ...]:
        try:
            rows = self._call("nvmlDeviceGetComputeRunningProcesses", h)
        except self._nvml.NVMLLibraryMismatchError:
            rows = self._maybe("nvmlDeviceGetComputeRunningProcesses_v2", h) or []
        except (_Unknown, self._nvml.NVMLError_InvalidArgument, self._nvml.NVMLError_NotFound):
            return ()
        return tuple(
            GpuProcess(
                int(p.pid),
                None if p.usedGpuMemory is None else int(p.usedGpuMemory) // MiB,
                mig_uuid,
            )
            for p in rows
        )

    # --- health events -------------------------------------------------------------------------

    def watch(self, scan: Scan) -> dict[CardUuid, str]:
        """Register the health events on every card; return the cards whose registration failed."""
        with self._wait_lock:
            self._free_events()
            self._events = self._call("nvmlEventSetCreate")
            failed: dict[CardUuid, str] = {}
            for info in scan.cards:
                problem = self._register(self._handles[info.card.index])
                if problem:
                    failed[info.uuid] = problem
            return failed

    def _register(self, h: Any) -> str:
        try:
            mask = HEALTH_EVENTS & int(self._call("nvmlDeviceGetSupportedEventTypes", h))
            if mask:
                self._call("nvmlDeviceRegisterEvents", h, mask, self._events)
        except _Unknown:
            return ""  # this card cannot report events: nothing to watch, nothing wrong
        except CardLost:
            return "gpu is lost"
        except self._nvml.NVMLError as err:
            return f"health event registration failed: {err}"
        return ""

    def _free_events(self) -> None:
        if self._events is not None:
            try:
                self._nvml.nvmlEventSetFree(self._events)
            except Exception as err:
                log.debug("nvmlEventSetFree: %s", err)
            self._events = None

    # --- a card's check, after its repair --------------------------------------------------------

    def check(self, uuid: CardUuid, reset: bool) -> tuple[str, ...]:
        """What is wrong with the card as NVML sees it (nothing: it passes): it must answer and
        have no row remapping failure; once ``reset``, no page retirement or row remap pending
        either (a reset applies them; before one they are expected). A query the card does not
        support is skipped (rows are remapped from Ampere on, pages retired before)."""
        try:
            h = self._call("nvmlDeviceGetHandleByUUID", uuid)
            self._call("nvmlDeviceGetMemoryInfo", h)
        except CardLost:
            return ("NVML says the card is lost",)
        except (_Unknown, self._nvml.NVMLError_InvalidArgument, self._nvml.NVMLError_NotFound) as err:
            return (f"NVML does not answer for the card ({type(err.__cause__ or err).__name__})",)
        problems: list[str] = []
        pages = self._maybe("nvmlDeviceGetRetiredPagesPendingStatus", h) if reset else None
        if pages == self._nvml.NVML_FEATURE_ENABLED:
            problems.append("a page retirement is pending")
        rows = self._maybe("nvmlDeviceGetRemappedRows", h)
        if rows is not None and rows[3]:
            problems.append("row remapping failed")
        if reset and rows is not None and rows[2]:
            problems.append("a row remap is pending")
        return tuple(problems)

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        nv = self._nvml
        with self._wait_lock:
            if self._events is None:
                raise NvmlUnavailable("no health events are registered")
            try:
                data = nv.nvmlEventSetWait(self._events, timeout_ms)
            except nv.NVMLError_Timeout:
                return None
            except nv.NVMLError as err:
                raise NvmlUnavailable(f"waiting for health events failed: {err}") from err
            return self._event(data)

    def _event(self, data: Any) -> GpuEvent:
        kind = _event_kind(int(data.eventType))
        try:
            uuid: CardUuid | None = CardUuid(self._nvml.nvmlDeviceGetUUID(data.device))
        except self._nvml.NVMLError:
            uuid = None
        xid = int(data.eventData) if kind is EventKind.XID else None
        mig_uuid = None
        gi = int(data.gpuInstanceId)
        info = self._scan.by_uuid(uuid) if uuid else None
        if info is not None and gi != ALL_INSTANCES:
            mig_uuid = next((m.uuid for m in info.mig if m.gpu_instance == gi), None)
        return GpuEvent(kind, uuid, xid, mig_uuid)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _mig_mode(raw: int) -> MigMode:
    return MigMode.ENABLED if raw == 1 else MigMode.DISABLED


def _event_kind(raw: int) -> EventKind:
    if raw & XID_CRITICAL:
        return EventKind.XID
    if raw & ECC_DOUBLE:
        return EventKind.ECC_DOUBLE
    if raw & ECC_SINGLE:
        return EventKind.ECC_SINGLE
    if raw & MIG_CONFIG:
        return EventKind.MIG_CHANGE
    return EventKind.OTHER
