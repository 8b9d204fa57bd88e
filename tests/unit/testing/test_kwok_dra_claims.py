"""What the kwok kubelet's DRA side reads from pods, claims, registrations and CDI specs (pure),
worded as kubelet words it."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuledger_dev.kwok_dra_claims import (
    V1,
    V1BETA1,
    ClaimInfo,
    PodClaim,
    PreparedDevice,
    PrepareError,
    choose_service,
    claim_drivers,
    container_cdi_ids,
    failed_prepare_event,
    foreign_devices,
    has_claims,
    parse_cdi_id,
    pod_claims,
    unresolved,
)
from gpuledger_dev.kwok_dra_plugins import KwokDraSettings

KIND = "k8s.gpu.gpuledger.io/claim"


def pod(claims: list[dict[str, Any]], statuses: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    status = {"resourceClaimStatuses": statuses} if statuses is not None else {}
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-1"},
        "spec": {"resourceClaims": claims, **spec},
        "status": status,
    }


def claim(
    reserved: list[str] = ["pod-1"],  # noqa: B006 - never changed
    results: list[dict[str, Any]] | None = None,
    owner: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c", "namespace": "ns", "uid": "claim-1"}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "Pod", "name": "p", "uid": owner, "controller": True}]
    status: dict[str, Any] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": u} for u in reserved]}
    if results is not None:
        status["allocation"] = {"devices": {"results": results}}
    return {"metadata": meta, "status": status}


def result(driver: str = "gpu.gpuledger.io", device: str = "gpu-0", share: str | None = None) -> dict[str, Any]:
    found = {"request": "gpu", "driver": driver, "pool": "node-a", "device": device}
    return found | ({"shareID": share} if share else {})


def test_claim_names_come_from_the_spec_or_for_templates_from_the_pods_status() -> None:
    claims = [
        {"name": "direct", "resourceClaimName": "shared"},
        {"name": "mine", "resourceClaimTemplateName": "tmpl"},
        {"name": "skipped", "resourceClaimTemplateName": "tmpl"},
    ]
    statuses = [{"name": "mine", "resourceClaimName": "p-mine-x7k"}, {"name": "skipped"}]
    assert pod_claims(pod(claims, statuses)) == [
        PodClaim("direct", "shared", generated=False),
        PodClaim("mine", "p-mine-x7k", generated=True),
    ]
    assert has_claims(pod(claims)) and not has_claims(pod([]))


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ([{"name": "mine", "resourceClaimTemplateName": "t"}], 'pod "ns/p": ResourceClaim not created yet'),
        ([{"name": "odd"}], 'pod "ns/p", spec.resourceClaim "odd": none of the supported fields are set'),
    ],
)
def test_a_claim_name_that_cannot_be_known_is_an_error(claims: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(PrepareError) as raised:
        pod_claims(pod(claims, []))
    assert str(raised.value) == message


def test_a_claim_allocated_and_reserved_for_the_pod_names_its_drivers() -> None:
    allocated = claim(results=[result(), result(device="gpu-1"), result("nic.example.com")])
    assert claim_drivers(pod([]), allocated, generated=False) == {"gpu.gpuledger.io", "nic.example.com"}
    assert claim_drivers(pod([]), claim(results=[result()], owner="pod-1"), generated=True) == {"gpu.gpuledger.io"}


@pytest.mark.parametrize(
    ("found", "generated", "message"),
    [
        (claim(reserved=["other"], results=[result()]), False,
         "pod p (pod-1) is not allowed to use ResourceClaim c (claim-1)"),
        (claim(reserved=["pod-1"]), False, "ResourceClaim c: not allocated"),
        (claim(results=[result()], owner="other"), True,
         "ResourceClaim ns/c was not created for Pod ns/p (Pod is not owner)"),
        (claim(results=[result()]), True, "ResourceClaim ns/c was not created for Pod ns/p (Pod is not owner)"),
    ],
)  # fmt: skip
def test_a_claim_the_pod_may_not_use_is_refused_in_kubelets_words(
    found: dict[str, Any], generated: bool, message: str
) -> None:
    with pytest.raises(PrepareError) as raised:
        claim_drivers(pod([]), found, generated)
    assert str(raised.value) == message


def test_devices_of_an_answer_must_be_among_the_claims_results_for_that_driver() -> None:
    allocated = claim(results=[result(share="s-1"), result(device="gpu-1"), result("nic.example.com", "eth0")])
    ok = [
        PreparedDevice(("gpu",), "node-a", "gpu-0", ("k/c=a",), "s-1"),
        PreparedDevice(("gpu",), "node-a", "gpu-0", ("k/c=a",)),  # v1beta1 answers carry no share id
        PreparedDevice(("gpu",), "node-a", "gpu-1", ("k/c=b",)),
    ]
    assert foreign_devices(allocated, "gpu.gpuledger.io", ok) == []
    wrong = [
        PreparedDevice(("gpu",), "node-a", "gpu-0", (), "s-2"),
        PreparedDevice(("gpu",), "node-b", "gpu-1", ()),
        PreparedDevice(("gpu",), "node-a", "eth0", ()),
    ]
    assert foreign_devices(allocated, "gpu.gpuledger.io", wrong) == [
        "node-a/gpu-0 (share s-2)",
        "node-b/gpu-1",
        "node-a/eth0",
    ]


@pytest.mark.parametrize(
    ("supported", "chosen"),
    [([V1, V1BETA1], V1), ([V1BETA1, V1], V1BETA1), (["v1alpha1.DRAResourceHealth", V1BETA1], V1BETA1)],
)
def test_kubelet_takes_the_first_service_of_the_plugins_that_it_knows(supported: list[str], chosen: str) -> None:
    assert choose_service(supported) == chosen


@pytest.mark.parametrize(
    ("supported", "message"),
    [
        ([], "empty list of supported gRPC services (aka supported versions)"),
        (["v1alpha3.DRAPlugin"], "none of services supported by the plugin (['v1alpha3.DRAPlugin'])"),
    ],
)
def test_a_plugin_with_no_service_kubelet_knows_is_refused(supported: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        choose_service(supported)


def test_cdi_ids_resolve_to_a_device_of_a_spec_of_their_kind() -> None:
    assert parse_cdi_id(f"{KIND}=uid-gpu-0") == (KIND, "uid-gpu-0")
    specs = [
        {"cdiVersion": "0.3.0", "kind": KIND, "devices": [{"name": "uid-gpu-0"}, {"name": "uid-gpu-1"}]},
        {"kind": "nvidia.com/gpu", "devices": [{"name": "0"}]},
    ]
    ids = [f"{KIND}=uid-gpu-1", "nvidia.com/gpu=0", f"{KIND}=uid-gpu-2", "nvidia.com/gpu=uid-gpu-0", "no-kind", ""]
    assert unresolved(ids, specs) == [f"{KIND}=uid-gpu-2", "nvidia.com/gpu=uid-gpu-0", "no-kind", ""]
    for bad in ("k8s.gpu.gpuledger.io=x", "a/b/c=x", "/claim=x", "a/b="):
        with pytest.raises(ValueError, match="is not a CDI device id"):
            parse_cdi_id(bad)


def test_each_container_gets_the_cdi_ids_of_the_requests_it_names() -> None:
    info = ClaimInfo("claim-1", "ns", "c", frozenset({"gpu.gpuledger.io"}), {"pod-1"}, prepared=True)
    info.devices["gpu.gpuledger.io"] = (
        PreparedDevice(("big",), "node-a", "gpu-0", ("k/c=big",)),
        PreparedDevice(("small",), "node-a", "gpu-1", ("k/c=small",)),
        PreparedDevice((), "node-a", "gpu-2", ("k/c=any",)),
    )
    containers = [
        {"name": "all", "resources": {"claims": [{"name": "gpus"}]}},
        {"name": "one", "resources": {"claims": [{"name": "gpus", "request": "small"}]}},
        {"name": "none"},
    ]
    found = pod([{"name": "gpus", "resourceClaimName": "c"}], containers=containers)
    infos = {("ns", "c"): info}
    assert container_cdi_ids(found, "all", infos) == ["k/c=big", "k/c=small", "k/c=any"]
    assert container_cdi_ids(found, "one", infos) == ["k/c=small", "k/c=any"]
    assert container_cdi_ids(found, "none", infos) == []
    assert container_cdi_ids(found, "missing", infos) == []


def test_settings_want_absolute_directories_and_positive_deadlines() -> None:
    assert KwokDraSettings("/reg", "/cdi").rpc_timeout_s == 45.0
    with pytest.raises(ValueError, match="registry_dir"):
        KwokDraSettings("reg", "/cdi")
    with pytest.raises(ValueError, match="must be > 0"):
        KwokDraSettings("/reg", "/cdi", poll_s=0)


def test_a_failed_prepare_is_told_as_kubelets_warning_event_on_the_pod() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    event = failed_prepare_event(pod([]), "node-a", "prepare dynamic resources: no", now)
    assert event == {
        "metadata": {"generateName": "p."},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "p", "uid": "pod-1"},
        "reason": "FailedPrepareDynamicResources",
        "message": "Failed to prepare dynamic resources: prepare dynamic resources: no",
        "type": "Warning",
        "count": 1,
        "firstTimestamp": "2026-01-02T03:04:05Z",
        "lastTimestamp": "2026-01-02T03:04:05Z",
        "source": {"component": "kubelet", "host": "node-a"},
    }


def test_an_extended_resource_served_by_dra_uses_the_claim_the_scheduler_made_for_the_pod() -> None:
    extended = {
        "resourceClaimName": "p-extended-resources-x2",
        "requestMappings": [
            {"containerName": "app", "resourceName": "example.com/gpu", "requestName": "container-0-request-0"},
            {"containerName": "side", "resourceName": "example.com/gpu", "requestName": "container-1-request-0"},
        ],
    }
    containers = [
        {"name": "app", "resources": {"limits": {"example.com/gpu": "1"}}},
        {"name": "side", "resources": {"requests": {"example.com/gpu": "0"}}},
    ]
    found = pod([], containers=containers)
    assert not has_claims(found)
    found["status"]["extendedResourceClaimStatus"] = extended
    assert has_claims(found)
    assert pod_claims(found) == [PodClaim("", "p-extended-resources-x2", generated=False)]
    info = ClaimInfo("claim-2", "ns", "p-extended-resources-x2", frozenset({"gpu.gpuledger.io"}), {"pod-1"})
    info.devices["gpu.gpuledger.io"] = (
        PreparedDevice(("container-0-request-0",), "node-a", "gpu-0", ("k/c=app",)),
        PreparedDevice(("container-1-request-0",), "node-a", "gpu-1", ("k/c=side",)),
    )
    infos = {("ns", "p-extended-resources-x2"): info}
    assert container_cdi_ids(found, "app", infos) == ["k/c=app"]
    assert container_cdi_ids(found, "side", infos) == []  # asks for none of it
