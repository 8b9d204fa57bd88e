"""The extender wire format, both ways, and pods to domain asks."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import MIG_SMALLEST, Isolation, Request
from gpuledger_placement import convert
from gpuledger_placement.convert import BadRequest, BindArgs, ExtenderArgs


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def pod(
    *containers: dict[str, Any], inits: tuple[dict[str, Any], ...] = (), annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "annotations": annotations or {}},
        "spec": {"initContainers": list(inits), "containers": list(containers)},
    }


def container(
    name: str = "c", limits: dict[str, str] | None = None, requests: dict[str, str] | None = None
) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits or {}, "requests": requests or {}}}


# --- golden JSON: what kube-scheduler sends and reads (types_test.go) ---


def test_the_reference_bind_request_decodes() -> None:
    raw = json.loads('{"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid","Node":"mynode"}')
    assert convert.bind_args_from(raw) == BindArgs("mypodname", "mypodnamespace", "mypoduid", "mynode")


def test_the_reference_filter_reply_encodes_exactly() -> None:
    args = ExtenderArgs({}, ("node1", "foo", "baz"))
    reply = convert.filter_result_to(args, ["node1"], {"foo": "bar"}, {"baz": "qux"}, "myerror")
    assert dumps(reply) == (
        '{"Nodes":null,"NodeNames":["node1"],"FailedNodes":{"foo":"bar"},'
        '"FailedAndUnresolvableNodes":{"baz":"qux"},"Error":"myerror"}'
    )


def test_priorities_are_a_json_array_of_host_and_score() -> None:
    assert dumps(convert.priorities_to({"n1": 7, "n2": 0})) == '[{"Host":"n1","Score":7},{"Host":"n2","Score":0}]'
    assert convert.priorities_json({"n1": 7, "n2": 0}) == '[{"Host":"n1","Score":7},{"Host":"n2","Score":0}]'
    odd = {'we"ird\\name': 3, "node-1.example.com": 10}
    assert json.loads(convert.priorities_json(odd)) == convert.priorities_to(odd)


def test_bind_reply_and_filter_error() -> None:
    assert dumps(convert.bind_result_to()) == '{"Error":""}'
    assert convert.filter_error_to("ledger down")["Error"] == "ledger down"
    assert convert.filter_error_to("ledger down")["NodeNames"] is None


def test_extender_args_with_node_names() -> None:
    raw = json.loads('{"Pod":{"metadata":{"name":"p"}},"Nodes":null,"NodeNames":["a","b"]}')
    args = convert.extender_args_from(raw)
    assert args.names == ("a", "b") and args.items is None


def test_extender_args_with_full_nodes_are_answered_with_full_nodes() -> None:
    items = [{"metadata": {"name": "a"}, "status": {}}, {"metadata": {"name": "b"}}]
    args = convert.extender_args_from({"Pod": {}, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None})
    assert args.names == ("a", "b")
    reply = convert.filter_result_to(args, ["b"], {"a": "full"}, {})
    assert reply["Nodes"] == {"metadata": {}, "items": [items[1]]} and reply["NodeNames"] is None


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([], "body"),
        ({"NodeNames": ["a"]}, "Pod"),
        ({"Pod": {}, "NodeNames": [1]}, "NodeNames"),
        ({"Pod": {}}, "NodeNames"),
        ({"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}, "Nodes.items[0].metadata.name"),
    ],
)
def test_malformed_extender_args(raw: Any, field: str) -> None:
    with pytest.raises(BadRequest) as caught:
        convert.extender_args_from(raw)
    assert caught.value.field == field


def test_bad_json_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        convert.parse_json(b"{")


@pytest.mark.parametrize("missing", ["PodName", "PodNamespace", "PodUID", "Node"])
def test_bind_args_need_every_field(missing: str) -> None:
    raw = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}
    del raw[missing]
    with pytest.raises(BadRequest, match=missing):
        convert.bind_args_from(raw)


# --- pods ---


def test_a_shared_request_from_limits() -> None:
    limits = {"gpuledger.io/gpu": "2", "gpuledger.io/gpu-mem": "8192", "gpuledger.io/gpu-core": "30"}
    ask = convert.pod_ask_from(pod(container("train", limits), annotations={"gpuledger.io/gpu-model": "A100|H100"}))
    [only] = ask.containers
    assert only.container == "train" and not only.init
    assert only.request == Request(2, 8192, 300, frozenset({"A100", "H100"}))
    assert ask.owner.id == "u-1" and ask.owner.namespace == "ns" and ask.owner.name == "p"


def test_requests_alone_count_and_no_resources_means_no_cards() -> None:
    ask = convert.pod_ask_from(pod(container("a", requests={"gpuledger.io/gpu": "1"}), container("b")))
    assert [c.container for c in ask.containers] == ["a"]
    assert ask.containers[0].request.exclusive
    assert not convert.pod_ask_from(pod(container("web", requests={"cpu": "1"}))).wants_cards


def test_init_containers_come_first_in_spec_order() -> None:
    gpu = {"gpuledger.io/gpu": "1"}
    ask = convert.pod_ask_from(pod(container("app", gpu), inits=(container("prep", gpu), container("warm", gpu))))
    assert [(c.container, c.init) for c in ask.containers] == [("prep", True), ("warm", True), ("app", False)]


def test_annotations_and_host_resources() -> None:
    apps = (
        container("a", requests={"cpu": "500m", "memory": "1Gi"}),
        container("b", limits={"cpu": "1", "memory": "512Mi"}),
    )
    init = container("i", requests={"cpu": "4", "memory": "100Mi"})
    raw = pod(*apps, inits=(init,), annotations={"gpuledger.io/isolation": "mps", "gpuledger.io/placement": "spread"})
    ask = convert.pod_ask_from(raw)
    assert ask.isolation is Isolation.MPS and ask.policy == "spread"
    assert ask.cpu_milli == 4000  # the init container's 4 CPUs outweigh the apps' 1.5
    assert ask.memory_mib == 1536


@pytest.mark.parametrize(
    ("limits", "annotations", "message"),
    [
        ({"gpuledger.io/gpu-mem": "1000"}, {}, "need gpuledger.io/gpu"),
        (
            {"gpuledger.io/gpu": "1", "gpuledger.io/gpu-mem": "8Gi"},
            {},
            "gpu-mem: is a count of MiB, not a size in bytes: write 8192 for 8 GiB, not '8Gi'",
        ),
        ({"gpuledger.io/gpu": "1", "gpuledger.io/gpu-core": "150"}, {}, "must be 1..100 percent"),
        ({"gpuledger.io/gpu": "1", "gpuledger.io/gpu-core": "0"}, {}, "must be 1..100 percent"),
        ({"gpuledger.io/gpu": "65"}, {}, "gpu: must be 1..64 cards"),
        ({"gpuledger.io/gpu": "1.5"}, {}, "whole number of cards"),
        ({"gpuledger.io/gpu": "1"}, {"gpuledger.io/isolation": "mig"}, "must be none|mps"),
        ({"gpuledger.io/gpu": "1"}, {"gpuledger.io/placement": "fastest"}, "must be one of default"),
    ],
)
def test_pods_that_make_no_sense_name_the_field(
    limits: dict[str, str], annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        convert.pod_ask_from(pod(container("c", limits), annotations=annotations))
    assert message in str(caught.value)
    assert not isinstance(caught.value, BadRequest)  # the pod is unschedulable, the request is fine


# --- quantities as the API server writes them ---


def gpu_limits(**values: str) -> dict[str, str]:
    names = {"gpu": "gpuledger.io/gpu", "mem": "gpuledger.io/gpu-mem", "core": "gpuledger.io/gpu-core"}
    return {names[key]: value for key, value in values.items()}


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        (gpu_limits(gpu="1", mem="4k"), Request(1, 4000)),  # the API server's form of 4000
        (gpu_limits(gpu="1", mem="16k"), Request(1, 16000)),
        (gpu_limits(gpu="1", mem="1500"), Request(1, 1500)),  # written as 1.5k
        (gpu_limits(gpu="1", mem="1.5k"), Request(1, 1500)),
        (gpu_limits(gpu="1", mem="1e3"), Request(1, 1000)),
        (gpu_limits(gpu="1", mem="4000"), Request(1, 4000)),
        (gpu_limits(gpu="1", mem="1M"), Request(1, 1_000_000)),
        (gpu_limits(gpu="2", mem="20k", core="25"), Request(2, 20000, 250)),
        (gpu_limits(gpu="1", core="5e1"), Request(1, core_milli=500)),
        (gpu_limits(gpu="1e0"), Request(1)),
        (gpu_limits(gpu="8000m"), Request(8)),  # whole, though written in thousandths
    ],
)
def test_any_quantity_with_a_whole_value_is_taken_at_its_exact_value(limits: dict[str, str], expected: Request) -> None:
    [only] = convert.pod_ask_from(pod(container("c", limits, requests=limits))).containers
    assert only.request == expected


@pytest.mark.parametrize(
    ("limits", "field", "problem"),
    [
        (gpu_limits(gpu="1", mem="500m"), "gpu-mem", "must be a whole number of MiB, got '500m'"),
        (gpu_limits(gpu="1", mem="0.5"), "gpu-mem", "must be a whole number of MiB, got '0.5'"),
        (gpu_limits(gpu="1", mem="1500500m"), "gpu-mem", "must be a whole number of MiB, got '1500500m'"),
        (gpu_limits(gpu="500m"), "gpu", "must be a whole number of cards, got '500m'"),
        (gpu_limits(gpu="1.5"), "gpu", "must be a whole number of cards, got '1.5'"),
        (gpu_limits(gpu="1", core="12.5"), "gpu-core", "must be a whole number of percent, got '12.5'"),
        (gpu_limits(gpu="1", mem="2Gi"), "gpu-mem", "is a count of MiB, not a size in bytes: write 2048 for 2 GiB"),
        (gpu_limits(gpu="1", mem="1Gi"), "gpu-mem", "write 1024 for 1 GiB, not '1Gi'"),  # 1024Mi, canonical
        (gpu_limits(gpu="1", mem="512Mi"), "gpu-mem", "write 512 for 512 MiB, not '512Mi'"),
        (gpu_limits(gpu="1", mem="1.5Gi"), "gpu-mem", "write 1536 for 1.5 GiB"),
        (gpu_limits(gpu="1", mem="1Ki"), "gpu-mem", "'1Ki' is not a whole number of MiB"),
        (gpu_limits(gpu="1Ki"), "gpu", "is a count of cards: binary suffixes (Ki, Mi, Gi, ...) do not apply"),
        (gpu_limits(gpu="1", core="1Ki"), "gpu-core", "is a count of percent: binary suffixes"),
        (gpu_limits(gpu="1", mem="lots"), "gpu-mem", "'lots' is not a Kubernetes quantity"),
        (gpu_limits(gpu="1", mem="-4k"), "gpu-mem", "'-4k' is negative"),
        (gpu_limits(gpu="1", mem="1e30"), "gpu-mem", "far too many MiB"),
        (gpu_limits(gpu="1", mem="1e999999999"), "gpu-mem", "out of range"),
    ],
)
def test_fractions_and_binary_suffixes_are_refused_naming_the_container_and_field(
    limits: dict[str, str], field: str, problem: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        convert.pod_ask_from(pod(container("ok"), container("train", limits)))
    assert caught.value.field == f"spec.containers[1] (train) gpuledger.io/{field}"
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1Gi", Decimal(2**30)),
        ("1.5k", Decimal(1500)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("2E", Decimal(2 * 10**18)),
        ("+4", Decimal(4)),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("250u", Decimal("0.00025")),
        ("100n", Decimal("1E-7")),
        (4, Decimal(4)),
    ],
)
def test_quantities(raw: Any, value: Decimal) -> None:
    assert convert.quantity(raw, "x") == value


@pytest.mark.parametrize("raw", ["lots", "-1", "1Zi", "1_000", "1e3Ki", "1.2.3", "Infinity", "NaN", "0x10", "", True])
def test_bad_quantities(raw: Any) -> None:
    with pytest.raises(InvalidArgument):
        convert.quantity(raw, "x")


def test_an_api_timestamp_reads_as_seconds_since_the_epoch_or_the_default() -> None:
    assert convert.epoch_of("2026-12-01T00:00:10Z", -1.0) == 1796083210.0
    assert convert.epoch_of("2026-12-01T00:00:10.5+00:00", -1.0) == 1796083210.5
    for bad in (None, "", "yesterday", 12):
        assert convert.epoch_of(bad, -1.0) == -1.0


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"gpuledger.io/mig-9g.1gb": "1"}, "gpuledger.io/mig-9g.1gb: no card model offers the MIG profile 9g.1gb"),
        ({"gpuledger.io/mig-1g.10gb": "1", "gpuledger.io/gpu": "1"}, "asks for gpuledger.io/gpu and MIG instances"),
        ({"gpuledger.io/mig-1g.10gb": "1.5"}, "must be a whole number of instances"),
        ({"gpuledger.io/mig": "1"}, "sizes its instances by gpuledger.io/gpu-mem or gpuledger.io/gpu-core"),
        ({"gpuledger.io/mig": "1", "gpuledger.io/gpu-core": "150"}, "must be 1..100 percent of a card, got 150"),
        ({"gpuledger.io/mig-1g.10gb": "1", "gpuledger.io/gpu-mem": "8000"}, "names its memory and compute"),
        ({"gpuledger.io/mig-1g.10gb": "1", "gpuledger.io/mig-2g.20gb": "1"}, "ask for one MIG resource per container"),
    ],
)
def test_a_pod_asking_for_mig_badly_is_refused_naming_why(limits: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        convert.pod_ask_from(pod(container("c", limits)))
    assert message in str(caught.value) and "spec.containers[0] (c)" in str(caught.value)


@pytest.mark.parametrize(
    ("limits", "request_"),
    [
        ({"gpuledger.io/mig-1g.10gb": "2"}, Request(2, mig="1g.10gb")),
        ({"gpuledger.io/mig": "1", "gpuledger.io/gpu-mem": "8000"}, Request(1, 8000, mig=MIG_SMALLEST)),
        ({"gpuledger.io/mig": "1", "gpuledger.io/gpu-core": "30"}, Request(1, None, 300, mig=MIG_SMALLEST)),
    ],
)
def test_a_pod_asking_for_mig_asks_for_instances(limits: dict[str, str], request_: Request) -> None:
    asked = convert.pod_ask_from(pod(container("c", limits)))
    assert [(c.container, c.request, c.init) for c in asked.containers] == [("c", request_, False)]
    assert asked.mig and asked.single() is None


def test_a_mig_ask_in_an_init_container_is_refused() -> None:
    raw = pod(container("c", {}))
    raw["spec"]["initContainers"] = [container("setup", {"gpuledger.io/mig-1g.10gb": "1"})]
    with pytest.raises(InvalidArgument, match=r"spec.initContainers\[0\] \(setup\): asks for MIG instances in an init"):
        convert.pod_ask_from(raw)


def test_a_pod_asking_for_no_mig_instance_asks_nothing() -> None:
    assert not convert.pod_ask_from(pod(container("c", {"gpuledger.io/mig-1g.10gb": "0"}))).wants_cards
