"""What a fleet file says about a simulated node beyond its cards: MIG layout, processes, faults.

``gpuledger_dev.fleet`` passes the node keys ``mig``, ``processes`` and ``faults`` through raw;
this module validates them (errors name the file, line and field) and turns them into values the
fake NVML runs from. Format: docs/fleet-file.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuledger_common.profiles import PROFILES
from gpuledger_core.mig_layout import LayoutError, place_all
from gpuledger_core.mig_profiles import GiProfile, default_layout, mig_model
from gpuledger_core.model import Node
from gpuledger_dev.fleet import Fleet, FleetNode, _Cursor, _Lined


class FaultKind(StrEnum):
    XID = "xid"  # an XidCriticalError event with the given XID
    ECC_DOUBLE = "ecc_double"  # a DoubleBitEccError event
    ECC_SINGLE = "ecc_single"  # a SingleBitEccError event
    LOST = "lost"  # the card falls off the bus: XID 79, then GpuIsLost on every call
    NVML_DOWN = "nvml_down"  # NVML itself fails from ``at`` until ``until`` (for ever without it)
    REMAP_PENDING = "remap_pending"  # a double-bit ECC event; a row remap pending until a reset
    REMAP_FAILURE = "remap_failure"  # a double-bit ECC event; row remapping failed (a reset keeps it)
    PAGES_PENDING = "pages_pending"  # a double-bit ECC event; a page retirement pending until a reset


class ResetResult(StrEnum):
    """How one scripted reset of a card ends (``nvidia-smi --gpu-reset`` on the fake)."""

    OK = "ok"
    FAIL = "fail"
    HANG = "hang"  # never ends: the caller must cut it off
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True, slots=True)
class ResetSpec:
    card: int
    result: ResetResult = ResetResult.OK
    seconds: float = 0.5  # how long it takes
    returns: bool = True  # a lost card is back on the bus after it


@dataclass(frozen=True, slots=True)
class MigLayout:
    card: int
    instances: tuple[GiProfile, ...]
    starts: tuple[int, ...]  # each instance's placement, as the driver would choose it


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    card: int
    pid: int
    memory_mib: int | None = None  # None: NVML cannot tell (usedGpuMemory is None)
    mig: int | None = None  # index into that card's MIG instances


@dataclass(frozen=True, slots=True)
class FaultSpec:
    kind: FaultKind
    at: float  # seconds after the fake NVML was created
    card: int | None = None
    xid: int | None = None
    until: float | None = None
    mig: int | None = None  # for an XID inside one MIG instance


@dataclass(frozen=True, slots=True)
class NodeScript:
    node: Node
    nvswitch: bool = False
    mig: tuple[MigLayout, ...] = ()
    processes: tuple[ProcessSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    resets: tuple[ResetSpec, ...] = ()  # per card, in order: its first reset, its second, ...

    def layout(self, card: int) -> MigLayout | None:
        return next((m for m in self.mig if m.card == card), None)


def simulate(fleet: Fleet) -> dict[str, NodeScript]:
    """Validate every node's simulation keys; the first problem raises ``FleetError``."""
    return {n.node.name: node_script(fleet, n) for n in fleet.nodes}


def node_script(fleet: Fleet, fleet_node: FleetNode | str) -> NodeScript:
    fn = fleet.node(fleet_node) if isinstance(fleet_node, str) else fleet_node
    raw = _Lined(fn.line)
    raw.update(fn.extra)
    raw.lines.update(getattr(fn.extra, "lines", {}))
    for key, value in fn.extra.items():
        raw.lines[key] = getattr(value, "line", fn.line)
    c = _Cursor(fleet.path, raw, f"nodes[{fleet.nodes.index(fn)}]", fn.line)
    profile = PROFILES[fn.profile]() if fn.profile else None
    node = fn.node
    mig = _mig(c, node)
    if not mig and profile is not None and profile.mig:
        defaults = (_default_layout(node, i) for i in range(len(node.cards)))
        mig = tuple(m for m in defaults if m is not None)
    processes = tuple(_process(p, node, mig) for p in _items(c, "processes"))
    faults = tuple(_fault(f, node, mig) for f in _items(c, "faults"))
    resets = tuple(_reset(r, node) for r in _items(c, "resets"))
    return NodeScript(node, bool(profile and profile.nvswitch), mig, processes, faults, resets)


def _items(c: _Cursor, key: str) -> list[_Cursor]:
    value = c.raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise c.fail(key, f"must be a list, got {value!r}")
    line = getattr(value, "line", c.raw.lines.get(key, c.line))
    return [_Cursor(c.path, v, f"{c._name(key)}[{i}]", line) for i, v in enumerate(value)]


def _card_index(c: _Cursor, node: Node, key: str = "card") -> int:
    index: int = c.count(key)
    if index >= len(node.cards):
        raise c.fail(key, f"card {index} does not exist (the node has {len(node.cards)} cards)")
    return index


