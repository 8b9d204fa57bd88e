"""The contract between the fake API server (gpuledger_dev.fake_apiserver) and the real
kube-apiserver: every test runs twice, against each (fixture ``server``), with the same body and
the same assertions, over HTTP(S) through one small client.

What is covered is what gpuledger's code relies on (the Kubernetes adapters of placement, the
allocator and the inventory) and what its tests lean on the fake for: pods read, created, patched
(merge and strategic, ``null`` deleting a key), put, bound (UID precondition; 201, 409, 404),
listed in pages from one snapshot, and deleted (gracefully when bound to a node); the status
subresource; resourceVersion conflicts; canonical quantities; node labels read and patched; and
the ``Status`` bodies of every refusal; Nodes listed and watched. The last tests run the adapters
themselves against both.

The real server's pods are bound to a node name with no Node object, so kwok leaves them alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gpuledger_allocator.kube import KubePodLister
from gpuledger_common.kubeconfig import from_file
from gpuledger_core.errors import Conflict, NotFound, Unavailable
from gpuledger_dev.controlplane.cluster import ControlPlane
from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_inventory.kube import KubeNodeApi
from gpuledger_placement.hosts import HostUsage, follow
from gpuledger_placement.kube import KubePodApi
from tests.support.waiting import polled, wait_for

# 120 s: the first real test also starts the control plane.
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120)]

JSON, MERGE, STRATEGIC = "application/json", "application/merge-patch+json", "application/strategic-merge-patch+json"
NOWHERE = "contract-nowhere"  # a node name with no Node object: kwok leaves its pods alone
GPU, GPU_MEM = "gpuledger.io/gpu", "gpuledger.io/gpu-mem"
_namespaces = itertools.count()

# (as written, as read back): a memory limit keeps the format of its suffix, written in the largest
# suffix that holds it exactly, rounded up to milli units; some strings come back as they were sent.
QUANTITIES = [
    ("4000", "4k"), ("1024Mi", "1Gi"), ("2048", "2048"), ("1000m", "1"), ("0.5", "500m"), ("1.5k", "1500"),
    ("1e3", "1e3"), ("1E3", "1E3"), ("1e7", "10e6"), ("12e2", "1200"), ("1.5e-3", "2e-3"), ("5n", "1m"),
    ("0Gi", "0"), ("1.5Gi", "1536Mi"), ("1.0001Ki", "1024103m"), ("0.5Ki", "512"), ("1000Ki", "1000Ki"),
    ("2048Ki", "2Mi"), ("4000000", "4M"), ("1.10", "1100m"), ("+5", "+5"), ("007", "007"), ("1.G", "1.G"),
    ("1000E", "1"), ("100000000000000000000", "100E"), ("9Ei", "9223372036854775807"),
    ("1234567890123456789", "1234567890123456789"), ("1.23456789e3", "1234568e-3"), ("3Ei", "3Ei"),
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: Any


class Http:
    """The test's one client of either server: aiohttp, the bearer token, TLS with the CA where given."""

    def __init__(self, url: str, token: str, ca_pem: bytes | None) -> None:
        self.url, self.token = url, token
        self._ssl = ssl.create_default_context(cadata=ca_pem.decode()) if ca_pem else None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Http:
        connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl else aiohttp.TCPConnector()
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(self, method: str, path: str, body: Any = None, content_type: str = JSON,
                   params: Mapping[str, str] | None = None, token: str | None = None) -> Reply:
        assert self._session is not None
        headers = {"Authorization": f"Bearer {token or self.token}", "Accept": JSON}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        async with self._session.request(method, self.url + path, data=data, headers=headers, params=params) as got:
            raw = await got.read()
            return Reply(got.status, json.loads(raw) if raw else None)


