"""kubelet's PodResources API: which pod's container holds which of our device IDs.

A fresh channel per call: kubelet recreates the socket (a new inode) when it restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from grpclib.client import Channel

from gpuledger_core.errors import Unavailable
from gpuledger_plugin.kubelet_findings import KubeletView
from gpuledger_proto import v1 as pr


class PodResourcesPort(Protocol):
    async def list(self) -> KubeletView: ...


Ours = Callable[[str], bool] | str  # the resources whose devices are ours: a test of the name, or the one name


class PodResourcesClient:
    def __init__(self, socket_path: str, resource_name: Ours, timeout_s: float) -> None:
        self.socket_path, self.resource_name, self.timeout_s = socket_path, resource_name, timeout_s

    async def list(self) -> KubeletView:
        channel = Channel(path=self.socket_path)
        try:
            stub = pr.PodResourcesListerStub(channel)
            response = await stub.list(pr.ListPodResourcesRequest(), timeout=self.timeout_s)
        except Exception as err:  # socket missing, kubelet restarting, rate limited, timeout
            raise Unavailable(f"kubelet PodResources at {self.socket_path}: {err}") from err
        finally:
            channel.close()
        return view_of(response, self.resource_name)


def view_of(response: pr.ListPodResourcesResponse, resource_name: Ours) -> KubeletView:
    """Every pod's containers and the device IDs each holds of our resources (one container asks
    for one of them: the gpu resource or one MIG resource)."""
    ours = resource_name.__eq__ if isinstance(resource_name, str) else resource_name
    view: dict[tuple[str, str], dict[str, frozenset[str]]] = {}
    for pod in response.pod_resources:
        containers = view.setdefault((pod.namespace, pod.name), {})
        for container in pod.containers:
            ids = {i for d in container.devices if ours(d.resource_name) for i in d.device_ids}
            containers[container.name] = frozenset(ids)
    return view
