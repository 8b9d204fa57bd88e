"""The cluster listing's own protobuf writer and reader against betterproto's, which the proto's
generated classes use: the same bytes both ways, and clear refusals of bad ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_common import clusterwire
from gpuledger_common import pbconvert as conv
from gpuledger_common.clusterwire.cluster import cards_bytes
from gpuledger_common.clusterwire.wire import varint
from gpuledger_core import codec_status
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.model import Allocation, CardMode, CardShare, Grant, MigInstance, MigSlot, Remedy
from gpuledger_core.status import CardStatus, NodeStatus
from gpuledger_proto.gpuledger.allocator import v1 as pb

from ..core.strategies import allocations, cards, core, holders, mib, names, node_statuses, texts

# MIG placements, an empty one among them (written as an empty message; both read it as none)
slots = st.builds(
    MigSlot, st.sampled_from(["1g.10gb", "3g.20gb", "7g.80gb", "1g.10gb+me", ""]), st.integers(0, 7), st.integers(0, 8)
)
instances = st.builds(MigInstance, slots, st.booleans(), texts, texts, st.sampled_from(Remedy))


@st.composite
def card_statuses(draw: st.DrawFn) -> CardStatus:
    """A card's status, in MIG mode or not, some holders holding its instances' placements."""
    made = draw(st.lists(instances, max_size=3).map(tuple))
    held = draw(st.none() | slots | (st.sampled_from([i.slot for i in made]) if made else st.none()))
    card = draw(st.builds(replace, cards, health_reason=texts, mode=st.sampled_from(CardMode), instances=st.just(made)))
    found = draw(st.lists(st.builds(replace, holders, mig=st.just(held) | st.none() | slots), max_size=3))
    return CardStatus(
        card,
        draw(mib),
        draw(st.integers(0, 1000)),
        tuple(found),
        *draw(st.tuples(st.integers(0, 64), st.integers(0, 64), mib)),
    )


shares = st.builds(CardShare, names.map(CardUuid), st.integers(0, 15), mib, core, st.booleans(), st.none() | slots)
grants = st.builds(Grant, texts, st.lists(shares, max_size=3).map(tuple), st.booleans())
allocations = allocations | st.builds(replace, allocations, grants=st.lists(grants, max_size=3).map(tuple))
statuses = st.builds(
    NodeStatus, names, st.lists(card_statuses(), max_size=4).map(tuple), st.booleans(), st.integers(0, 2**40)
)
pages = st.lists(statuses | node_statuses, max_size=4)
tokens = st.text(max_size=12)


def betterproto_bytes(nodes: list[NodeStatus], token: str) -> bytes:
    return bytes(pb.Cluster(nodes=[conv.node_status_to(n) for n in nodes], next_page_token=token))


@settings(max_examples=300, deadline=None)
@given(nodes=pages, token=tokens)
def test_it_writes_the_bytes_betterproto_writes(nodes: list[NodeStatus], token: str) -> None:
    assert clusterwire.cluster_bytes(nodes, token) == betterproto_bytes(nodes, token)


@settings(max_examples=300, deadline=None)
@given(nodes=pages, token=tokens)
def test_it_reads_what_betterproto_reads(nodes: list[NodeStatus], token: str) -> None:
    wire = betterproto_bytes(nodes, token)
    parsed = pb.Cluster().parse(wire)
    assert clusterwire.cluster_from(wire) == (
        [conv.node_status_from(n) for n in parsed.nodes],
        parsed.next_page_token,
    )


@settings(max_examples=300, deadline=None)
@given(found=st.lists(allocations, max_size=4), token=tokens)
def test_it_writes_allocations_as_betterproto_does(found: list[Allocation], token: str) -> None:
    theirs = bytes(
        pb.ListAllocationsResponse(allocations=[conv.allocation_to(a) for a in found], next_page_token=token)
    )
    assert clusterwire.allocations_bytes(found, token) == theirs
    runs = b"".join(clusterwire.allocations_bytes(found[i : i + 1]) for i in range(len(found)))
    assert runs + clusterwire.allocations_bytes((), token) == theirs  # runs joined, the token last


@settings(max_examples=300, deadline=None)
@given(allocation=allocations, existing=st.booleans())
def test_it_writes_one_allocation_and_an_allocate_response_as_betterproto_does(
    allocation: Allocation, existing: bool
) -> None:
    message = conv.allocation_to(allocation)
    assert clusterwire.allocation_bytes(allocation) == bytes(message)
    theirs = bytes(pb.AllocateResponse(allocation=message, existing=existing))
    assert clusterwire.allocate_response_bytes(allocation, existing) == theirs


owners = st.builds(pb.Owner, kind=st.sampled_from(["tool", "pod", "", "x"]), id=texts, name=st.text(max_size=4))
resource_requests = st.builds(
    pb.ResourceRequest,
    gpu=st.integers(0, 20) | st.integers(0, 2**32 - 1),
    gpu_mem_mib=st.none() | st.integers(0, 2**20) | st.integers(0, 2**64 - 1),
    gpu_core_permille=st.none() | st.integers(0, 1200),
    models=st.lists(st.sampled_from(["", "A100", "H100", "ü"]), max_size=2),
    mig=st.sampled_from(["", "", "1g.10gb", "3g.20gb", "smallest", "1g.7gb", "SMALLEST"]),
)
allocate_requests = st.builds(
    pb.AllocateRequest,
    owner=st.none() | owners,
    containers=st.lists(
        st.builds(
            pb.ContainerRequest,
            container=st.text(max_size=4),
            request=st.none() | resource_requests,
            init=st.booleans(),
        ),
        max_size=3,
    ),
    isolation=st.sampled_from(["", "none", "mps", "x"]),
    lease_seconds=st.integers(0, 2**32 - 1),
    commit=st.booleans(),
    node=st.text(max_size=4),
)


def as_betterproto_reads(wire: bytes) -> object:
    """The request as the API read it before: betterproto's message, then ``pbconvert``."""
    r = pb.AllocateRequest().parse(wire)
    owner = conv.owner_from(r.owner if r.is_set("owner") else None)
    return (owner, conv.asks_from(r.containers), r.isolation, r.lease_seconds, r.commit, r.node)


