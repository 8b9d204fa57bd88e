"""What a ResourceClaim asks, in classic placement's terms (gpuledger_core.claim_asks), and what
mode C leaves to kube-scheduler, refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_core.claim_asks import ClaimAsk, RequestAsk, claim_ask
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import Isolation, Request
from gpuledger_core.nvlink import Linked

DRIVER = "gpu.gpuledger.io"
MPS_CONFIG = {
    "opaque": {
        "driver": DRIVER,
        "parameters": {"apiVersion": "gpuledger.io/v1alpha1", "kind": "SharingConfig", "isolation": "mps"},
    }
}
CLASSES: dict[str, Any] = {
    "gpu.gpuledger.io": {"metadata": {"name": "gpu.gpuledger.io"}, "spec": {}},
    "mps.gpu.gpuledger.io": {"metadata": {"name": "mps.gpu.gpuledger.io"}, "spec": {"config": [MPS_CONFIG]}},
}
REF = ClaimRef("ns", "c", "uid-1")


def claim(*requests: dict[str, Any], constraints: list[Any] | None = None, config: list[Any] | None = None) -> Any:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints is not None:
        devices["constraints"] = constraints
    if config is not None:
        devices["config"] = config
    return {"metadata": {"namespace": "ns", "name": "c", "uid": "uid-1"}, "spec": {"devices": devices}}


def exactly(name: str = "gpu", klass: str = DRIVER, **more: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": klass, **more}}


def capacity(**requests: str) -> dict[str, Any]:
    return {"capacity": {"requests": requests}}


def test_a_whole_card_a_share_on_the_grid_and_a_count() -> None:
    found = claim_ask(claim(
        exactly("whole"),
        exactly("share", **capacity(memory="1000Mi", compute="25")),
        exactly("pair", count=2, **capacity(memory="8Gi")),
    ), CLASSES, DRIVER)  # fmt: skip
    assert found == ClaimAsk(REF, (
        RequestAsk("whole", (("whole", Request(1)),)),
        RequestAsk("share", (("share", Request(1, 1024, 250)),)),  # 1000 MiB up to the 256 MiB grid
        RequestAsk("pair", (("pair", Request(2, 8192, 1000)),)),  # no compute asked: all of it
    ))  # fmt: skip


def test_first_available_keeps_its_order_and_names_the_results_as_kube_scheduler_does() -> None:
    request = {"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": DRIVER, "count": 2},
        {"name": "small", "deviceClassName": DRIVER, **capacity(memory="4Gi", compute="50")},
    ]}  # fmt: skip
    found = claim_ask(claim(request), CLASSES, DRIVER)
    assert found is not None
    assert found.requests == (RequestAsk("gpu", (("gpu/big", Request(2)), ("gpu/small", Request(1, 4096, 500)))),)


def test_an_nvlink_match_links_its_requests() -> None:
    constraint = {"requests": ["a", "b"], "matchAttribute": f"{DRIVER}/nvlinkGroup4"}
    found = claim_ask(claim(exactly("a", count=2), exactly("b", count=2), constraints=[constraint]), CLASSES, DRIVER)
    assert found is not None and found.linked == (Linked(4, ("a", "b")),)
    everything = {"matchAttribute": f"{DRIVER}/nvlinkGroup8"}
    found = claim_ask(claim(exactly("a", count=4), constraints=[everything]), CLASSES, DRIVER)
    assert found is not None and found.linked == (Linked(8, ("a",)),)


def test_the_isolation_comes_from_the_class_then_the_claim() -> None:
    share = capacity(memory="1Gi", compute="10")
    mps = claim_ask(claim(exactly(klass="mps.gpu.gpuledger.io", **share)), CLASSES, DRIVER)
    assert mps is not None and mps.isolation is Isolation.MPS
    plain = claim_ask(claim(exactly(**share), config=[MPS_CONFIG]), CLASSES, DRIVER)
    assert plain is not None and plain.isolation is Isolation.MPS
    none = claim_ask(claim(exactly()), CLASSES, DRIVER)
    assert none is not None and none.isolation is Isolation.NONE
    mixed = claim(exactly("a", klass="mps.gpu.gpuledger.io"), exactly("b"))
    with pytest.raises(InvalidArgument, match="isolation none and mps at once"):
        claim_ask(mixed, CLASSES, DRIVER)


def test_a_claim_of_other_classes_only_is_not_ours() -> None:
    assert claim_ask(claim(exactly(klass="gpu.example.com")), CLASSES, DRIVER) is None


@pytest.mark.parametrize(
    ("request_", "constraints", "field", "said"),
    [
        (exactly(allocationMode="All"), None, "allocationMode", "allocationMode All"),
        (exactly(selectors=[{"cel": {"expression": "true"}}]), None, "selectors", "CEL selectors"),
        (exactly(adminAccess=True), None, "adminAccess", "admin access"),
        (exactly(tolerations=[{"operator": "Exists"}]), None, "tolerations", "tolerations"),
        (exactly(**capacity(memory="1Gi", bandwidth="1")), None, "capacity.requests", "unknown capacities bandwidth"),
        (exactly(**capacity(memory="1Gi", slots="2")), None, "slots", "one slot per claim"),
        (exactly(**capacity(compute="50")), None, "capacity.requests", "compute without memory"),
        (exactly(**capacity(memory="1Gi", compute="101")), None, "compute", "1..100 percent"),
        (exactly(count=65), None, "count", "1..64 cards"),
        (exactly(), [{"distinctAttribute": f"{DRIVER}/uuid"}], "constraints[0]", "is left to kube-scheduler"),
        (exactly(), [{"matchAttribute": f"{DRIVER}/productName"}], "constraints[0]", "productName is left"),
        (exactly(), [{"requests": ["x"], "matchAttribute": f"{DRIVER}/nvlinkGroup2"}], "requests", "no request x"),
    ],
)
def test_what_mode_c_leaves_to_kube_scheduler_is_refused_by_name(
    request_: dict[str, Any], constraints: list[Any] | None, field: str, said: str
) -> None:
    with pytest.raises(InvalidArgument, match=said) as refused:
        claim_ask(claim(request_, constraints=constraints), CLASSES, DRIVER)
    assert field in refused.value.field and "ResourceClaim ns/c" in str(refused.value)


def test_another_class_beside_ours_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"device classes gpu\.example\.com beside gpuledger's"):
        claim_ask(claim(exactly("a"), exactly("b", klass="gpu.example.com")), CLASSES, DRIVER)


def selecting(expression: str) -> dict[str, Any]:
    return {"metadata": {"name": "picky"}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}


@pytest.mark.parametrize(
    "expression",
    [
        f'device.driver == "{DRIVER}"',
        f'device.driver == "{DRIVER}" &&\n  device.attributes["{DRIVER}"].tenancy != "mps"',  # a line break
        f'device.driver == "{DRIVER}"  &&  device.attributes["{DRIVER}"].tenancy != "none"',
    ],
)
def test_the_shipped_selectors_are_the_ledger_s_own_decisions(expression: str) -> None:
    classes = {**CLASSES, "picky": selecting(expression)}
    assert claim_ask(claim(exactly(klass="picky")), classes, DRIVER) is not None


@pytest.mark.parametrize(
    ("expression", "said"),
    [
        (f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].productName == "A100"', "productName"),
        (f'device.driver == "{DRIVER}" || device.driver == "other"', "||"),
        (f'device.driver == "{DRIVER}" && device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0', "40Gi"),
        (f'!(device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].tenancy != "mps")', "!("),
    ],
)
def test_a_class_selecting_by_what_the_ledger_does_not_weigh_is_refused(expression: str, said: str) -> None:
    """The ledger's choice would ignore such a test: the claim is refused (kube-scheduler allocates
    it), naming the class and the test, never placed as if the class asked nothing more."""
    classes = {**CLASSES, "picky": selecting(expression)}
    with pytest.raises(InvalidArgument, match="device class picky selects by") as refused:
        claim_ask(claim(exactly(klass="picky")), classes, DRIVER)
    assert said in str(refused.value) and "ResourceClaim ns/c" in str(refused.value)