def _default_layout(node: Node, index: int) -> MigLayout | None:
    card = node.cards[index]
    model = mig_model(card.model, card.memory_mib)
    if model is None:
        return None
    instances = default_layout(model)
    return MigLayout(index, instances, tuple(place_all(model, instances)))


def _mig(c: _Cursor, node: Node) -> tuple[MigLayout, ...]:
    layouts: list[MigLayout] = []
    for mc in _items(c, "mig"):
        mc.check_keys({"card", "instances"})
        index = _card_index(mc, node)
        if any(m.card == index for m in layouts):
            raise mc.fail("card", f"card {index} is partitioned twice")
        card = node.cards[index]
        model = mig_model(card.model, card.memory_mib)
        if model is None:
            raise mc.fail("card", f"{card.model} has no MIG")
        names = mc.get("instances", list)
        found = [model.by_name(n) for n in names]
        if any(p is None for p in found):
            offered = ", ".join(p.name for p in model.profiles)
            raise mc.fail("instances", f"must be a list of {offered}, got {names!r}")
        instances = tuple(p for p in found if p is not None)
        try:
            starts = place_all(model, instances)
        except LayoutError as err:
            raise mc.fail("instances", str(err)) from err
        layouts.append(MigLayout(index, instances, tuple(starts)))
    return tuple(layouts)


def _mig_index(c: _Cursor, card: int, mig: tuple[MigLayout, ...]) -> int | None:
    index: int | None = c.get("mig", int, None)
    if index is None:
        return None
    layout = next((m for m in mig if m.card == card), None)
    if layout is None:
        raise c.fail("mig", f"card {card} is not partitioned")
    if not 0 <= index < len(layout.instances):
        raise c.fail("mig", f"card {card} has MIG instances 0..{len(layout.instances) - 1}")
    return index


def _process(c: _Cursor, node: Node, mig: tuple[MigLayout, ...]) -> ProcessSpec:
    c.check_keys({"card", "pid", "memory_mib", "mig"})
    card = _card_index(c, node)
    pid = c.count("pid")
    if pid == 0:
        raise c.fail("pid", "must be positive")
    memory: int | None = c.count("memory_mib", None)
    if memory is not None and memory > node.cards[card].memory_mib:
        raise c.fail("memory_mib", f"exceeds the card's {node.cards[card].memory_mib} MiB")
    return ProcessSpec(card, pid, memory, _mig_index(c, card, mig))


_FAULT_KEYS = {"kind", "at", "card", "xid", "until", "mig"}


def _fault(c: _Cursor, node: Node, mig: tuple[MigLayout, ...]) -> FaultSpec:
    c.check_keys(_FAULT_KEYS)
    raw_kind = c.get("kind", str, "xid")
    try:
        kind = FaultKind(raw_kind)
    except ValueError:
        raise c.fail(
            "kind", f"must be one of {', '.join(k.value for k in FaultKind)}, got {raw_kind!r}"
        ) from None
    at = _seconds(c, "at", 0.0)
    if kind is FaultKind.NVML_DOWN:
        _forbid(c, kind, ("card", "xid", "mig"))
        until = _seconds(c, "until", None)
        if until is not None and until <= at:
            raise c.fail("until", f"must be after at ({at:g}), got {until:g}")
        return FaultSpec(kind, at, until=until)
    _forbid(c, kind, ("until",))
    card = _card_index(c, node)
    if kind is not FaultKind.XID:
        _forbid(c, kind, ("xid", "mig"))
        return FaultSpec(kind, at, card)
    xid = c.count("xid")
    if xid == 0:
        raise c.fail("xid", "must be positive")
    return FaultSpec(kind, at, card, xid, mig=_mig_index(c, card, mig))


def _reset(c: _Cursor, node: Node) -> ResetSpec:
    c.check_keys({"card", "result", "seconds", "returns"})
    card = _card_index(c, node)
    raw = c.get("result", str, "ok")
    try:
        result = ResetResult(raw)
    except ValueError:
        choices = ", ".join(r.value for r in ResetResult)
        raise c.fail("result", f"must be one of {choices}, got {raw!r}") from None
    returns = c.get("returns", bool, True)
    return ResetSpec(card, result, _seconds(c, "seconds", 0.5), returns)


def _forbid(c: _Cursor, kind: FaultKind, keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in c.raw:
            raise c.fail(key, f"does not apply to a {kind.value} fault")


def _seconds(c: _Cursor, key: str, default: Any) -> Any:
    value = c.get(key, (int, float), default)
    if isinstance(value, bool):
        raise c.fail(key, f"must be a number of seconds, got {value!r}")
    if value is not None and value < 0:
        raise c.fail(key, f"must not be negative, got {value}")
    return None if value is None else float(value)