@dataclass(frozen=True, slots=True)
class Server:
    kind: str  # fake or real
    http: Http
    namespace: str
    kubeconfig: Path

    def pods(self, name: str = "", sub: str = "") -> str:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    @property
    def node(self) -> str:
        return f"{self.namespace}-node"

    async def create(self, name: str, limits: Mapping[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        made = await self.http.call("POST", self.pods(), pod(name, limits, **spec))
        assert made.status == 201, made.body
        return dict(made.body)

    async def get(self, name: str) -> Reply:
        return await self.http.call("GET", self.pods(name))

    async def patch(self, name: str, body: Any, content_type: str = MERGE, sub: str = "") -> Reply:
        return await self.http.call("PATCH", self.pods(name, sub), body, content_type)

    async def bind(self, name: str, node: str = NOWHERE, uid: str = "",
                   annotations: Mapping[str, str] | None = None) -> Reply:
        meta: dict[str, Any] = {"name": name, **({"uid": uid} if uid else {})}
        if annotations:
            meta["annotations"] = dict(annotations)
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        return await self.http.call("POST", self.pods(name, "binding"), binding)

    async def delete(self, name: str, grace_s: int | None = None) -> Reply:
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace_s}
        return await self.http.call("DELETE", self.pods(name), None if grace_s is None else options)


def pod(name: str, limits: Mapping[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "cuda"}
    if limits is not None:
        container["resources"] = {"limits": dict(limits)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": {"a": "1"}},
            "spec": {"containers": [container], **spec}}


@pytest_asyncio.fixture(params=["fake", "real"], loop_scope="session")
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Server]:
    """The fake (started in the test's loop) or the session's real control plane, a namespace each."""
    namespace = f"contract-{next(_namespaces)}"
    if request.param == "fake":
        fake = await FakeApiServer().start()
        try:
            async with Http(fake.url, fake.token, None) as http:
                yield Server("fake", http, namespace, fake.kubeconfig(tmp_path / "kubeconfig"))
        finally:
            await fake.close()
        return
    control_plane: ControlPlane = request.getfixturevalue("control_plane")
    access = control_plane.access
    assert access is not None
    async with Http(access.server, access.token, access.ca_pem) as http:
        made = await http.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        assert made.status == 201, made.body
        try:
            yield Server("real", http, namespace, access.kubeconfig(tmp_path / "kubeconfig"))
        finally:
            await http.call("DELETE", f"/api/v1/namespaces/{namespace}/pods", params={"gracePeriodSeconds": "0"})
            await http.call("DELETE", f"/api/v1/nodes/{namespace}-node")
            await http.call("DELETE", f"/api/v1/namespaces/{namespace}")


def assert_status(reply: Reply, code: int, reason: str | None, details: Mapping[str, Any] | None = None,
                  coded: bool = True) -> None:
    """A ``Status`` body as the real server writes it (``reason`` None: it has none; ``coded``
    False: the body has no ``code``, as a deletion's success)."""
    body = reply.body
    assert reply.status == code, body
    assert isinstance(body, dict) and body["kind"] == "Status" and body["apiVersion"] == "v1", body
    assert body["status"] == ("Success" if code < 400 else "Failure"), body
    assert body.get("code") == (code if coded else None) and body.get("reason") == reason, body
    if details is not None:
        assert body.get("details") == details, body


def resources(made: Mapping[str, Any], at: int = 0) -> dict[str, Any]:
    return dict(made["spec"]["containers"][at]["resources"])


# --- quantities ---


async def test_quantities_read_back_in_canonical_form(server: Server) -> None:
    containers = [{"name": f"c{at}", "image": "cuda", "resources": {"limits": {"memory": written}}}
                  for at, (written, _) in enumerate(QUANTITIES)]
    body = {"metadata": {"name": "quantities"}, "spec": {"containers": containers}}
    made = await server.http.call("POST", server.pods(), body)
    assert made.status == 201, made.body
    read = (await server.get("quantities")).body
    got = {written: resources(read, at)["limits"]["memory"] for at, (written, _) in enumerate(QUANTITIES)}
    assert got == dict(QUANTITIES)
    assert [resources(made.body, at)["limits"]["memory"] for at in range(len(QUANTITIES))] == list(got.values())


async def test_extended_resources_are_canonical_and_requests_default_to_limits(server: Server) -> None:
    limits = {GPU: "1", GPU_MEM: "4000", "cpu": "1000m", "memory": "1024Mi"}
    made = await server.create("gpu", limits)
    stored = {GPU: "1", GPU_MEM: "4k", "cpu": "1", "memory": "1Gi"}
    assert resources(made) == {"limits": stored, "requests": stored}
    assert made["status"] == {"phase": "Pending", "qosClass": "Guaranteed"}
    for written, read in (("2048", "2048"), ("1024Mi", "1Gi"), ("4k", "4k")):
        again = await server.create(f"mem-{written.lower()}", {GPU: "1", GPU_MEM: written})
        assert resources(again)["requests"][GPU_MEM] == resources(again)["limits"][GPU_MEM] == read


async def test_a_request_below_its_limit_is_kept_and_the_pod_is_burstable(server: Server) -> None:
    body = pod("burst")
    body["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}, "requests": {"cpu": "500m"}}
    made = await server.http.call("POST", server.pods(), body)
    assert made.status == 201, made.body
    assert resources(made.body) == {"limits": {"cpu": "2"}, "requests": {"cpu": "500m"}}
    assert made.body["status"]["qosClass"] == "Burstable"


RESOURCES = "spec.containers[0].resources"
REFUSED = {  # resources given: the field named, and why
    "fraction": ({"limits": {GPU_MEM: "500m"}}, f"{RESOURCES}.limits[{GPU_MEM}]",
                 'Invalid value: "500m": must be an integer'),
    "negative": ({"limits": {GPU_MEM: "-1"}}, f"{RESOURCES}.limits[{GPU_MEM}]",
                 'Invalid value: "-1": must be greater than or equal to 0'),
    "request-without-limit": ({"requests": {GPU_MEM: "1"}}, f"{RESOURCES}.limits",
                              "Required value: Limit must be set for non overcommitable resources"),
    "request-not-the-limit": ({"limits": {GPU_MEM: "2"}, "requests": {GPU_MEM: "1"}}, f"{RESOURCES}.requests",
                              f'Invalid value: "1": must be equal to {GPU_MEM} limit of 2'),
    "request-over-limit": ({"limits": {"cpu": "500m"}, "requests": {"cpu": "600m"}}, f"{RESOURCES}.requests",
                           'Invalid value: "600m": must be less than or equal to cpu limit of 500m'),
}


@pytest.mark.parametrize(("given", "field", "why"), list(REFUSED.values()), ids=list(REFUSED))
async def test_invalid_resources_are_refused_naming_the_field(
    server: Server, given: dict[str, Any], field: str, why: str
) -> None:
    body = pod("refused")
    body["spec"]["containers"][0]["resources"] = given
    refused = await server.http.call("POST", server.pods(), body)
    assert_status(refused, 422, "Invalid")
    details = refused.body["details"]
    assert details["name"] == "refused" and details["kind"] == "Pod", details
    assert {"field": field, "message": why} in [{k: c[k] for k in ("field", "message")} for c in details["causes"]]
    assert refused.body["message"].startswith('Pod "refused" is invalid: '), refused.body
    assert f"{field}: {why}" in refused.body["message"], refused.body
    assert (await server.get("refused")).status == 404


async def test_a_quantity_that_is_not_one_is_a_bad_request(server: Server) -> None:
    refused = await server.http.call("POST", server.pods(), pod("garbage", {GPU_MEM: "4x"}))
    assert_status(refused, 400, "BadRequest")
    assert "quantities must match the regular expression" in refused.body["message"], refused.body


# --- the status subresource ---


async def test_a_patch_of_the_pod_leaves_its_status_alone(server: Server) -> None:
    await server.create("p")
    patched = await server.patch("p", {"metadata": {"annotations": {"b": "2"}}, "status": {"phase": "Running"}})
    assert patched.status == 200, patched.body
    assert patched.body["status"]["phase"] == "Pending"
    assert patched.body["metadata"]["annotations"] == {"a": "1", "b": "2"}


async def test_a_patch_of_status_changes_the_status_and_leaves_the_spec_alone(server: Server) -> None:
    await server.create("p")
    patch = {"status": {"phase": "Running"}, "spec": {"nodeName": "elsewhere"}}
    patched = await server.patch("p", patch, sub="status")
    assert patched.status == 200, patched.body
    assert patched.body["status"]["phase"] == "Running"
    assert "nodeName" not in patched.body["spec"]
    read = (await server.http.call("GET", server.pods("p", "status"))).body
    assert read["status"]["phase"] == "Running" and read["metadata"]["name"] == "p"


async def test_a_pod_spec_takes_only_permitted_changes(server: Server) -> None:
    await server.create("p")
    refused = await server.patch("p", {"spec": {"nodeName": NOWHERE}})
    assert_status(refused, 422, "Invalid")
    assert [c["field"] for c in refused.body["details"]["causes"]] == ["spec"], refused.body
    assert "pod updates may not change fields other than" in refused.body["message"]
    # An image without a tag, as the first: the real server's defaulted imagePullPolicy stays the same.
    image = await server.patch("p", {"spec": {"containers": [{"name": "app", "image": "cuda-12"}]}})
    assert image.status == 200 and image.body["spec"]["containers"][0]["image"] == "cuda-12", image.body
    uid = await server.patch("p", {"metadata": {"uid": "another"}})
    assert_status(uid, 422, "Invalid")
    assert 'metadata.uid: Invalid value: "another": field is immutable' in uid.body["message"]


# --- resourceVersion ---


async def test_every_write_changes_the_resource_version_and_a_write_of_nothing_keeps_it(server: Server) -> None:
    versions = [(await server.create("p"))["metadata"]["resourceVersion"]]
    annotate = {"metadata": {"annotations": {"b": "2"}}}
    versions.append((await server.patch("p", annotate)).body["metadata"]["resourceVersion"])
    assert (await server.get("p")).body["metadata"]["resourceVersion"] == versions[-1]
    assert (await server.patch("p", annotate)).body["metadata"]["resourceVersion"] == versions[-1]
    assert (await server.bind("p")).status == 201
    versions.append((await server.get("p")).body["metadata"]["resourceVersion"])
    running = await server.patch("p", {"status": {"phase": "Running"}}, sub="status")
    versions.append(running.body["metadata"]["resourceVersion"])
    assert all(isinstance(v, str) for v in versions) and len(set(versions)) == len(versions), versions


async def test_a_put_with_a_stale_resource_version_is_a_conflict(server: Server) -> None:
    old = await server.create("p")
    assert (await server.patch("p", {"metadata": {"labels": {"l": "1"}}})).status == 200
    old["metadata"]["annotations"]["put"] = "1"
    stale = await server.http.call("PUT", server.pods("p"), old)
    assert_status(stale, 409, "Conflict", {"name": "p", "kind": "pods"})
    assert stale.body["message"] == ('Operation cannot be fulfilled on pods "p": the object has been modified; '
                                     "please apply your changes to the latest version and try again")
    fresh = (await server.get("p")).body
    fresh["metadata"]["annotations"]["put"] = "1"
    put = await server.http.call("PUT", server.pods("p"), fresh)
    assert put.status == 200 and put.body["metadata"]["annotations"]["put"] == "1", put.body
    assert put.body["metadata"]["labels"] == {"l": "1"}
    del fresh["metadata"]["resourceVersion"]
    fresh["metadata"]["annotations"]["unconditional"] = "1"
    assert (await server.http.call("PUT", server.pods("p"), fresh)).status == 200


async def test_a_patch_carrying_a_stale_resource_version_is_a_conflict(server: Server) -> None:
    made = await server.create("p")
    was = made["metadata"]["resourceVersion"]
    assert (await server.patch("p", {"metadata": {"annotations": {"b": "2"}}})).status == 200
    stale = await server.patch("p", {"metadata": {"resourceVersion": was, "annotations": {"c": "3"}}})
    assert_status(stale, 409, "Conflict", {"name": "p", "kind": "pods"})
    now = (await server.get("p")).body["metadata"]["resourceVersion"]
    failed = {"metadata": {"resourceVersion": was}, "status": {"phase": "Failed"}}
    stale_status = await server.patch("p", failed, sub="status")
    assert_status(stale_status, 409, "Conflict", {"name": "p", "kind": "pods"})
    current = await server.patch("p", {"metadata": {"resourceVersion": now, "annotations": {"c": "3"}}})
    assert current.status == 200 and current.body["metadata"]["annotations"]["c"] == "3", current.body


# --- graceful deletion ---


async def test_a_bound_pod_is_deleted_gracefully_until_a_zero_grace_delete(server: Server) -> None:
    await server.create("p")
    assert (await server.bind("p")).status == 201
    deleting = await server.delete("p", grace_s=60)
    assert deleting.status == 200 and deleting.body["kind"] == "Pod", deleting.body
    meta = (await server.get("p")).body["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 60 and meta["deletionTimestamp"], meta
    assert meta["deletionTimestamp"] == deleting.body["metadata"]["deletionTimestamp"]
    longer = await server.delete("p", grace_s=120)
    assert longer.status == 200 and longer.body["metadata"] == meta, longer.body
    shorter = (await server.delete("p", grace_s=10)).body["metadata"]
    assert shorter["deletionGracePeriodSeconds"] == 10 and shorter["resourceVersion"] != meta["resourceVersion"]
    assert (await server.patch("p", {"metadata": {"annotations": {"still": "here"}}})).status == 200
    rebound = await server.bind("p")
    assert_status(rebound, 409, "Conflict", {"name": "p", "kind": "pods/binding"})
    assert rebound.body["message"].endswith("pod p is being deleted, cannot be assigned to a host")
    gone = await server.http.call("DELETE", server.pods("p"), params={"gracePeriodSeconds": "0"})
    assert gone.status == 200 and gone.body["metadata"]["deletionGracePeriodSeconds"] == 0, gone.body
    assert_status(await server.get("p"), 404, "NotFound", {"name": "p", "kind": "pods"})


async def test_a_pod_on_no_node_is_deleted_at_once(server: Server) -> None:
    await server.create("p")
    deleted = await server.delete("p", grace_s=30)
    assert deleted.status == 200 and deleted.body["metadata"]["deletionGracePeriodSeconds"] == 0, deleted.body
    missing = await server.get("p")
    assert_status(missing, 404, "NotFound", {"name": "p", "kind": "pods"})
    assert missing.body["message"] == 'pods "p" not found'


async def test_a_delete_without_options_waits_the_pods_own_grace_period(server: Server) -> None:
    await server.create("p", nodeName=NOWHERE, terminationGracePeriodSeconds=45)
    deleting = await server.http.call("DELETE", server.pods("p"))
    assert deleting.body["metadata"]["deletionGracePeriodSeconds"] == 45, deleting.body
    await server.create("q", nodeName=NOWHERE)
    assert (await server.get("q")).body["spec"]["terminationGracePeriodSeconds"] == 30
    assert (await server.delete("q")).body["metadata"]["deletionGracePeriodSeconds"] == 30


async def test_a_missing_pod_is_not_found_with_a_status(server: Server) -> None:
    expected = {"name": "nope", "kind": "pods"}
    for reply in (await server.get("nope"), await server.patch("nope", {"metadata": {}}),
                  await server.delete("nope"), await server.bind("nope")):
        assert_status(reply, 404, "NotFound", expected)
        assert reply.body["message"] == 'pods "nope" not found'


# --- binding ---


async def test_a_binding_sets_the_node_and_answers_201_success(server: Server) -> None:
    made = await server.create("p")
    bound = await server.bind("p", uid=made["metadata"]["uid"])
    assert_status(bound, 201, None)
    assert set(bound.body) == {"kind", "apiVersion", "metadata", "status", "code"}, bound.body
    read = (await server.get("p")).body
    assert read["spec"]["nodeName"] == NOWHERE
    assert {"type": "PodScheduled", "status": "True"} in [
        {k: c[k] for k in ("type", "status")} for c in read["status"]["conditions"]]


async def test_a_bindings_annotations_are_written_onto_the_pod_with_the_node(server: Server) -> None:
    """Placement's bind relies on it: the allocation annotation and the node land in one write."""
    made = await server.create("p")
    await server.patch("p", {"metadata": {"annotations": {"kept": "yes"}}})
    bound = await server.bind("p", uid=made["metadata"]["uid"], annotations={"gpuledger.io/allocation": "{}"})
    assert_status(bound, 201, None)
    read = (await server.get("p")).body
    assert read["spec"]["nodeName"] == NOWHERE
    assert read["metadata"]["annotations"] == {"a": "1", "kept": "yes", "gpuledger.io/allocation": "{}"}


@pytest.mark.parametrize("node", [NOWHERE, "another-node"])
async def test_a_second_binding_is_a_conflict(server: Server, node: str) -> None:
    made = await server.create("p")
    assert (await server.bind("p")).status == 201
    again = await server.bind("p", node, made["metadata"]["uid"])
    assert_status(again, 409, "Conflict", {"name": "p", "kind": "pods/binding"})
    assert again.body["message"] == (
        f'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "{NOWHERE}"')


async def test_a_binding_for_another_uid_is_a_conflict(server: Server) -> None:
    made = await server.create("p")
    refused = await server.bind("p", uid="a-recreated-pod")
    assert_status(refused, 409, "Conflict", {"name": "p", "kind": "pods"})
    message = refused.body["message"]
    assert message.startswith('Operation cannot be fulfilled on pods "p": '), message
    uids = f"UID in precondition: a-recreated-pod, UID in object meta: {made['metadata']['uid']}"
    assert f"Precondition failed: {uids}" in message, message
    assert "nodeName" not in (await server.get("p")).body["spec"]


async def test_a_binding_names_the_pod_and_a_target(server: Server) -> None:
    await server.create("p")
    binding = {"metadata": {"name": "q"}, "target": {"name": NOWHERE}}
    other = await server.http.call("POST", server.pods("p", "binding"), binding)
    assert_status(other, 400, "BadRequest")
    assert other.body["message"] == "name in URL does not match name in Binding object"
    untargeted = await server.http.call("POST", server.pods("p", "binding"), {"metadata": {"name": "p"}})
    assert_status(untargeted, 500, None)
    assert untargeted.body["message"] == "target.name: Required value"


# --- patches, creation, authentication ---


@pytest.mark.parametrize("content_type", [MERGE, STRATEGIC])
async def test_a_patch_merges_annotations_and_null_deletes_one(server: Server, content_type: str) -> None:
    await server.create("p")
    patched = await server.patch("p", {"metadata": {"annotations": {"a": None, "b": "2"}}}, content_type)
    assert patched.status == 200 and patched.body["metadata"]["annotations"] == {"b": "2"}, patched.body
    last = await server.patch("p", {"metadata": {"annotations": {"b": None}}}, content_type)
    assert "annotations" not in last.body["metadata"] or last.body["metadata"]["annotations"] == {}


@pytest.mark.parametrize("content_type", ["text/plain", JSON])
async def test_a_patch_of_an_unknown_type_is_unsupported(server: Server, content_type: str) -> None:
    await server.create("p")
    refused = await server.patch("p", {"metadata": {}}, content_type)
    assert_status(refused, 415, "UnsupportedMediaType", {})
    assert refused.body["message"] == "415: Unsupported Media Type"


async def test_a_second_pod_of_the_same_name_already_exists(server: Server) -> None:
    await server.create("p")
    again = await server.http.call("POST", server.pods(), pod("p"))
    assert_status(again, 409, "AlreadyExists", {"name": "p", "kind": "pods"})
    assert again.body["message"] == 'pods "p" already exists'


async def test_a_created_pod_is_pending_whatever_status_it_was_given(server: Server) -> None:
    body = {**pod("p"), "status": {"phase": "Running"}}
    made = await server.http.call("POST", server.pods(), body)
    assert made.status == 201 and made.body["status"] == {"phase": "Pending", "qosClass": "BestEffort"}, made.body
    meta = made.body["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1, meta
    assert meta["namespace"] == server.namespace
    assert made.body["spec"]["schedulerName"] == "default-scheduler" and made.body["spec"]["restartPolicy"] == "Always"


async def test_a_wrong_token_is_unauthorized(server: Server) -> None:
    refused = await server.http.call("GET", server.pods(), token="not-the-token")
    assert_status(refused, 401, "Unauthorized")
    assert refused.body["message"] == "Unauthorized" and "details" not in refused.body


# --- lists ---


async def test_a_list_comes_in_pages_of_one_snapshot(server: Server) -> None:
    for name in ("c", "a", "b", "d"):
        await server.create(name)
    first = (await server.http.call("GET", server.pods(), params={"limit": "2"})).body
    assert [item["metadata"]["name"] for item in first["items"]] == ["a", "b"]
    assert first["metadata"]["remainingItemCount"] == 2 and first["metadata"]["continue"], first["metadata"]
    assert "kind" not in first["items"][0] and first["kind"] == "PodList"
    await server.delete("d")
    await server.create("e")
    params = {"limit": "2", "continue": first["metadata"]["continue"]}
    rest = (await server.http.call("GET", server.pods(), params=params)).body
    assert [item["metadata"]["name"] for item in rest["items"]] == ["c", "d"]
    assert "continue" not in rest["metadata"] and "remainingItemCount" not in rest["metadata"], rest["metadata"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    now = (await server.http.call("GET", server.pods(), params={"limit": "-1"})).body
    assert [item["metadata"]["name"] for item in now["items"]] == ["a", "b", "c", "e"]


async def test_every_namespace_lists_in_key_order_page_by_page(server: Server) -> None:
    for name in ("y", "x"):
        await server.create(name)
    keys: list[str] = []
    params = {"limit": "1"}
    while True:
        page = (await server.http.call("GET", "/api/v1/pods", params=params)).body
        keys.extend(f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in page["items"])
        if not page["metadata"].get("continue"):
            break
        params = {"limit": "1", "continue": page["metadata"]["continue"]}
    assert keys == sorted(keys) and {f"{server.namespace}/x", f"{server.namespace}/y"} <= set(keys), keys


@pytest.mark.parametrize(("params", "fragment"), [
    ({"limit": "2", "continue": "not-a-token"}, "invalid continue token"),
    ({"limit": "two"}, 'strconv.ParseInt: parsing "two": invalid syntax'),
], ids=["continue", "limit"])  # fmt: skip
async def test_a_bad_limit_or_continue_token_is_a_bad_request(
    server: Server, params: dict[str, str], fragment: str
) -> None:
    refused = await server.http.call("GET", server.pods(), params=params)
    assert_status(refused, 400, "BadRequest")
    assert fragment in refused.body["message"], refused.body


# --- nodes ---


async def test_node_labels_are_read_merge_patched_and_the_node_deleted(server: Server) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": server.node, "labels": {"a": "1", "b": "2"}}}
    made = await server.http.call("POST", "/api/v1/nodes", node)
    assert made.status == 201, made.body
    path = f"/api/v1/nodes/{server.node}"
    patched = await server.http.call("PATCH", path, {"metadata": {"labels": {"a": None, "c": "3"}}}, MERGE)
    assert patched.status == 200, patched.body
    labels = (await server.http.call("GET", path)).body["metadata"]["labels"]
    assert "a" not in labels and labels["b"] == "2" and labels["c"] == "3", labels
    deleted = await server.http.call("DELETE", path)
    details = {"name": server.node, "kind": "nodes", "uid": made.body["metadata"]["uid"]}
    assert_status(deleted, 200, None, details, coded=False)
    for reply in (await server.http.call("GET", path), await server.http.call("PATCH", path, {"metadata": {}}, MERGE)):
        assert_status(reply, 404, "NotFound", {"name": server.node, "kind": "nodes"})
        assert reply.body["message"] == f'nodes "{server.node}" not found'


# --- gpuledger's own adapters, against both ---


async def test_the_placement_adapter_reads_annotates_and_binds(server: Server) -> None:
    made = await server.create("p", {GPU: "1", GPU_MEM: "4000"})
    pods = KubePodApi(await from_file(str(server.kubeconfig)), 10.0)
    try:
        read = await pods.get_pod(server.namespace, "p")
        assert read["metadata"]["uid"] == made["metadata"]["uid"]
        assert read["spec"]["containers"][0]["resources"]["requests"][GPU_MEM] == "4k"
        await pods.annotate(server.namespace, "p", {"gpuledger.io/allocation": "{}", "a": None})
        assert (await server.get("p")).body["metadata"]["annotations"] == {"gpuledger.io/allocation": "{}"}
        with pytest.raises(Conflict, match="Precondition failed"):
            await pods.bind(server.namespace, "p", "another-uid", NOWHERE)
        await pods.bind(server.namespace, "p", made["metadata"]["uid"], NOWHERE)
        with pytest.raises(Conflict, match="already assigned"):
            await pods.bind(server.namespace, "p", made["metadata"]["uid"], NOWHERE)
        with pytest.raises(NotFound):
            await pods.get_pod(server.namespace, "nope")
        with pytest.raises(NotFound):
            await pods.bind(server.namespace, "nope", "uid", NOWHERE)
    finally:
        await pods.close()


async def test_the_allocator_lister_reads_every_page(server: Server) -> None:
    uids = {name: (await server.create(name, nodeName=NOWHERE))["metadata"]["uid"] for name in ("p0", "p1", "p2")}
    lister = KubePodLister(await from_file(str(server.kubeconfig)), field_selector="")
    lister.page_size = 1
    try:
        seen = [p for p in (await lister.list_pods()).pods if p.namespace == server.namespace]
    finally:
        await lister.close()
    assert [(p.name, p.uid, p.node, p.phase) for p in seen] == [(n, uids[n], NOWHERE, "Pending") for n in sorted(uids)]


async def test_the_allocator_lister_lists_by_field_selector(server: Server) -> None:
    await server.create("ours", nodeName=NOWHERE, schedulerName="gpuledger-scheduler")
    await server.create("theirs", nodeName=NOWHERE)
    here = f"metadata.namespace={server.namespace}"
    ours = f"{here},spec.schedulerName=gpuledger-scheduler"
    lister = KubePodLister(await from_file(str(server.kubeconfig)), field_selector=ours)
    try:
        assert [p.name for p in (await lister.list_pods()).pods] == ["ours"]
        lister.field_selector = f"{here},spec.schedulerName!=gpuledger-scheduler"
        assert [p.name for p in (await lister.list_pods()).pods] == ["theirs"]
        lister.field_selector = f"{here},spec.color=blue"
        with pytest.raises(Unavailable, match=r"field label not supported: spec\.color"):
            await lister.list_pods()
        found = await lister.get_pod(server.namespace, "theirs")
        assert found is not None and found.name == "theirs" and found.node == NOWHERE
        assert await lister.get_pod(server.namespace, "nobody") is None
    finally:
        await lister.close()


async def test_the_allocator_watch_brings_the_changes_after_its_listing_in_order(server: Server) -> None:
    await server.create("before", nodeName=NOWHERE, schedulerName="gpuledger-scheduler")
    lister = KubePodLister(
        await from_file(str(server.kubeconfig)), field_selector=f"metadata.namespace={server.namespace}"
    )
    events: list[tuple[str, str]] = []

    async def follow(version: str) -> None:
        async for event in lister.watch_pods(version, timeout_s=60):
            if event.pod is not None:
                events.append((event.kind, event.pod.name))

    try:
        listed = await lister.list_pods()
        assert [p.name for p in listed.pods] == ["before"] and listed.resource_version
        await server.create("after", nodeName=NOWHERE)  # before the watch starts: it is still sent
        following = asyncio.create_task(follow(listed.resource_version))
        try:
            await wait_for(lambda: _has(events, ("ADDED", "after")), 20, "the pod made after the listing")
            assert (await server.patch("before", {"metadata": {"labels": {"x": "1"}}})).status == 200
            assert (await server.delete("after", grace_s=0)).status == 200
            await wait_for(lambda: _has(events, ("DELETED", "after")), 20, "the deletion")
        finally:
            following.cancel()
        # A deletion is written first (MODIFIED, with its deletionTimestamp), then the pod goes.
        assert events == [("ADDED", "after"), ("MODIFIED", "before"), ("MODIFIED", "after"), ("DELETED", "after")]
    finally:
        await lister.close()


async def _has(events: list[tuple[str, str]], wanted: tuple[str, str]) -> bool:
    return wanted in events


async def test_placement_follows_nodes_allocatable_and_the_pods_bound_to_them(server: Server) -> None:
    """hosts.follow: Nodes and bound pods listed, then watched from the listing's version."""
    first, second = server.node, f"{server.node}-2"

    def node(name: str, cpu: str, memory: str) -> dict[str, Any]:
        allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "status": {"capacity": allocatable, "allocatable": allocatable}}  # fmt: skip

    assert (await server.http.call("POST", "/api/v1/nodes", node(first, "8", "16Gi"))).status == 201
    usage = HostUsage()
    pods = KubePodApi(await from_file(str(server.kubeconfig)), 10.0)
    following = asyncio.create_task(follow(pods, usage))

    async def free(name: str, wanted: tuple[int, int] | None) -> None:
        await wait_for(polled(lambda: usage.synced.is_set() and usage.free(name) == wanted), 20, f"{name}: {wanted}")

    try:
        await free(first, (8000, 16384))  # listed
        assert (await server.http.call("POST", "/api/v1/nodes", node(second, "4", "8Gi"))).status == 201
        await free(second, (4000, 8192))  # watched
        requests = {"requests": {"cpu": "1500m", "memory": "1Gi"}}
        await server.create("bound", nodeName=first, containers=[{"name": "app", "image": "x", "resources": requests}])
        await free(first, (6500, 15360))
        assert (await server.delete("bound", grace_s=0)).status == 200
        await free(first, (8000, 16384))
        assert (await server.http.call("DELETE", f"/api/v1/nodes/{second}")).status == 200
        await free(second, None)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await pods.close()
        await server.http.call("DELETE", f"/api/v1/nodes/{second}")


async def test_the_inventory_adapter_reads_and_patches_node_labels(server: Server) -> None:
    node = {"metadata": {"name": server.node, "labels": {"gpuledger.io/old": "1", "keep": "1"}}}
    assert (await server.http.call("POST", "/api/v1/nodes", node)).status == 201
    nodes = KubeNodeApi(await from_file(str(server.kubeconfig)))
    try:
        assert {"gpuledger.io/old": "1", "keep": "1"}.items() <= (await nodes.get_labels(server.node)).items()
        await nodes.patch_labels(server.node, {"gpuledger.io/old": None, "gpuledger.io/gpu.count": "8"})
        labels = await nodes.get_labels(server.node)
        assert "gpuledger.io/old" not in labels and labels["gpuledger.io/gpu.count"] == "8" and labels["keep"] == "1"
        with pytest.raises(NotFound):
            await nodes.get_labels(f"{server.node}-missing")
        with pytest.raises(NotFound):
            await nodes.patch_labels(f"{server.node}-missing", {"a": "1"})
    finally:
        await nodes.close()
