"""The fleet file: a YAML description of simulated nodes, their cards and links.

Used by the fake NVML backend, the tests and the local stack. A malformed file is rejected with
``FleetError`` naming the file, the line and the field. Format: docs/fleet-file.md.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuledger_common.profiles import PROFILES, CardSpec, Profile
from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.model import Card, Link, Node, PcieLevel

NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
_UUID_NAMESPACE = uuid.UUID("6b1f3c52-5a0e-4b8e-9a43-3f2b8f7e0c11")
PCIE_NAMES = {
    "BOARD": PcieLevel.SAME_BOARD,
    "PIX": PcieLevel.SINGLE_SWITCH,
    "PXB": PcieLevel.MULTI_SWITCH,
    "PHB": PcieLevel.HOST_BRIDGE,
    "NODE": PcieLevel.NUMA_NODE,
    "SYS": PcieLevel.SYSTEM,
}


class FleetError(ValueError):
    def __init__(self, path: str, line: int, field_name: str, problem: str) -> None:
        super().__init__(f"{path}:{line}: {field_name}: {problem}")
        self.path, self.line, self.field, self.problem = path, line, field_name, problem


@dataclass(frozen=True, slots=True)
class FleetNode:
    node: Node
    profile: str | None = None
    line: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)  # e.g. faults, for the fake NVML


@dataclass(frozen=True, slots=True)
class Fleet:
    path: str
    nodes: tuple[FleetNode, ...]

    def node(self, name: str) -> FleetNode:
        found = next((n for n in self.nodes if n.node.name == name), None)
        if found is None:
            names = ", ".join(n.node.name for n in self.nodes)
            raise KeyError(f"node {name!r} is not in {self.path} (it has {names})")
        return found


def card_uuid(node: str, index: int) -> CardUuid:
    """A stable, realistic-looking UUID for a simulated card."""
    return CardUuid(f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}")


class _Loader(yaml.SafeLoader):
    """Keeps the line of every mapping key so errors can point at it."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _Lined:
    loader.flatten_mapping(node)
    mapping = _Lined(node.start_mark.line + 1)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.lines[key] = key_node.start_mark.line + 1
    return mapping


class _LinedList(list[Any]):
    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.lines: list[int] = []


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> _LinedList:
    items = _LinedList(node.start_mark.line + 1)
    for item in node.value:
        items.append(loader.construct_object(item, deep=True))
        items.lines.append(item.start_mark.line + 1)
    return items


class _Lined(dict[Any, Any]):
    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.lines: dict[Any, int] = {}


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


class _Cursor:
    def __init__(self, path: str, raw: object, where: str, line: int) -> None:
        self.path, self.where = path, where
        if not isinstance(raw, _Lined):
            raise FleetError(path, line, where or "fleet", "must be a mapping")
        self.raw = raw
        self.line = raw.line

    def fail(self, key: str, problem: str) -> FleetError:
        return FleetError(self.path, self.raw.lines.get(key, self.line), self._name(key), problem)

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.raw:
            if default is ...:
                raise FleetError(self.path, self.line, self._name(key), "is required")
            return default
        value = self.raw[key]
        if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
            expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise self.fail(key, f"must be {expected}, got {value!r}")
        return value

    def count(self, key: str, default: Any = ...) -> Any:
        value = self.get(key, int, default)
        if isinstance(value, int) and value < 0:
            raise self.fail(key, f"must not be negative, got {value}")
        return value

    def children(self, key: str) -> list[_Cursor]:
        items = self.get(key, list, [])
        line = self.raw.lines.get(key, self.line)
        lines = getattr(items, "lines", [])
        return [
            _Cursor(self.path, v, f"{self._name(key)}[{i}]", lines[i] if i < len(lines) else line)
            for i, v in enumerate(items)
        ]

    def line_of(self, key: str) -> int:
        return self.raw.lines.get(key, self.line)

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.raw:
            if key not in allowed:
                raise self.fail(str(key), f"unknown field (expected one of {', '.join(sorted(allowed))})")


