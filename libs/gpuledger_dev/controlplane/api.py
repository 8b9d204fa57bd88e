"""A small asyncio client of the real API server for tests and the local stack (aiohttp, bearer
token, the control plane's CA). Errors carry the HTTP status and the API server's message."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from gpuledger_dev.controlplane.cluster import Access

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status, self.body = status, body
        reason = body
        with contextlib.suppress(ValueError, AttributeError):
            reason = str(json.loads(body).get("message", body))
        super().__init__(f"{method} {path}: {status} {reason[:400]}")


class KubeApi:
    """``async with KubeApi(access) as api``: get, create, patch, delete, list and watch objects by path."""

    def __init__(self, access: Access, timeout_s: float = 30.0) -> None:
        self.access = access
        self._ssl = ssl.create_default_context(cadata=access.ca_pem.decode())
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeApi:
        self._http = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {self.access.token}", "Accept": "application/json"},
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=32),
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Any:
        assert self._http is not None, "use KubeApi as an async context manager"
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._http.request(
            method, f"{self.access.server}{path}", data=data, headers=headers, params=params, timeout=self._timeout
        ) as reply:
            text = await reply.text()
            if reply.status >= 400:
                raise ApiError(reply.status, method, path, text)
            return json.loads(text) if text else None

    async def raw(self, path: str, **params: str) -> bytes:
        """GET a path that answers other than JSON (a profile from ``/debug/pprof``), as its bytes."""
        assert self._http is not None, "use KubeApi as an async context manager"
        timeout = aiohttp.ClientTimeout(total=(self._timeout.total or 0.0) + float(params.get("seconds", 0)))
        async with self._http.get(f"{self.access.server}{path}", params=params or None, timeout=timeout) as reply:
            body = await reply.read()
            if reply.status >= 400:
                raise ApiError(reply.status, "GET", path, body.decode(errors="replace"))
            return body

    async def get(self, path: str, **params: str) -> Any:
        return await self.call("GET", path, params=params or None)

    async def create(self, path: str, body: Any) -> Any:
        return await self.call("POST", path, body)

    async def patch(self, path: str, body: Any, content_type: str = MERGE) -> Any:
        return await self.call("PATCH", path, body, content_type)

    async def delete(self, path: str, grace_s: int | None = None) -> Any:
        body = None if grace_s is None else {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace_s}
        return await self.call("DELETE", path, body)

    async def watch(
        self, path: str, resource_version: str, timeout_s: int = 60, **params: str
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events of a list path from ``resource_version`` (each ``{"type", "object"}``)."""
        assert self._http is not None
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
            **params,
        }
        timeout = aiohttp.ClientTimeout(total=timeout_s + 10, sock_read=timeout_s + 10)
        async with self._http.get(f"{self.access.server}{path}", params=query, timeout=timeout) as reply:
            if reply.status >= 400:
                raise ApiError(reply.status, "WATCH", path, await reply.text())
            async for line in reply.content:
                if line.strip():
                    yield json.loads(line)
