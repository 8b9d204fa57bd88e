"""A small fake kube-apiserver: the real REST paths and status codes for the calls bind makes.

Serves, for pods kept in memory: ``GET`` and ``PATCH`` (JSON merge patch, and strategic merge patch
taken as a merge patch, which is the same thing for annotations) of
``/api/v1/namespaces/{ns}/pods/{name}``, ``POST .../pods/{name}/binding``, and ``GET
/api/v1/nodes/{name}``. Errors are ``Status`` objects with the API server's codes and messages:
401 without the bearer token, 404 for a missing pod, 409 for a second binding of a bound pod or a UID
precondition that does not hold. ``kubeconfig()`` writes a file that points a real client here.

``GET /api/v1/pods`` lists the pods of every namespace, ordered by namespace and name, in pages
when asked (``limit``; ``metadata.continue`` names the next page, and continued pages come from the
snapshot taken for the first, as the real API server serves them); an unknown or expired continue
token is 410 ``Expired``. Tests change pods with ``set_phase`` and ``delete_pod``, expire continue
tokens with ``expire_continues``, and take the server down and up again on the same port with
``close`` and ``start``.

Faults for tests: ``fail_lists`` (answer the next list requests with a status, or normally for
``None``), ``fail_bindings`` (answer the next bindings with a status), ``stall_bindings`` (hold
bindings until released), and ``requests`` records every call.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuledger_common.natsserver import free_port

POD_PATH = "/api/v1/namespaces/{namespace}/pods/{name}"
PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")


def status(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "details": dict(details or {}),
        "code": code,
    }
    return web.json_response(body, status=code)


def _conflict(name: str, message: str) -> web.Response:
    full = f'Operation cannot be fulfilled on pods/binding "{name}": {message}'
    return status(409, "Conflict", full, {"name": name, "kind": "pods/binding"})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class FakeApiServer:
    def __init__(self, token: str = "fake-token") -> None:
        self.token = token
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.bindings: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.fail_bindings: list[tuple[int, str]] = []
        self.fail_lists: list[tuple[int, str] | None] = []  # None: answer that one normally
        self._snapshots: dict[int, list[dict[str, Any]]] = {}  # resourceVersion -> the pods then
        self.stall_bindings: asyncio.Event | None = None
        self._version = 1
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- state ---

    def add_pod(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(pod))
        meta = stored.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("annotations", {})
        stored.setdefault("spec", {}).setdefault("containers", [])
        stored.setdefault("status", {"phase": "Pending"})
        self._touch(stored)
        self.pods[(meta["namespace"], meta["name"])] = stored
        return stored

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.pods[(namespace, name)]

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        found = self.pods[(namespace, name)]
        found.setdefault("status", {})["phase"] = phase
        self._touch(found)

    def delete_pod(self, namespace: str, name: str) -> None:
        del self.pods[(namespace, name)]
        self._version += 1

    def expire_continues(self) -> None:
        self._snapshots.clear()

    def add_node(self, name: str) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}

    def _touch(self, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    # --- serving ---

    async def start(self) -> FakeApiServer:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get(POD_PATH, self._get_pod)
        app.router.add_patch(POD_PATH, self._patch_pod)
        app.router.add_post(POD_PATH + "/binding", self._bind)
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_get("/api/v1/pods", self._list_pods)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = self.port or free_port()  # started again: the same address
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def close(self) -> None:
        if self.stall_bindings is not None:
            self.stall_bindings.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return status(401, "Unauthorized", "Unauthorized")
        response: web.StreamResponse = await handler(request)
        return response

    def _find(self, request: web.Request) -> dict[str, Any] | web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        found = self.pods.get((namespace, name))
        if found is None:
            return status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        return found

    async def _get_pod(self, request: web.Request) -> web.Response:
        found = self._find(request)
        return found if isinstance(found, web.Response) else web.json_response(found)

    async def _patch_pod(self, request: web.Request) -> web.Response:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        if request.content_type not in PATCH_TYPES:
            unknown = f"the body of the request was in an unknown format: {request.content_type}"
            return status(415, "UnsupportedMediaType", unknown)
        try:
            patch = json.loads(await request.read())
        except ValueError as err:
            return status(400, "BadRequest", f"error decoding patch: {err}")
        patched = merge_patch(found, patch)
        patched["metadata"]["uid"] = found["metadata"]["uid"]
        found.clear()
        found.update(patched)
        self._touch(found)
        return web.json_response(found)

    async def _bind(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if self.stall_bindings is not None:
            await self.stall_bindings.wait()
        if self.fail_bindings:
            code, message = self.fail_bindings.pop(0)
            return status(code, "InternalError" if code >= 500 else "BadRequest", message)
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        try:
            binding = json.loads(await request.read())
            target = binding["target"]["name"]
        except (ValueError, KeyError, TypeError):
            return status(400, "BadRequest", "Binding: target.name: Required value")
        wanted_uid = (binding.get("metadata") or {}).get("uid")
        uid = found["metadata"]["uid"]
        if wanted_uid and wanted_uid != uid:
            return _conflict(name, f"Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: {uid}")
        if found["spec"].get("nodeName"):
            return _conflict(name, f'pod {name} is already assigned to node "{found["spec"]["nodeName"]}"')
        found["spec"]["nodeName"] = target
        self._touch(found)
        self.bindings.append(binding)
        return status(201, "", "")

    async def _get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        found = self.nodes.get(name)
        if found is None:
            return status(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
        return web.json_response(found)

    async def _list_pods(self, request: web.Request) -> web.Response:
        failure = self.fail_lists.pop(0) if self.fail_lists else None
        if failure is not None:
            code, message = failure
            return status(code, "InternalError" if code >= 500 else "BadRequest", message)
        try:
            limit = int(request.query.get("limit") or 0)
        except ValueError:
            return status(400, "BadRequest", f"limit: Invalid value: {request.query['limit']!r}")
        token = request.query.get("continue")
        if token:
            found = self._continued(token)
            if found is None:
                expired = "The provided continue parameter is too old to display a consistent list result."
                return status(410, "Expired", expired)
            version, start, pods = found
        else:
            version, start = self._version, 0
            pods = [copy.deepcopy(self.pods[key]) for key in sorted(self.pods)]
        page = pods[start : start + limit] if limit else pods[start:]
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        rest = len(pods) - start - len(page)
        if limit and rest > 0:
            self._snapshots[version] = pods
            meta["continue"] = _continue_token(version, start + len(page))
            meta["remainingItemCount"] = rest
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})

    def _continued(self, token: str) -> tuple[int, int, list[dict[str, Any]]] | None:
        try:
            raw = json.loads(base64.urlsafe_b64decode(token.encode()))
            version, start = int(raw["rv"]), int(raw["start"])
        except (ValueError, KeyError, TypeError):
            return None
        pods = self._snapshots.get(version)
        return None if pods is None else (version, start, pods)


def _continue_token(version: int, start: int) -> str:
    """Opaque to clients, like the real one (which also encodes a version and where to go on)."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": version, "start": start})
    return base64.urlsafe_b64encode(raw.encode()).decode()
