"""Every decoder of outside input, fuzzed: whatever arrives, the answer is a value or a refusal
that names the field (a ``GpuledgerError``, ``BadRequest``, ``FleetError``), never another
exception, which would be a crash, a 500 or an internal-error reply.

Inputs are arbitrary JSON and, to get past the first checks, valid messages with parts replaced
by arbitrary JSON, dropped or kept (``near``). ``tox -e fuzz`` runs the ``fuzz`` profile.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from gpuledger_allocator import wire
from gpuledger_allocator.ingest import usage_from
from gpuledger_common import clusterwire
from gpuledger_common.bus import decode
from gpuledger_common.store.values import Values
from gpuledger_core import codec
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.events import EventKind, LedgerEvent
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.status import node_status
from gpuledger_dev.fleet import FleetError, parse_fleet
from gpuledger_placement import convert
from gpuledger_placement.api_nats import place_request_from
from gpuledger_proto.gpuledger.allocator import v1 as pb

from ..core.builders import holding, ledger, share

REFUSALS = (GpuledgerError, FleetError)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["", "0", "1", "-1", "1Gi", "100m", "GPU-0", "none", "mps", "tool", "pod", "reserved"]),
)
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def near(value: Any) -> st.SearchStrategy[Any]:
    """``value``, with any part of it kept, dropped (object keys) or replaced by arbitrary JSON."""
    if isinstance(value, dict):
        kept = st.fixed_dictionaries({}, optional={k: near(v) for k, v in value.items()})
        return st.one_of(kept, kept, kept, anything)
    if isinstance(value, list):
        items = [near(v) for v in value] or [anything]
        return st.one_of(st.lists(st.one_of(*items), max_size=len(value) + 1), anything)
    return st.one_of(st.just(value), scalars)


def refuses_or_decodes(decoder: Callable[[Any], object], raw: Any) -> None:
    with contextlib.suppress(*REFUSALS):
        decoder(raw)


VALID_ALLOCATION = codec.allocation_to(holding("a1", share(0, 1000, 100), share(1)))
VALID_LEDGER = codec.ledger_to(ledger(8000, 8000))
VALID_EVENT = codec.event_to(
    LedgerEvent(EventKind.RESERVED, NodeName("n1"), 3, holding("a1", share(0, 1000, 100)))
)
VALID_REQUEST = {"count": 1, "mem_mib": 1000, "core_milli": 200, "models": ["A100"]}
VALID_ALLOCATE = {
    "owner": {"kind": "tool", "id": "ci"},
    "containers": [{"container": "main", "request": VALID_REQUEST, "init": False}],
    "isolation": "none",
    "lease_s": 30.0,
    "commit": True,
    "node": "n1",
}
VALID_POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": {"gpuledger.io/gpu-model": "A100"}},
    "spec": {
        "schedulerName": "gpuledger",
        "containers": [
            {
                "name": "main",
                "resources": {
                    "limits": {"gpuledger.io/gpu": "2", "gpuledger.io/gpu-mem": "4000", "cpu": "500m"},
                    "requests": {"memory": "1Gi"},
                },
            }
        ],
        "initContainers": [{"name": "init", "resources": {"limits": {"gpuledger.io/gpu": 1}}}],
    },
}
VALID_INVENTORY = {
    "node": codec.node_to(ledger(8000).node),
    "at": 1.0,
    "extra": {"cards": [{"uuid": "GPU-0", "processes": [{"pid": 1, "used_mib": 10}]}]},
}
VALID_FLEET = {
    "nodes": [
        {"name": "n1", "profile": "rtx3090-1"},
        {
            "name": "n2",
            "cards": [{"model": "A100", "memory_mib": 40000}],
            "faults": [{"at_s": 1, "xid": 79, "card": 0}],
        },
    ]
}


@given(near(VALID_LEDGER))
def test_ledger_values(raw: Any) -> None:
    refuses_or_decodes(codec.ledger_from, raw)


@given(st.one_of(near(VALID_LEDGER).map(orjson.dumps), st.binary(max_size=64)))
@example(b"")  # found: the store let orjson's error through (a node may write any bytes to its key)
@example(b"\xff{")
def test_ledger_value_bytes_as_the_store_reads_them(data: bytes) -> None:
    store = Values()  # decoding only: no I/O
    refuses_or_decodes(lambda d: store.decoded("n1", d), data)


@given(near(VALID_EVENT))
def test_events(raw: Any) -> None:
    refuses_or_decodes(codec.event_from, raw)


@given(near(VALID_ALLOCATION))
def test_allocations(raw: Any) -> None:
    refuses_or_decodes(lambda r: codec.allocation_from(codec.Reader(r)), raw)


@given(near(VALID_ALLOCATE))
def test_the_allocators_nats_requests(raw: Any) -> None:
    refuses_or_decodes(wire.allocate_call_from, raw)
    refuses_or_decodes(wire.allocation_id_from, raw)


@given(near({"owner": {"kind": "pod", "id": "u", "namespace": "ns", "name": "p"}, **VALID_ALLOCATE}))
def test_placements_nats_requests(raw: Any) -> None:
    refuses_or_decodes(place_request_from, raw)


@given(near(VALID_INVENTORY))
def test_inventory_messages(raw: Any) -> None:
    refuses_or_decodes(lambda r: (codec.node_from(codec.Reader(r).obj("node")), usage_from(codec.Reader(r))), raw)


@given(st.one_of(st.binary(max_size=64), near(VALID_ALLOCATE).map(orjson.dumps)))
def test_nats_body_bytes(data: bytes) -> None:
    refuses_or_decodes(lambda d: wire.allocate_call_from(decode(d)), data)


@given(near({"Pod": VALID_POD, "NodeNames": ["n1", "n2"]}))
def test_extender_filter_and_prioritize_arguments(raw: Any) -> None:
    def decoded(r: Any) -> object:
        return convert.pod_ask_from(convert.extender_args_from(r).pod)

    refuses_or_decodes(decoded, raw)


@given(near({"Pod": VALID_POD, "Nodes": {"items": [{"metadata": {"name": "n1"}}]}}))
def test_extender_arguments_with_nodes(raw: Any) -> None:
    refuses_or_decodes(convert.extender_args_from, raw)


@given(near({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n1"}))
def test_extender_bind_arguments(raw: Any) -> None:
    refuses_or_decodes(convert.bind_args_from, raw)


@given(st.one_of(st.binary(max_size=64), near({"Pod": VALID_POD, "NodeNames": ["n1"]}).map(json.dumps).map(str.encode)))
def test_extender_body_bytes(body: bytes) -> None:
    refuses_or_decodes(lambda b: convert.extender_args_from(convert.parse_json(b)), body)


@given(near(VALID_POD))
def test_kubernetes_pods(raw: Any) -> None:
    if isinstance(raw, dict):
        refuses_or_decodes(convert.pod_ask_from, raw)
        refuses_or_decodes(convert.pod_ref_from, raw)


@given(st.binary(max_size=96))
@example(b"\x08\x00\x00\x00")  # found: owner sent as a varint reached owner_from as an int
@example(b"\x12\x02\x08\x01")  # a container whose name field holds a varint
@example(b"\x0a\x00\x12\x02\x12\xff")  # a container request whose length runs past the end
def test_grpc_allocate_requests_from_bytes(data: bytes) -> None:
    """Whatever bytes arrive as an AllocateRequest, read as the API reads them (``clusterwire``)."""
    refuses_or_decodes(clusterwire.allocate_request_from, data)


VALID_CLUSTER = clusterwire.cluster_bytes(
    [node_status(NodeLedger(ledger(8000, 8000).node, (holding("a1", share(0, 1000, 100), share(1)),)), revision=3)],
    "n1",
)


@given(
    st.one_of(
        st.binary(max_size=96),
        st.tuples(st.integers(0, len(VALID_CLUSTER) - 1), st.integers(0, 255)).map(
            lambda at: VALID_CLUSTER[: at[0]] + bytes([at[1]]) + VALID_CLUSTER[at[0] + 1 :]
        ),
        st.integers(0, len(VALID_CLUSTER)).map(lambda end: VALID_CLUSTER[:end]),
    )
)
def test_cluster_pages_as_the_cli_reads_them(data: bytes) -> None:
    """A GetCluster reply's bytes, as ``clusterwire`` reads them for the CLI: any bytes, one
    byte of a valid page changed, or a valid page cut short."""
    refuses_or_decodes(clusterwire.cluster_from, data)


@given(
    st.builds(
        pb.AllocateRequest,
        owner=st.builds(pb.Owner, kind=st.sampled_from(["tool", "pod", "", "x"]), id=st.text(max_size=6)),
        containers=st.lists(
            st.builds(
                pb.ContainerRequest,
                container=st.text(max_size=4),
                request=st.builds(
                    pb.ResourceRequest,
                    gpu=st.integers(0, 2**32 - 1),
                    gpu_mem_mib=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
                    gpu_core_permille=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
                    models=st.lists(st.text(max_size=5), max_size=2),
                ),
            ),
            max_size=3,
        ),
    )
)
def test_grpc_allocate_requests(request: pb.AllocateRequest) -> None:
    refuses_or_decodes(clusterwire.allocate_request_from, bytes(request))


@given(st.one_of(near(VALID_FLEET).map(lambda v: yaml.safe_dump(v)), st.text(max_size=80)))
def test_fleet_files(text: str) -> None:
    refuses_or_decodes(parse_fleet, text)


def test_the_fuzzing_can_fail() -> None:
    """The harness lets through only refusals: another exception is a finding."""
    with pytest.raises(ZeroDivisionError):
        refuses_or_decodes(lambda _: 1 / 0, None)
