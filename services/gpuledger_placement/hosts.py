"""What Kubernetes knows of each node's CPU and memory: every Node's allocatable, less the requests
of the pods bound to it that have not ended.

Placement follows them wherever it reaches Kubernetes, guard or none: each node's free CPU and
memory are part of its state in the view (``FleetView.host_changed``), so a pod with cards is
checked against them as kube-scheduler checks it, and ``default``'s balance term sees how much of
a node's free GPU its CPU and memory can still serve. The dominant-resource guard, where set, uses
them too: it keeps a GPU node's free CPU and memory in proportion to its free cards, so that pods
that take no card (they reach the extender too: see docs/placement.md, "The guard in
Kubernetes") cannot strand its cards.

``follow`` lists Nodes and the pods bound to a node, then watches both from the list's version,
and lists again when a watch cannot go on. Pods bound by this placement service are counted at
once (``bound``), before the watch brings them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuledger_core.errors import GpuledgerError, InvalidArgument
from gpuledger_placement import convert

log = logging.getLogger(__name__)
NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
BOUND = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
RETRY_S = 2.0


class Watchable(Protocol):
    async def list_objects(self, path: str, params: Mapping[str, str], timeout_s: float = 60.0) -> dict[str, Any]: ...
    def watch(
        self, path: str, params: Mapping[str, str], timeout_s: float = 300.0
    ) -> AsyncIterator[dict[str, Any]]: ...


@dataclass(slots=True)
class HostUsage:
    """Each node's allocatable CPU (millicores) and memory (MiB), and what its pods request."""

    allocatable: dict[str, tuple[int, int]] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> its labels
    taints: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # node -> spec.taints
    pods: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # uid -> node, CPU, memory
    used: dict[str, tuple[int, int]] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    _watchers: list[Callable[[str], None]] = field(default_factory=list)

    def watch(self, changed: Callable[[str], None]) -> None:
        """Call ``changed(node)`` after what is known of the node's CPU or memory changed."""
        self._watchers.append(changed)

    def totals(self, node: str) -> tuple[int, int, int, int] | None:
        """Free CPU, free memory, allocatable CPU, allocatable memory; None while unknown."""
        free = self.free(node)
        total = self.allocatable.get(node)
        return None if free is None or total is None else (*free, *total)

    def _changed(self, node: str) -> None:
        if self.synced.is_set():
            for changed in self._watchers:
                changed(node)

    def free(self, node: str) -> tuple[int, int] | None:
        """The node's CPU and memory not requested by its pods; None for a node not (yet) known."""
        total = self.allocatable.get(node)
        if total is None or not self.synced.is_set():
            return None
        cpu, mem = self.used.get(node, (0, 0))
        return total[0] - cpu, total[1] - mem

    def set_node(self, raw: Mapping[str, Any]) -> None:
        name = str(raw.get("metadata", {}).get("name") or "")
        if name:
            self.labels[name] = {str(k): str(v) for k, v in (raw.get("metadata", {}).get("labels") or {}).items()}
            self.taints[name] = [dict(t) for t in (raw.get("spec") or {}).get("taints") or []]
        allocatable = raw.get("status", {}).get("allocatable") or {}
        try:
            cpu = int(convert.quantity(allocatable.get("cpu", 0), "allocatable.cpu") * 1000)
            mem = int(convert.quantity(allocatable.get("memory", 0), "allocatable.memory") / convert.MIB)
        except InvalidArgument as err:
            log.warning("node %s: allocatable not understood (%s); its CPU and memory stay untracked", name, err)
            self.allocatable.pop(name, None)
            return
        if name and self.allocatable.get(name) != (cpu, mem):
            self.allocatable[name] = (cpu, mem)
            self._changed(name)

    def drop_node(self, raw: Mapping[str, Any]) -> None:
        name = str(raw.get("metadata", {}).get("name") or "")
        self.labels.pop(name, None)
        self.taints.pop(name, None)
        if self.allocatable.pop(name, None) is not None:
            self._changed(name)

    def set_pod(self, raw: Mapping[str, Any]) -> None:
        meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
        uid, node = str(meta.get("uid") or ""), str(spec.get("nodeName") or "")
        phase = (raw.get("status") or {}).get("phase")
        if not uid:
            return
        if not node or phase in ("Succeeded", "Failed"):
            self.drop_pod(uid)
            return
        try:
            cpu, mem = convert.host_requests(raw)
        except InvalidArgument:
            cpu = mem = 0  # the API server stored it, so this is our parser's gap: count nothing
        self.bound(uid, node, cpu, mem)

    def bound(self, uid: str, node: str, cpu_milli: int, memory_mib: int) -> None:
        """The pod ``uid`` runs on ``node`` with these requests (again: replaces what was counted)."""
        if self.pods.get(uid) == (node, cpu_milli, memory_mib):
            return
        self.drop_pod(uid)
        self.pods[uid] = (node, cpu_milli, memory_mib)
        cpu, mem = self.used.get(node, (0, 0))
        self.used[node] = (cpu + cpu_milli, mem + memory_mib)
        if cpu_milli or memory_mib:  # a pod that requests nothing changes no node's state
            self._changed(node)

    def drop_pod(self, uid: str) -> None:
        found = self.pods.pop(uid, None)
        if found is None:
            return
        node, cpu_milli, memory_mib = found
        cpu, mem = self.used.get(node, (0, 0))
        self.used[node] = (cpu - cpu_milli, mem - memory_mib)
        if cpu_milli or memory_mib:
            self._changed(node)

    def replace(self, nodes: list[Any], pods: list[Any]) -> None:
        """Start again from full lists."""
        self.allocatable.clear()
        self.labels.clear()
        self.taints.clear()
        self.pods.clear()
        self.used.clear()
        for node in nodes:
            self.set_node(node)
        for pod in pods:
            self.set_pod(pod)
        self.synced.set()
        for name in list(self.allocatable):
            self._changed(name)


async def follow(api: Watchable, usage: HostUsage) -> None:
    """List and watch Nodes and bound pods into ``usage`` until cancelled."""
    while True:
        try:
            nodes = await api.list_objects(NODES, {})
            pods = await api.list_objects(PODS, {"fieldSelector": BOUND})
            usage.replace(nodes["items"], pods["items"])
            log.info("hosts: %d node(s), %d bound pod(s) followed", len(usage.allocatable), len(usage.pods))
            async with asyncio.TaskGroup() as watches:
                watches.create_task(_watch(api, NODES, {}, nodes, usage, _node_event))
                watches.create_task(_watch(api, PODS, {"fieldSelector": BOUND}, pods, usage, _pod_event))
        except* GpuledgerError as group:
            log.warning("hosts: following nodes and pods failed (%s); listing again", group.exceptions[0])
        await asyncio.sleep(RETRY_S)


async def _watch(
    api: Watchable,
    path: str,
    params: Mapping[str, str],
    listed: Mapping[str, Any],
    usage: HostUsage,
    apply: Any,
) -> None:
    version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
    while True:
        async for event in api.watch(path, {**params, "resourceVersion": version}):
            obj = event.get("object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if event.get("type") != "BOOKMARK":
                apply(usage, str(event.get("type")), obj)


def _node_event(usage: HostUsage, kind: str, obj: Mapping[str, Any]) -> None:
    usage.drop_node(obj) if kind == "DELETED" else usage.set_node(obj)


def _pod_event(usage: HostUsage, kind: str, obj: Mapping[str, Any]) -> None:
    if kind == "DELETED":
        usage.drop_pod(str((obj.get("metadata") or {}).get("uid") or ""))
    else:
        usage.set_pod(obj)
