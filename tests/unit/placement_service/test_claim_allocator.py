"""DRA mode C's pure parts in placement: which claims a gated pod names, whether a pod is gated,
which DeviceClasses are mode C's, and the configuration copied into an allocation."""

from __future__ import annotations

from typing import Any

from gpuledger_placement.claim_allocator import GATE, _configs, _of_driver, claim_names, gated

DRIVER = "gpu.gpuledger.io"
MPS = {"driver": DRIVER, "parameters": {"apiVersion": "gpuledger.io/v1alpha1", "kind": "SharingConfig"}}


def pod(claims: list[dict[str, Any]], statuses: list[dict[str, Any]] | None = None, gates: tuple[str, ...] = ()) -> Any:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u"},
        "spec": {"resourceClaims": claims, "schedulingGates": [{"name": g} for g in gates]},
        "status": {"resourceClaimStatuses": statuses or []},
    }


def test_a_template_claim_is_named_once_kube_controller_manager_created_it() -> None:
    claims = [{"name": "a", "resourceClaimName": "shared"}, {"name": "b", "resourceClaimTemplateName": "t"}]
    assert claim_names(pod(claims)) is None
    assert claim_names(pod(claims, [{"name": "b", "resourceClaimName": "p-b-x1"}])) == ["shared", "p-b-x1"]


def test_only_our_gate_makes_a_pod_ours() -> None:
    assert gated(pod([], gates=("other", GATE)))
    assert not gated(pod([], gates=("other",)))


def test_a_class_is_ours_when_its_selector_names_our_driver() -> None:
    ours = {"spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}" && x'}}]}}
    theirs = {"spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}}
    assert _of_driver(ours, DRIVER) and not _of_driver(theirs, DRIVER) and not _of_driver({}, DRIVER)


def test_the_configs_are_copied_as_kube_scheduler_copies_them() -> None:
    classes = {"mps.gpu.gpuledger.io": {"spec": {"config": [{"opaque": MPS}, {"opaque": {"driver": "other"}}]}}}
    claim = {"spec": {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "mps.gpu.gpuledger.io"}}],
        "config": [{"requests": ["gpu"], "opaque": MPS}, {"opaque": {"driver": "other"}}],
    }}}  # fmt: skip
    assert _configs(claim, classes, DRIVER) == [
        {"source": "FromClass", "requests": ["gpu"], "opaque": MPS},
        {"source": "FromClaim", "requests": ["gpu"], "opaque": MPS},
    ]
