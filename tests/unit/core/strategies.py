"""Hypothesis strategies for domain values."""

from __future__ import annotations

from hypothesis import strategies as st

from gpuledger_core.events import EventKind, LedgerEvent
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import (
    CORE_WHOLE,
    MAX_CARDS_PER_REQUEST,
    Allocation,
    AllocState,
    Card,
    CardShare,
    Drain,
    Grant,
    Health,
    Isolation,
    Link,
    Node,
    Owner,
    OwnerKind,
    PcieLevel,
    Remedy,
    Request,
)
from gpuledger_core.status import CardStatus, Holder, NodeStatus

texts = st.text(max_size=12)
names = st.text(min_size=1, max_size=12)
times = st.floats(min_value=0, max_value=1e10, allow_nan=False, allow_infinity=False)
mib = st.integers(min_value=0, max_value=200_000)
core = st.integers(min_value=0, max_value=CORE_WHOLE)


cards = st.builds(
    Card,
    uuid=names.map(CardUuid),
    index=st.integers(0, 15),
    model=texts,
    memory_mib=mib,
    numa=st.none() | st.integers(0, 3),
    health=st.sampled_from(Health),
    minor=st.none() | st.integers(0, 15),
    pci_bus_id=texts,
    remedy=st.sampled_from(Remedy),
)
links = st.builds(Link, st.integers(0, 7), st.integers(8, 15), st.integers(0, 18), st.sampled_from(PcieLevel))
labels = st.dictionaries(texts, texts, max_size=3).map(lambda d: tuple(sorted(d.items())))
nodes = st.builds(
    Node,
    name=names.map(NodeName),
    cards=st.lists(cards, max_size=4).map(tuple),
    links=st.lists(links, max_size=3).map(tuple),
    cpu_milli=st.integers(0, 10**6),
    memory_mib=mib,
    labels=labels,
)
requests = st.builds(
    Request,
    count=st.integers(1, MAX_CARDS_PER_REQUEST),
    mem_mib=st.none() | st.integers(1, 200_000),
    core_milli=st.none() | st.integers(1, CORE_WHOLE),
    models=st.frozensets(texts, max_size=3),
)
owners = st.builds(Owner, st.sampled_from(OwnerKind), names, texts, texts)
shares = st.builds(CardShare, names.map(CardUuid), st.integers(0, 15), mib, core, st.booleans())
grants = st.builds(Grant, texts, st.lists(shares, max_size=3).map(tuple), st.booleans())
allocations = st.builds(
    Allocation,
    id=names.map(AllocationId),
    owner=owners,
    node=names.map(NodeName),
    grants=st.lists(grants, max_size=3).map(tuple),
    state=st.sampled_from(AllocState),
    isolation=st.sampled_from(Isolation),
    created_at=times,
    updated_at=times,
    lease_expires_at=st.none() | times,
    requests=st.lists(requests, max_size=2).map(tuple),
    reason=texts,
    drain=st.none() | st.builds(Drain, names.map(CardUuid), st.integers(0, 15), times, times, texts),
)
ledgers = st.builds(NodeLedger, nodes, st.lists(allocations, max_size=3).map(tuple))
events = st.builds(
    LedgerEvent,
    kind=st.sampled_from(EventKind),
    node=names.map(NodeName),
    revision=st.integers(0, 2**40),
    allocation=st.none() | allocations,
    inventory=st.none() | nodes,
)
holders = st.builds(
    Holder,
    names.map(AllocationId),
    owners,
    texts,
    mib,
    core,
    st.booleans(),
    st.sampled_from(AllocState),
    times,
    st.none() | mib,
    st.booleans(),
    st.none() | core,
)
card_statuses = st.builds(CardStatus, cards, mib, core, st.lists(holders, max_size=2).map(tuple))
node_statuses = st.builds(
    NodeStatus,
    names.map(NodeName),
    st.lists(card_statuses, max_size=3).map(tuple),
    st.booleans(),
    st.integers(0, 2**40),
)
