"""Whether a pod's host side (CPU, memory, node selector, required affinity, taints) lets it run on
a node, as far as placement follows the nodes (``HostUsage``, the view's free CPU and memory): DRA
mode C chooses a claim's node with it, and defragmentation the node a moved pod will fit on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuledger_core.ids import NodeName
from gpuledger_placement.convert import pod_ask_from
from gpuledger_placement.hosts import HostUsage
from gpuledger_placement.node_fit import node_refusal
from gpuledger_placement.view import FleetView


def host_refusal(pod: Mapping[str, Any], hosts: HostUsage | None, view: FleetView) -> Callable[[NodeName], str]:
    """Why ``pod`` may not run on a node as far as its host goes; empty when it may (or when placement
    does not follow that node's host: kube-scheduler checks it then)."""
    asked = pod_ask_from(pod)

    def why(node: NodeName) -> str:
        if hosts is not None and hosts.synced.is_set():
            if str(node) not in hosts.allocatable:
                return "no Node of that name in Kubernetes"
            refusal = node_refusal(pod, str(node), hosts.labels.get(node, {}), hosts.taints.get(node, []))
            if refusal:
                return refusal
        known = view.hosts(str(node))
        if known is None:
            return ""  # untracked: kube-scheduler checks it
        cpu_free, mem_free, _, _ = known
        if asked.cpu_milli > cpu_free:
            return f"the pod needs {asked.cpu_milli}m CPU, {cpu_free}m free"
        if asked.memory_mib > mem_free:
            return f"the pod needs {asked.memory_mib} MiB of memory, {mem_free} MiB free"
        return ""

    return why
