"""The Kubernetes adapter: the one module of the allocator that imports kubernetes_asyncio.

Three things are asked of the API server, all about the pods the reconciler follows (a field
selector, ``spec.schedulerName=gpuledger-scheduler`` by default; empty for every pod):

- list them, in pages (``GET /api/v1/pods?fieldSelector=...&limit=N&continue=...``, one consistent
  snapshot), with the list's resourceVersion;
- watch them from that resourceVersion (``watch=1&allowWatchBookmarks=true&timeoutSeconds=N``):
  ADDED, MODIFIED and DELETED events, bookmarks that move the resourceVersion on, and 410 Gone
  (``Expired``) when the version is too old to watch from, which calls for a new listing;
- read one pod by namespace and name (a pod the ledger holds cards for but the watch does not show).

Responses are read raw and each pod is converted once, here, to a ``PodSeen``. Any failure along
the way, a later page included, is ``Unavailable``: a listing is used whole or not at all. The
client configuration comes loaded from ``gpuledger_common.kubeconfig`` (the ``kube`` setting).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gpuledger_allocator.repairs import PodSeen
from gpuledger_core import codec
from gpuledger_core.errors import GpuledgerError, Unavailable
from gpuledger_core.ids import PodUid
from gpuledger_core.model import Allocation

log = logging.getLogger(__name__)
# Written by placement's bind (gpuledger_placement.convert.ALLOCATION_ANNOTATION).
ALLOCATION_ANNOTATION = "gpuledger.io/allocation"
PAGE_SIZE = 500
TIMEOUT_S = 30.0
WATCH_S = 300  # how long one watch request runs before the server ends it (and it is made again)
OURS = "spec.schedulerName=gpuledger-scheduler"


class Expired(Unavailable):
    """The resourceVersion is too old to watch from (410 Gone): list again."""


@dataclass(frozen=True, slots=True)
class PodList:
    pods: list[PodSeen]
    resource_version: str


@dataclass(frozen=True, slots=True)
class PodEvent:
    kind: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    pod: PodSeen | None  # None for a bookmark
    resource_version: str


class PodLister(Protocol):
    async def list_pods(self) -> PodList: ...
    def watch_pods(self, resource_version: str, timeout_s: int = WATCH_S) -> AsyncIterator[PodEvent]: ...
    async def get_pod(self, namespace: str, name: str) -> PodSeen | None: ...
    async def close(self) -> None: ...


class KubePodLister:
    """The pods through the API server that ``configuration`` (``kubeconfig.load``) names."""

    def __init__(self, configuration: Any, page_size: int = PAGE_SIZE, field_selector: str = OURS) -> None:
        from kubernetes_asyncio import client

        self._api_client = client.ApiClient(configuration)
        self._core = client.CoreV1Api(self._api_client)
        self.page_size = page_size
        self.field_selector = field_selector

    async def list_pods(self) -> PodList:
        pods: list[PodSeen] = []
        token, version = "", ""
        while True:
            page = await self._page(token)
            pods.extend(pod_from(item) for item in _items(page))
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")  # the first page's: the snapshot's
            token = str(meta.get("continue") or "")
            if not token:
                return PodList(pods, version)

    async def watch_pods(self, resource_version: str, timeout_s: int = WATCH_S) -> AsyncIterator[PodEvent]:
        """The changes after ``resource_version`` until the server ends the watch (``timeout_s``)."""
        listing: Any = self._core.list_pod_for_all_namespaces
        try:
            response = await listing(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _preload_content=False,
                _request_timeout=timeout_s + TIMEOUT_S,
                **self._selected(),
            )
        except Exception as err:
            raise Unavailable(f"Kubernetes API unreachable watching pods: {err or type(err).__name__}") from err
        try:
            if not 200 <= response.status < 300:
                raise _failure(response.status, _json(await response.read()), "watching pods")
            while True:
                try:
                    line = await response.content.readline()
                except Exception as err:
                    raise Unavailable(f"the pod watch broke: {err or type(err).__name__}") from err
                if not line:
                    return
                if line.strip():
                    yield event_from(_json(line))
        finally:
            response.release()

    async def get_pod(self, namespace: str, name: str) -> PodSeen | None:
        """The pod, or None if there is none of that name."""
        reading: Any = self._core.read_namespaced_pod
        try:
            response = await reading(name, namespace, _preload_content=False, _request_timeout=TIMEOUT_S)
            code, data = int(response.status), await response.read()
            response.release()
        except Exception as err:
            raise Unavailable(f"Kubernetes API unreachable reading pod {namespace}/{name}: {err}") from err
        if code == 404:
            return None
        body = _json(data)
        if not 200 <= code < 300 or not isinstance(body, dict):
            raise _failure(code, body, f"reading pod {namespace}/{name}")
        return pod_from(body)

    async def close(self) -> None:
        await self._api_client.close()

    def _selected(self) -> dict[str, str]:
        return {"field_selector": self.field_selector} if self.field_selector else {}

    async def _page(self, token: str) -> Mapping[str, Any]:
        extra = {"_continue": token} if token else {}
        listing: Any = self._core.list_pod_for_all_namespaces  # read raw: _preload_content=False
        try:
            response = await listing(
                limit=self.page_size, _preload_content=False, _request_timeout=TIMEOUT_S, **self._selected(), **extra
            )
            status, data = response.status, await response.read()
            response.release()
        except Exception as err:  # timeouts, refused connections, TLS: all mean "not now"
            raise Unavailable(f"Kubernetes API unreachable listing pods: {err or type(err).__name__}") from err
        body = _json(data)
        if not 200 <= status < 300 or not isinstance(body, dict):
            raise _failure(status, body, "listing pods")
        return body


def _failure(status: int, body: Any, what: str) -> Unavailable:
    message = body.get("message") if isinstance(body, dict) else None
    text = f"{what}: {message or f'HTTP {status}'}"
    return Expired(text) if status == 410 else Unavailable(text)


def event_from(raw: Any) -> PodEvent:
    """One line of a watch. An ERROR event (a Status) is raised: ``Expired`` for 410."""
    if not isinstance(raw, dict):
        raise Unavailable("the pod watch sent a line that is not a JSON object")
    kind, obj = str(raw.get("type") or ""), raw.get("object")
    if not isinstance(obj, dict):
        raise Unavailable(f"the pod watch sent a {kind or 'typeless'} event without an object")
    if kind == "ERROR":
        raise _failure(int(obj.get("code") or 500), obj, "watching pods")
    version = str(_obj(obj, "metadata").get("resourceVersion") or "")
    if kind == "BOOKMARK":
        return PodEvent(kind, None, version)
    if kind not in ("ADDED", "MODIFIED", "DELETED"):
        raise Unavailable(f"the pod watch sent an event of unknown type {kind!r}")
    return PodEvent(kind, pod_from(obj), version)


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
        return codec.allocation_from(codec.Reader(orjson.loads(str(annotation)), ALLOCATION_ANNOTATION))
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
    """A body or a watch line (orjson: the watch brings every change of every pod followed)."""
    try:
        return orjson.loads(data) if data else None
    except ValueError:
        return None
