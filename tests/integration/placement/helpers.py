"""Pods and requests for the extender tests."""

from __future__ import annotations

from typing import Any

import aiohttp

from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.model import Card, CardMode, MigInstance, MigSlot, Node

MIG_NODE = "a100-mig"
STATIC = MigInstance(MigSlot("3g.20gb", 4, 4), static=True, uuid="MIG-static-3g")


def gpu_pod(
    name: str,
    gpu: int = 1,
    mem: int | None = None,
    core: int | None = None,
    annotations: dict[str, str] | None = None,
    uid: str = "",
) -> dict[str, Any]:
    limits: dict[str, str] = {"gpuledger.io/gpu": str(gpu)}
    if mem is not None:
        limits["gpuledger.io/gpu-mem"] = str(mem)
    if core is not None:
        limits["gpuledger.io/gpu-core"] = str(core)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid or f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": {
            "schedulerName": "gpuledger-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "cuda:12",
                    "resources": {"limits": limits, "requests": {"cpu": "1", "memory": "2Gi", **limits}},
                }
            ],
        },
    }


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as reply:
        text = await reply.text()
        try:
            return reply.status, await reply.json(content_type=None)
        except ValueError:
            return reply.status, text


def args(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends them to a nodeCacheCapable extender."""
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def bind_args(name: str, node: str, uid: str = "") -> dict[str, str]:
    return {"PodName": name, "PodNamespace": "default", "PodUID": uid or f"uid-{name}", "Node": node}


def mig_node() -> Node:
    """A node as its inventory reports it with MIG on: two A100 40 GB cards, card 0 in MIG mode
    with a static 3g.20gb at 4, card 1 whole."""
    a100 = "NVIDIA A100-SXM4-40GB"
    cards = (
        Card(CardUuid(f"GPU-{MIG_NODE}-0"), 0, a100, 40960, numa=0, minor=0, mode=CardMode.MIG, instances=(STATIC,)),
        Card(CardUuid(f"GPU-{MIG_NODE}-1"), 1, a100, 40960, numa=0, minor=1),
    )
    return Node(NodeName(MIG_NODE), cards)
