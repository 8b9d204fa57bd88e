"""The Kubernetes adapter: the one module that imports kubernetes_asyncio, behind ``NodeApi``.

Only two things are asked of the API server: read a Node's labels, and merge-patch them.
Without a configured cluster (``--kube off``, or ``auto`` outside a cluster and with no
kubeconfig) the service runs without labelling.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from gpuledger_core.errors import NotFound, Unavailable

log = logging.getLogger(__name__)


class NodeApi(Protocol):
    async def get_labels(self, node: str) -> dict[str, str]: ...
    async def patch_labels(self, node: str, patch: dict[str, str | None]) -> None: ...
    async def close(self) -> None: ...


class KubeNodeApi:
    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client

        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)

    @classmethod
    async def connect(cls, in_cluster: bool, kubeconfig: str) -> KubeNodeApi:
        from kubernetes_asyncio import client, config

        try:
            if in_cluster:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            else:
                await config.load_kube_config(config_file=kubeconfig or None)
        except Exception as err:  # config errors come in several unrelated types
            raise Unavailable(f"cannot configure Kubernetes: {err}") from err
        return cls(client.ApiClient())

    async def get_labels(self, node: str) -> dict[str, str]:
        try:
            found = await self._core.read_node(node)
        except Exception as err:
            raise _translate(err, node) from err
        return dict(found.metadata.labels or {})

    async def patch_labels(self, node: str, patch: dict[str, str | None]) -> None:
        body = {"metadata": {"labels": patch}}
        try:
            merge = "application/merge-patch+json"
            await self._core.patch_node(node, body, _content_type=merge)  # type: ignore[call-arg]
        except Exception as err:
            raise _translate(err, node) from err

    async def close(self) -> None:
        await self._api_client.close()


def _translate(err: Exception, node: str) -> Exception:
    if getattr(err, "status", None) == 404:
        return NotFound(f"node {node} does not exist in Kubernetes")
    return Unavailable(f"Kubernetes API: {err}")
