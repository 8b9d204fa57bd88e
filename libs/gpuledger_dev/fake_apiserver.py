"""A small fake kube-apiserver: the real REST paths, status codes and ``Status`` bodies for the calls
gpuledger makes, checked against a real kube-apiserver by tests/e2e/test_fake_contract.py.

Pods (``/api/v1/namespaces/{ns}/pods``): create, get, list (also ``/api/v1/pods``, every namespace),
JSON merge patch and strategic merge patch (taken as a merge patch: the same for maps such as
annotations and labels, where ``null`` deletes a key), PUT, the ``status`` subresource (a write of
the pod leaves ``status`` alone, a write of ``/status`` leaves ``spec`` alone), delete, and
``/binding`` (with the UID as a precondition). Nodes (``/api/v1/nodes``): create, get, patch, delete,
list (whole, no selectors or pages) and watch.

As the real server does: a created pod is defaulted and its resources written in canonical form
(``4000`` reads back as ``4k``; see ``apiserver_rules`` and ``quantity``), and refused with 422
naming the field when validation fails; every write that changes an object gives it a new
``resourceVersion`` (one that changes nothing keeps it); a write carrying a stale
``metadata.resourceVersion`` is 409 ``Conflict``; deleting a pod bound to a node marks it
(``deletionTimestamp``, ``deletionGracePeriodSeconds``) until a delete with
``gracePeriodSeconds=0`` removes it, and an unbound one goes at once. Lists come in pages when
asked (``limit``; ``metadata.continue`` names the next page, served from the first page's
snapshot); a continue token that cannot be read is 400, one whose snapshot is gone 410 ``Expired``.
Pod lists and watches take field selectors; a watch (``watch=true``) starts from a version a listing
returned, or from now (see ``apiserver_watch``). Namespaces are not modelled (any namespace exists),
nor are label selectors (refused, 400).

Tests set state directly with ``add_pod`` (defaulted as a create would, status as given),
``set_phase``, ``delete_pod`` (gone at once, as after the kubelet's confirmation) and ``add_node``;
expire continue tokens and the versions watches may start from with ``expire_continues`` (``compact``
also makes every version so far too old to watch from); take the
server down and up on the same port with ``close`` and ``start``. Faults: ``fail_lists`` (answer
the next list requests with a status, or normally for ``None``), ``fail_bindings``,
``stall_bindings`` (hold bindings until released); ``requests`` records every call.
``kubeconfig()`` writes a file that points a real client here.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuledger_dev import apiserver_rules as rules
from gpuledger_dev.apiserver_http import (
    continue_token,
    continued,
    grace_period,
    list_limit,
    read_object,
    route,
    written,
)
from gpuledger_dev.apiserver_status import (
    FieldError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    modified,
    not_found,
    status,
)
from gpuledger_dev.apiserver_watch import BOOKMARK_S, TRUE, Selector, Watches, selector_from, serve_watch
from gpuledger_dev.natsserver import free_port

PODS = "/api/v1/namespaces/{namespace}/pods"
POD_PATH = PODS + "/{name}"
NODE_PATH = "/api/v1/nodes/{name}"
UNFILTERED = ("labelSelector",)  # what lists here cannot do
EXPIRED = "The provided continue parameter is too old to display a consistent list result."
Object = dict[str, Any]


class FakeApiServer:
    def __init__(self, token: str = "fake-token") -> None:
        self.token = token
        self.pods: dict[tuple[str, str], Object] = {}
        self.nodes: dict[str, Object] = {}
        self.bindings: list[Object] = []
        self.requests: list[tuple[str, str]] = []
        self.fail_bindings: list[tuple[int, str]] = []
        self.fail_lists: list[tuple[int, str] | None] = []  # None: answer that one normally
        self._snapshots: dict[tuple[int, str], list[Object]] = {}  # (resourceVersion, namespace) -> pods
        self._watches = Watches()
        self._node_watches = Watches()
        self._final: dict[str, Object] = {}  # uid -> a pod's last state, written just before it went
        self._stopping = asyncio.Event()  # set while closing: open watches end
        self.bookmark_s = BOOKMARK_S  # how often open watches get a bookmark
        self.stall_bindings: asyncio.Event | None = None
        self._version = 1
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- state, for tests ---

    def add_pod(self, pod: Mapping[str, Any]) -> Object:
        """Store ``pod`` as if created (defaulted, canonical resources; ``rules.Undecodable`` for a
        quantity that is not one) and then given the status it carries, without validation."""
        stored = rules.defaulted(pod)
        meta = stored.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("annotations", {})
        self._created(stored, "Pod")
        stored.setdefault("status", {"phase": "Pending"})
        self.pods[(meta["namespace"], meta["name"])] = stored
        return stored

    def pod(self, namespace: str, name: str) -> Object:
        return self.pods[(namespace, name)]

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        found = self.pods[(namespace, name)]
        found.setdefault("status", {})["phase"] = phase
        self._touch(found)

    def annotate(self, namespace: str, name: str, key: str, value: str) -> None:
        """Set one annotation as a write would: a new version, which open watches send."""
        found = self.pods[(namespace, name)]
        found["metadata"].setdefault("annotations", {})[key] = value
        self._touch(found)

    def delete_pod(self, namespace: str, name: str) -> None:
        del self.pods[(namespace, name)]
        self._version += 1

    def expire_continues(self) -> None:
        self._snapshots.clear()
        self._watches.forget()
        self._node_watches.forget()

    def compact(self) -> None:
        """As etcd's compaction: every version so far is too old to watch from (410); open
        watches go on."""
        self.expire_continues()
        self._version += 1
        self._watches.compacted = self._node_watches.compacted = self._version

    def add_node(self, name: str, allocatable: Mapping[str, str] | None = None) -> None:
        """A Node, with ``status.allocatable`` (and capacity) where given, as its kubelet registers it."""
        node: Object = {"metadata": {"name": name}}
        if allocatable is not None:
            node["status"] = {"capacity": dict(allocatable), "allocatable": dict(allocatable)}
        self.nodes[name] = self._created(node, "Node")

    def _created(self, obj: Object, kind: str) -> Object:
        obj.update(kind=kind, apiVersion="v1")
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.update(creationTimestamp=rules.timestamp(), generation=1)
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(key, None)
        self._touch(obj)
        return obj

    def _touch(self, obj: Object) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    # --- serving ---

    async def start(self) -> FakeApiServer:
        self._stopping.clear()
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/api/v1/pods", self._list_pods)
        app.router.add_get(PODS, self._list_pods)
        app.router.add_post(PODS, self._create_pod)
        for path in (POD_PATH, POD_PATH + "/status"):
            app.router.add_get(path, self._get_pod)
            app.router.add_patch(path, self._write_pod)
            app.router.add_put(path, self._write_pod)
        app.router.add_delete(POD_PATH, self._delete_pod)
        app.router.add_post(POD_PATH + "/binding", self._bind)
        app.router.add_post("/api/v1/nodes", self._create_node)
        app.router.add_get("/api/v1/nodes", self._list_nodes)
        app.router.add_get(NODE_PATH, self._get_node)
        app.router.add_patch(NODE_PATH, self._write_node)
        app.router.add_delete(NODE_PATH, self._delete_node)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = self.port or free_port()  # started again: the same address
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def close(self) -> None:
        self._stopping.set()
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
        given = request.headers.get("Authorization")
        if given is None:
            return status(403, "Forbidden", f'User "system:anonymous" cannot {request.method} {request.path}')
        if given != f"Bearer {self.token}":
            return status(401, "Unauthorized", "Unauthorized")
        response: web.StreamResponse = await handler(request)
        return response

    # --- pods ---

    def _find(self, request: web.Request) -> Object | web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return self.pods.get((namespace, name)) or not_found("pods", name)

    async def _get_pod(self, request: web.Request) -> web.Response:
        found = self._find(request)
        return found if isinstance(found, web.Response) else web.json_response(found)

    async def _create_pod(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        body = await read_object(request, "Pod")
        if isinstance(body, web.Response):
            return body
        meta = body["metadata"]
        if meta.setdefault("namespace", namespace) != namespace:
            return bad_request("the namespace of the provided object does not match the namespace sent on the request")
        try:
            pod = rules.defaulted(body)
        except rules.Undecodable as err:
            return bad_request(f'Pod in version "v1" cannot be handled as a Pod: {err}')
        name = str(meta.get("name") or "")
        errors = rules.creation_errors(pod)
        if errors:
            return invalid("Pod", name, errors)
        if (namespace, name) in self.pods:
            return already_exists("pods", name)
        pod["metadata"].pop("uid", None)
        pod["status"] = {"phase": "Pending", "qosClass": rules.qos_class(pod)}
        self.pods[(namespace, name)] = self._created(pod, "Pod")
        return web.json_response(pod, status=201)

    async def _write_pod(self, request: web.Request) -> web.Response:
        """PATCH or PUT of a pod or its ``status``."""
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        new = await written(request, found, "Pod")
        if isinstance(new, web.Response):
            return new
        if route(request).endswith("/status"):
            new["spec"] = found.get("spec")
            new["metadata"].pop("ownerReferences", None)
            if "ownerReferences" in found["metadata"]:
                new["metadata"]["ownerReferences"] = found["metadata"]["ownerReferences"]
        else:
            new["status"] = found.get("status")
        try:
            new = rules.defaulted(new)
        except rules.Undecodable as err:
            return bad_request(f'Pod in version "v1" cannot be handled as a Pod: {err}')
        return self._update(found, new, "pods", rules.update_errors(found, new))

    async def _delete_pod(self, request: web.Request) -> web.Response:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        grace = await grace_period(request)
        if isinstance(grace, web.Response):
            return grace
        deletion = rules.delete(found, grace)
        if deletion is not rules.Deletion.UNCHANGED:
            self._touch(found)  # the deletion is written first (a watch sees it MODIFIED) ...
        if deletion is rules.Deletion.GONE:  # ... then the pod goes (DELETED)
            meta = found["metadata"]
            self._final[str(meta["uid"])] = copy.deepcopy(found)
            del self.pods[(meta["namespace"], meta["name"])]
            self._version += 1
        return web.json_response(found)

    async def _bind(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if self.stall_bindings is not None:
            await self.stall_bindings.wait()
        if self.fail_bindings:
            code, message = self.fail_bindings.pop(0)
            return status(code, "InternalError" if code >= 500 else "BadRequest", message)
        binding = await read_object(request, "Binding")
        if isinstance(binding, web.Response):
            return binding
        meta = binding["metadata"]
        if meta.get("name") != name:
            return bad_request("name in URL does not match name in Binding object")
        target = str((binding.get("target") or {}).get("name") or "")
        if not target:
            return status(500, message="target.name: Required value")
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        failed = rules.binding_precondition(found, meta)
        if failed:
            return conflict("pods", name, failed)
        node = found["spec"].get("nodeName")
        if found["metadata"].get("deletionTimestamp"):
            return conflict("pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host")
        if node:
            return conflict("pods/binding", name, f'pod {name} is already assigned to node "{node}"')
        found["spec"]["nodeName"] = target
        annotations = meta.get("annotations") or {}
        if annotations:  # kube-apiserver copies a Binding's annotations onto the pod
            found["metadata"].setdefault("annotations", {}).update(annotations)
        scheduled = {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                     "lastTransitionTime": rules.timestamp()}
        conditions = found.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"] + [scheduled]
        self._touch(found)
        self.bindings.append(binding)
        return status(201)

    async def _list_pods(self, request: web.Request) -> web.StreamResponse:
        failure = self.fail_lists.pop(0) if self.fail_lists else None
        if failure is not None:
            code, message = failure
            return status(code, "InternalError" if code >= 500 else "BadRequest", message)
        unfiltered = [key for key in UNFILTERED if request.query.get(key)]
        if unfiltered:
            return bad_request(f"the fake API server cannot {', '.join(unfiltered)}")
        selector = selector_from(request.query.get("fieldSelector", ""))
        if isinstance(selector, web.Response):
            return selector
        namespace = request.match_info.get("namespace", "")
        if request.query.get("watch") in TRUE:
            wanted = request.query.get("resourceVersion", "")
            sent = self._watches.start(wanted, self._version, self.pods)
            oldest = self._watches.oldest(self._version)
            return await serve_watch(
                request,
                selector,
                namespace,
                sent,
                lambda: self.pods,
                self._final,
                lambda: self._version,
                oldest,
                self._stopping,
                self.bookmark_s,
            )
        limit = list_limit(request)
        if isinstance(limit, web.Response):
            return limit
        token = request.query.get("continue")
        if token:
            found = self._continued(token, namespace)
            if isinstance(found, web.Response):
                return found
            version, start, pods = found
        else:
            version, start = self._version, 0
            pods = [pod for pod in self._listing(namespace) if selector.matches(pod)]
            self._watches.listed(version, self.pods)
        page = pods[start : start + limit] if limit else pods[start:]
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        rest = len(pods) - start - len(page)
        if limit and rest > 0:
            self._snapshots[(version, namespace)] = pods
            meta["continue"] = continue_token(version, start + len(page))
            meta["remainingItemCount"] = rest
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})

    def _listing(self, namespace: str) -> list[Object]:
        """The pods in etcd's key order (``namespace/name``), as list items (no kind)."""
        keys = sorted((k for k in self.pods if not namespace or k[0] == namespace), key="/".join)
        items = [copy.deepcopy(self.pods[key]) for key in keys]
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return items

    def _continued(self, token: str, namespace: str) -> tuple[int, int, list[Object]] | web.Response:
        found = continued(token)
        if isinstance(found, web.Response):
            return found
        version, start = found
        pods = self._snapshots.get((version, namespace))
        return status(410, "Expired", EXPIRED) if pods is None else (version, start, pods)

    # --- nodes ---

    async def _create_node(self, request: web.Request) -> web.Response:
        body = await read_object(request, "Node")
        if isinstance(body, web.Response):
            return body
        name = str(body["metadata"].get("name") or "")
        if not name:
            return invalid("Node", name, [FieldError("metadata.name", "Required", "name or generateName is required")])
        if name in self.nodes:
            return already_exists("nodes", name)
        body["metadata"].pop("uid", None)
        self.nodes[name] = self._created(body, "Node")
        return web.json_response(body, status=201)

    async def _list_nodes(self, request: web.Request) -> web.StreamResponse:
        """Every Node in name order, or a watch of them; no selectors or pages here."""
        unsupported = [key for key in ("labelSelector", "fieldSelector", "limit", "continue") if request.query.get(key)]
        if unsupported:
            return bad_request(f"the fake API server cannot list nodes by {', '.join(unsupported)}")
        if request.query.get("watch") in TRUE:
            sent = self._node_watches.start(request.query.get("resourceVersion", ""), self._version, self.nodes)
            oldest = self._node_watches.oldest(self._version)
            nodes, version = (lambda: self.nodes), (lambda: self._version)
            return await serve_watch(
                request, Selector(), "", sent, nodes, {}, version, oldest, self._stopping, self.bookmark_s, "Node"
            )
        self._node_watches.listed(self._version, self.nodes)
        items = [copy.deepcopy(self.nodes[name]) for name in sorted(self.nodes)]
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        meta = {"resourceVersion": str(self._version)}
        return web.json_response({"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": items})

    def _find_node(self, request: web.Request) -> Object | web.Response:
        name = request.match_info["name"]
        return self.nodes.get(name) or not_found("nodes", name)

    async def _get_node(self, request: web.Request) -> web.Response:
        found = self._find_node(request)
        return found if isinstance(found, web.Response) else web.json_response(found)

    async def _write_node(self, request: web.Request) -> web.Response:
        found = self._find_node(request)
        if isinstance(found, web.Response):
            return found
        new = await written(request, found, "Node")
        return new if isinstance(new, web.Response) else self._update(found, new, "nodes", [])

    async def _delete_node(self, request: web.Request) -> web.Response:
        found = self._find_node(request)
        if isinstance(found, web.Response):
            return found
        name = request.match_info["name"]
        del self.nodes[name]
        self._version += 1
        return status(200, details={"name": name, "kind": "nodes", "uid": found["metadata"]["uid"]}, coded=False)

    # --- writes ---

    def _update(self, old: Object, new: Object, resource: str, errors: list[FieldError]) -> web.Response:
        """Store ``new`` over ``old``: system metadata kept, a stale resourceVersion refused; a
        write that changes nothing keeps the resourceVersion."""
        meta, was = new["metadata"], old["metadata"]
        name = str(was["name"])
        wanted = meta.get("resourceVersion")
        if wanted and wanted != was["resourceVersion"]:
            return modified(resource, name)
        errors = rules.immutable_errors(was, meta) + errors
        if errors:
            return invalid(str(old.get("kind") or resource), name, errors)
        rules.keep_system_meta(was, meta)
        if new == old:
            return web.json_response(old)
        if new.get("spec") != old.get("spec") and "generation" in meta:
            meta["generation"] = int(meta["generation"]) + 1
        old.clear()
        old.update(new)
        self._touch(old)
        return web.json_response(old)