def outcome(read: Callable[[bytes], object], wire: bytes) -> object:
    try:
        return read(wire)
    except InvalidArgument as err:
        return ("refused", err.field, err.problem)


@settings(max_examples=500, deadline=None)
@given(request=allocate_requests)
def test_it_reads_an_allocate_request_as_betterproto_and_pbconvert_do(request: pb.AllocateRequest) -> None:
    wire = bytes(request)

    def ours(data: bytes) -> object:
        r = clusterwire.allocate_request_from(data)
        return (r.owner, r.asks, r.isolation, r.lease_seconds, r.commit, r.node)

    assert outcome(ours, wire) == outcome(as_betterproto_reads, wire)


def a_node() -> NodeStatus:
    status = pb.NodeStatus(
        name="n1",
        cards=[
            pb.CardStatus(
                uuid="GPU-1",
                index=3,
                model="H100",
                memory_mib=81920,
                free_mem_mib=1000,
                health="unhealthy",
                numa=-1,
                holders=[
                    pb.Holder(
                        allocation_id="a1",
                        owner=pb.Owner(kind="pod", id="uid", namespace="ns", name="p"),
                        mem_mib=5,
                        state="bound",
                        since=12.5,
                    )
                ],
                health_reason="XID 79",
            )
        ],
        stale=True,
        revision=7,
    )
    return conv.node_status_from(status)


def test_a_node_reads_back_as_it_was_written() -> None:
    node = a_node()
    assert node.cards[0].card.numa is None and node.cards[0].holders[0].since == 12.5
    assert clusterwire.cluster_from(clusterwire.cluster_bytes([node, node], "n1")) == ([node, node], "n1")


def test_a_page_written_in_slices_is_the_page_written_at_once() -> None:
    nodes = [replace(a_node(), name=NodeName(f"n{i}")) for i in range(5)]
    sliced = b"".join(clusterwire.cluster_bytes(nodes[i : i + 2]) for i in range(0, 5, 2))
    assert sliced + clusterwire.cluster_bytes([], "t") == clusterwire.cluster_bytes(nodes, "t")


