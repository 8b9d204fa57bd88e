"""Pods and requests for the extender tests."""

from __future__ import annotations

from typing import Any

import aiohttp


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