NODE_KEYS = {"name", "profile", "cards", "links", "cpu_milli", "memory_mib", "labels"} | {
    "faults", "processes", "mig", "resets"  # the simulation keys (fleet_script.py)
}  # fmt: skip


def load_fleet(path: str | Path) -> Fleet:
    text = Path(path).read_text(encoding="utf-8")
    return parse_fleet(text, str(path))


def parse_fleet(text: str, path: str = "<fleet>") -> Fleet:
    try:
        raw = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        raise FleetError(path, line, "fleet", f"not valid YAML: {getattr(err, 'problem', err)}") from err
    top = _Cursor(path, raw, "", 1)
    top.check_keys({"nodes"})
    cursors = top.children("nodes")
    nodes = tuple(_node(c) for c in cursors)
    if not nodes:
        raise FleetError(path, top.line, "nodes", "the fleet has no nodes")
    seen: dict[str, int] = {}
    for cursor, n in zip(cursors, nodes, strict=True):
        line = cursor.line_of("name")
        if n.node.name in seen:
            problem = f"node {n.node.name!r} repeats line {seen[n.node.name]}"
            raise FleetError(path, line, f"{cursor.where}.name", problem)
        seen[n.node.name] = line
    return Fleet(path, nodes)


def _node(c: _Cursor) -> FleetNode:
    c.check_keys(NODE_KEYS)
    name = c.get("name", str)
    if not NODE_NAME.match(name):
        raise c.fail("name", f"{name!r} is not a valid node name (lower-case DNS name)")
    profile = _profile(c)
    specs = profile.cards if profile else ()
    if "cards" in c.raw:
        specs = tuple(_card_spec(cc) for cc in c.children("cards"))
    links = profile.links if profile and "cards" not in c.raw else ()
    if "links" in c.raw:
        links = tuple(_link(lc, len(specs)) for lc in c.children("links"))
    default_cpu = profile.cpu_milli if profile else 0
    default_mem = profile.memory_mib if profile else 0
    labels = c.get("labels", dict, {})
    node = Node(
        name=NodeName(name),
        cards=tuple(_card(name, i, s) for i, s in enumerate(specs)),
        links=links,
        cpu_milli=c.count("cpu_milli", default_cpu),
        memory_mib=c.count("memory_mib", default_mem),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
    )
    extra = {k: c.raw[k] for k in ("faults", "processes", "mig", "resets") if k in c.raw}
    return FleetNode(node, profile.name if profile else None, c.line, extra)


def _profile(c: _Cursor) -> Profile | None:
    name = c.get("profile", str, None)
    if name is None:
        if "cards" not in c.raw:
            raise c.fail("profile", "give either a profile or a list of cards")
        return None
    if name not in PROFILES:
        raise c.fail("profile", f"unknown profile {name!r} (known: {', '.join(sorted(PROFILES))})")
    return PROFILES[name]()


def _card_spec(c: _Cursor) -> CardSpec:
    c.check_keys({"model", "memory_mib", "numa"})
    memory = c.count("memory_mib")
    if memory == 0:
        raise c.fail("memory_mib", "must be positive")
    return CardSpec(c.get("model", str), memory, c.get("numa", int, 0))


def _card(node: str, index: int, spec: CardSpec) -> Card:
    return Card(card_uuid(node, index), index, spec.model, spec.memory_mib, spec.numa, minor=index)


def _link(c: _Cursor, cards: int) -> Link:
    c.check_keys({"a", "b", "nvlinks", "pcie"})
    a, b = c.count("a"), c.count("b")
    for key, value in (("a", a), ("b", b)):
        if value >= cards:
            raise c.fail(key, f"card {value} does not exist (the node has {cards} cards)")
    if a == b:
        raise c.fail("b", "a link joins two different cards")
    pcie_name = c.get("pcie", str, "SYS").upper()
    if pcie_name not in PCIE_NAMES:
        raise c.fail("pcie", f"must be one of {', '.join(PCIE_NAMES)}, got {pcie_name!r}")
    return Link(min(a, b), max(a, b), c.count("nvlinks", 0), PCIE_NAMES[pcie_name])