def test_a_nodes_cards_are_encoded_once_while_they_are_the_same_tuple() -> None:
    node = a_node()
    first = clusterwire.encoded_cards(node.name, node.cards)
    assert clusterwire.encoded_cards(node.name, node.cards) is first
    changed = (replace(node.cards[0], free_mem_mib=2000),)
    assert clusterwire.encoded_cards(node.name, changed) != first
    assert clusterwire.encoded_cards(node.name, changed) == cards_bytes(changed)


def test_fields_it_does_not_know_are_skipped() -> None:
    node = clusterwire.node_bytes(a_node())
    newer = node + b"\x78\x05" + b"\x82\x01\x03abc"  # field 15 (varint) and field 16 (bytes): a newer server's
    wire = b"\x0a" + varint(len(newer)) + newer
    assert clusterwire.cluster_from(wire) == ([a_node()], "")


@pytest.mark.parametrize(
    ("wire", "named"),
    [
        (b"\x0a\x02\x08\x01", "cluster.nodes[0].name"),  # name sent as a number
        (b"\x0a\x04\x0a\x03n1", "cluster.nodes[0]"),  # a name cut short
        (b"\x0a\x05\x0a\x03\xff\xfe\x01", "cluster.nodes[0].name"),  # not UTF-8
        (b"\x0a\x0a\x12\x08\x3a\x06broken", "cluster.nodes[0].cards[0].health"),  # health of no known kind
        (b"\x0b", "cluster"),  # wire type 3 (a group): not proto3
    ],
)
def test_bad_bytes_are_refused_naming_the_field(wire: bytes, named: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        clusterwire.cluster_from(wire)
    assert refused.value.field == named


def test_a_node_whose_ledger_value_cannot_be_read_says_why_as_betterproto_writes_it() -> None:
    node = NodeStatus(NodeName("bad"), (), revision=9, unreadable="ledger value: not valid JSON")
    wire = clusterwire.cluster_bytes([node])
    assert wire == bytes(pb.Cluster(nodes=[conv.node_status_to(node)]))
    assert clusterwire.cluster_from(wire) == ([node], "")
    assert conv.node_status_from(pb.NodeStatus().parse(clusterwire.node_bytes(node))) == node
    assert codec_status.node_status_from(codec_status.node_status_to(node)) == node


def a_mig_node() -> NodeStatus:
    """A card in MIG mode: a static 3g.20gb held by a1, a 1g.10gb made on demand and faulted, and
    a holder whose placement is not made yet."""
    base = a_node()
    held, made, planned = MigSlot("3g.20gb", 4, 4), MigSlot("1g.10gb", 0, 1), MigSlot("2g.20gb", 2, 2)
    card = replace(
        base.cards[0].card,
        mode=CardMode.MIG,
        instances=(MigInstance(held, True, "MIG-a"), MigInstance(made, False, "MIG-b", "XID 94", Remedy.DRAIN)),
    )
    holder = base.cards[0].holders[0]
    holders = (replace(holder, mig=held), replace(holder, allocation_id=AllocationId("a2"), mig=planned))
    return replace(base, cards=(replace(base.cards[0], card=card, holders=holders),))


def test_a_mig_card_is_written_with_its_instances_and_who_holds_them() -> None:
    node = a_mig_node()
    wire = clusterwire.node_bytes(node)
    assert wire == bytes(conv.node_status_to(node))
    [card] = pb.NodeStatus().parse(wire).cards
    assert card.mode == "mig"
    assert [
        (i.profile, i.start, i.size, i.static, i.uuid, i.allocation_id, i.fault, i.remedy) for i in card.instances
    ] == [
        ("3g.20gb", 4, 4, True, "MIG-a", "a1", "", ""),
        ("1g.10gb", 0, 1, False, "MIG-b", "", "XID 94", "drain"),
    ]
    assert [(h.allocation_id, h.mig.profile, h.mig.start) for h in card.holders] == [
        ("a1", "3g.20gb", 4),
        ("a2", "2g.20gb", 2),
    ]
    assert clusterwire.cluster_from(clusterwire.cluster_bytes([node])) == ([node], "")
    assert conv.node_status_from(pb.NodeStatus().parse(wire)) == node


def test_a_whole_card_says_its_mode_and_has_no_instances() -> None:
    [card] = pb.NodeStatus().parse(clusterwire.node_bytes(a_node())).cards
    assert (card.mode, card.instances) == ("whole", [])
    older = pb.NodeStatus().parse(bytes(pb.NodeStatus(name="n", cards=[pb.CardStatus(uuid="GPU-1")])))
    assert conv.node_status_from(older).cards[0].card.mode is CardMode.WHOLE  # a server before MIG: whole


def test_a_share_of_a_mig_placement_is_written_as_betterproto_does() -> None:
    share = CardShare(CardUuid("GPU-1"), 0, 9728, 142, False, MigSlot("1g.10gb", 6, 1))
    message = conv.share_to(share)
    assert clusterwire.share_bytes(share) == bytes(message)
    assert (message.mig.profile, message.mig.start, message.mig.size) == ("1g.10gb", 6, 1)
    assert conv.share_from(pb.CardShare().parse(bytes(message))) == share
    assert conv.share_from(pb.CardShare().parse(clusterwire.share_bytes(replace(share, mig=None)))).mig is None


def mig_request(mig: str, **sizes: int) -> pb.AllocateRequest:
    request = pb.ResourceRequest(gpu=1, mig=mig, **sizes)
    return pb.AllocateRequest(owner=pb.Owner(kind="tool", id="t"), containers=[pb.ContainerRequest(request=request)])


@pytest.mark.parametrize(
    ("request_", "mig"),
    [
        (mig_request("1g.10gb"), "1g.10gb"),
        (mig_request("smallest", gpu_mem_mib=8000), "smallest"),
        (mig_request(""), ""),
    ],
)
def test_a_mig_ask_is_read_both_ways(request_: pb.AllocateRequest, mig: str) -> None:
    [ask] = clusterwire.allocate_request_from(bytes(request_)).asks
    assert ask.request.mig == mig
    assert conv.request_to(ask.request).mig == mig
    assert conv.asks_from(pb.AllocateRequest().parse(bytes(request_)).containers)[0].request == ask.request


@pytest.mark.parametrize(
    ("request_", "problem"),
    [
        (mig_request("1g.7gb"), "no card model offers the MIG profile 1g.7gb (known: 1g.10gb"),
        (mig_request("smallest"), "the smallest profile that fits needs gpu-mem or gpu-core"),
        (mig_request("1g.10gb", gpu_mem_mib=8000), "profile 1g.10gb names its memory and compute"),
    ],
)
def test_a_bad_mig_ask_is_refused_naming_the_field(request_: pb.AllocateRequest, problem: str) -> None:
    for read in (clusterwire.allocate_request_from, as_betterproto_reads):
        with pytest.raises(InvalidArgument) as refused:
            read(bytes(request_))
        assert refused.value.field == "containers[0].request.mig"
        assert refused.value.problem.startswith(problem)


def test_holders_and_instances_of_another_wire_type_are_refused_by_name() -> None:
    card = a_node().cards[0]
    holder = clusterwire.holder_bytes(card.holders[0]) + b"\x72\x02\x08\x01"  # mig (14): profile as a number
    bad_holder = clusterwire.card_bytes(replace(card, holders=())) + b"\x4a" + varint(len(holder)) + holder
    bad_instance = clusterwire.card_bytes(card) + b"\x82\x01\x02\x28\x01"  # instances (16): uuid as a number
    for bad, named in ((bad_holder, "holders[0].mig.profile"), (bad_instance, "instances[0].uuid")):
        node = b"\x12" + varint(len(bad)) + bad
        with pytest.raises(InvalidArgument) as refused:
            clusterwire.cluster_from(b"\x0a" + varint(len(node)) + node)
        assert refused.value.field == f"cluster.nodes[0].cards[0].{named}"
