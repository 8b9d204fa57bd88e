"""The Kubernetes adapter: the one module of the allocator that imports kubernetes_asyncio.

One thing is asked of the API server: list every pod in every namespace, in pages
(``GET /api/v1/pods?limit=N&continue=...``, one consistent snapshot). Responses are read raw and
each pod is converted once, here, to a ``PodSeen``. Any failure along the way, a later page
included, is ``Unavailable``: a listing is used whole or not at all.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from gpuledger_allocator.reconcile import PodSeen
from gpuledger_core import codec
from gpuledger_core.errors import GpuledgerError, Unavailable
from gpuledger_core.ids import PodUid
from gpuledger_core.model import Allocation

log = logging.getLogger(__name__)
# Written by placement's bind (gpuledger_placement.convert.ALLOCATION_ANNOTATION).
ALLOCATION_ANNOTATION = "gpuledger.io/allocation"
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
PAGE_SIZE = 500
TIMEOUT_S = 30.0


class PodLister(Protocol):
    async def list_pods(self) -> list[PodSeen]: ...
    async def close(self) -> None: ...


def in_cluster() -> bool:
    """Whether this process runs in a pod with a service-account token."""
    return SERVICE_ACCOUNT_TOKEN.exists()


class KubePodLister:
    def __init__(self, api_client: Any, page_size: int = PAGE_SIZE) -> None:
        from kubernetes_asyncio import client

        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self.page_size = page_size

    @classmethod
    async def connect(cls, in_cluster: bool, kubeconfig: str) -> KubePodLister:
        from kubernetes_asyncio import client, config

        try:
            if in_cluster:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            else:
                await config.load_kube_config(config_file=kubeconfig or None)
        except Exception as err:  # configuration problems come in several unrelated types
            raise Unavailable(f"cannot configure Kubernetes access: {err}") from err
        return cls(client.ApiClient())

    async def list_pods(self) -> list[PodSeen]:
        pods: list[PodSeen] = []
        token = ""
        while True:
            page = await self._page(token)
            pods.extend(pod_from(item) for item in _items(page))
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return pods

    async def close(self) -> None:
        await self._api_client.close()

    async def _page(self, token: str) -> Mapping[str, Any]:
        extra = {"_continue": token} if token else {}
        listing: Any = self._core.list_pod_for_all_namespaces  # read raw: _preload_content=False
        try:
            response = await listing(limit=self.page_size, _preload_content=False, _request_timeout=TIMEOUT_S, **extra)
            status, data = response.status, await response.read()
            response.release()
        except Exception as err:  # timeouts, refused connections, TLS: all mean "not now"
            raise Unavailable(f"Kubernetes API unreachable listing pods: {err or type(err).__name__}") from err
        body = _json(data)
        if not 200 <= status < 300 or not isinstance(body, dict):
            message = body.get("message") if isinstance(body, dict) else None
            raise Unavailable(f"listing pods: {message or f'HTTP {status}'}")
        return body


def pod_from(raw: Mapping[str, Any]) -> PodSeen:
    meta = _obj(raw, "metadata")
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    annotation = _obj(meta, "annotations").get(ALLOCATION_ANNOTATION)
    return PodSeen(
        uid=PodUid(str(meta.get("uid") or "")),
        namespace=namespace,
        name=name,
        phase=str(_obj(raw, "status").get("phase") or ""),
        node=str(_obj(raw, "spec").get("nodeName") or ""),
        allocation=_allocation(annotation, f"{namespace}/{name}") if annotation else None,
    )


def _allocation(annotation: Any, pod: str) -> Allocation | None:
    try:
        return codec.allocation_from(codec.Reader(json.loads(str(annotation)), ALLOCATION_ANNOTATION))
    except (ValueError, GpuledgerError) as err:
        log.warning("pod %s: ignoring malformed %s annotation: %s", pod, ALLOCATION_ANNOTATION, err)
        return None


def _items(page: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = page.get("items")
    if not isinstance(items, list):
        raise Unavailable("listing pods: the reply has no items")
    return [item for item in items if isinstance(item, dict)]


def _obj(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _json(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None
