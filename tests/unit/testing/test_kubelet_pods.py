"""What the kwok node's kubelet reads from pods and writes back (pure), and the fake kubelet's
refusals in kubelet's words."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from grpclib import GRPCError
from grpclib.const import Status

from gpuledger_dev.fake_kubelet import AdmissionError, FakeContainer, rpc_error
from gpuledger_dev.kubelet_pods import (
    ADMITTED,
    admitted_patch,
    fake_pod,
    is_deleting,
    is_terminal,
    node_devices_patch,
    rejected_patch,
    status_says_admitted,
)
from gpuledger_dev.kwok_kubelet import KwokKubeletSettings

GPU = "gpuledger.io/gpu"
MIG = "gpuledger.io/mig-1g.10gb"


def pod(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": spec, "status": status or {}}


def container(name: str, limits: str | None = None, requests: str | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = {GPU: limits, "cpu": "1"}
    if requests is not None:
        resources["requests"] = {GPU: requests}
    return {"name": name, "image": "x", "resources": resources, **extra}


def test_containers_in_admission_order_with_counts_from_limits_or_requests() -> None:
    found = fake_pod(
        pod(
            initContainers=[container("setup", "1"), container("sidecar", "2", restartPolicy="Always")],
            containers=[container("app", "2", "2"), container("requested", requests="3"), container("cpu")],
        ),
        GPU,
    )
    assert (found.namespace, found.name, found.uid) == ("ns", "p", "u1")
    assert found.in_admission_order() == [
        FakeContainer("setup", 1, init=True),
        FakeContainer("sidecar", 2, init=True, restartable=True),
        FakeContainer("app", 2),
        FakeContainer("requested", 3),
        FakeContainer("cpu", 0),
    ]


def test_a_container_asking_for_a_mig_resource_is_admitted_under_it() -> None:
    mig_app = {"name": "mig", "resources": {"limits": {MIG: "1", "cpu": "1"}}}
    smallest = {"name": "small", "resources": {"requests": {"gpuledger.io/mig": "1", "gpuledger.io/gpu-mem": "8000"}}}
    found = fake_pod(pod(containers=[mig_app, smallest, container("whole", "1")]), GPU)
    assert found.in_admission_order() == [
        FakeContainer("mig", 1, resource=MIG),
        FakeContainer("small", 1, resource="gpuledger.io/mig"),
        FakeContainer("whole", 1),
    ]
    both = {"name": "both", "resources": {"limits": {MIG: "1", GPU: "1"}}}
    with pytest.raises(ValueError, match=f"container both asks for {GPU} and {MIG}: one device resource each"):
        fake_pod(pod(containers=[both]), GPU)


@pytest.mark.parametrize(("quantity", "count"), [("2", 2), ("1k", 1000), ("1e1", 10), ("1500m", 2), ("1Ki", 1024)])
def test_counts_are_kubernetes_quantities_rounded_up_as_kubelet_does(quantity: str, count: int) -> None:
    assert fake_pod(pod(containers=[container("app", quantity)]), GPU).containers[0].gpus == count


@pytest.mark.parametrize("quantity", ["two", "-1", "1.2.3"])
def test_a_count_that_is_no_quantity_names_the_resource(quantity: str) -> None:
    with pytest.raises(ValueError, match=r"gpuledger\.io/gpu: "):
        fake_pod(pod(containers=[container("app", quantity)]), GPU)


@pytest.mark.parametrize(
    ("status", "admitted", "terminal"),
    [
        ({}, False, False),
        ({"phase": "Pending"}, False, False),
        ({"phase": "Pending", "conditions": [{"type": ADMITTED, "status": "False"}]}, False, False),
        ({"phase": "Pending", "conditions": [{"type": ADMITTED, "status": "True"}]}, True, False),
        ({"phase": "Running"}, True, False),
        ({"phase": "Succeeded"}, False, True),
        ({"phase": "Failed"}, False, True),
    ],
)
def test_what_a_status_says(status: dict[str, Any], admitted: bool, terminal: bool) -> None:
    assert status_says_admitted(pod(status)) is admitted
    assert is_terminal(pod(status)) is terminal


def test_deleting() -> None:
    deleting = pod()
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert is_deleting(deleting) and not is_deleting(pod())


def test_patches_carry_the_uid_and_merge_by_key() -> None:
    when = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert admitted_patch("u1", when) == {
        "metadata": {"uid": "u1"},
        "status": {"conditions": [{"type": ADMITTED, "status": "True", "lastTransitionTime": "2025-03-04T05:06:07Z"}]},
    }
    assert rejected_patch("u1", "UnexpectedAdmissionError", "Pod was rejected: x") == {
        "metadata": {"uid": "u1"},
        "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "Pod was rejected: x"},
    }
    assert node_devices_patch({GPU: (8, 6)}) == {"status": {"capacity": {GPU: "8"}, "allocatable": {GPU: "6"}}}
    assert node_devices_patch({GPU: (8, 6), MIG: (16, 8)}) == {
        "status": {"capacity": {GPU: "8", MIG: "16"}, "allocatable": {GPU: "6", MIG: "8"}}
    }


@pytest.mark.parametrize(
    ("err", "text"),
    [
        (GRPCError(Status.INTERNAL, "boom"), "rpc error: code = Internal desc = boom"),
        (GRPCError(Status.RESOURCE_EXHAUSTED, "full"), "rpc error: code = ResourceExhausted desc = full"),
        (GRPCError(Status.CANCELLED, "gone"), "rpc error: code = Canceled desc = gone"),
        (GRPCError(Status.UNAVAILABLE), "rpc error: code = Unavailable desc = "),
        (TimeoutError(), "rpc error: code = DeadlineExceeded desc = context deadline exceeded"),
    ],
)
def test_rpc_errors_read_as_go_grpc_prints_them(err: BaseException, text: str) -> None:
    assert rpc_error(err) == text


def test_the_rejected_pods_message() -> None:
    refused = AdmissionError("rpc error: code = Internal desc = boom")
    assert refused.reason == "UnexpectedAdmissionError"
    assert refused.pod_message == (
        "Pod was rejected: Allocate failed due to rpc error: code = Internal desc = boom, which is unexpected"
    )


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="backoff_max_s"):
        KwokKubeletSettings(backoff_min_s=2.0, backoff_max_s=1.0)
    with pytest.raises(ValueError, match="rpc_timeout_s"):
        KwokKubeletSettings(rpc_timeout_s=0)
