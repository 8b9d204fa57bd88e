"""The allocator's protobuf messages to and from domain values, for the server and its clients."""

from __future__ import annotations

from typing import TypeVar

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.events import LedgerEvent
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.mig import unknown_profile
from gpuledger_core.model import (
    MIG_SMALLEST,
    Allocation,
    AllocState,
    Card,
    CardMode,
    CardShare,
    Drain,
    Grant,
    Health,
    Isolation,
    MigInstance,
    MigSlot,
    Owner,
    OwnerKind,
    Remedy,
    Request,
)
from gpuledger_core.status import CardStatus, Holder, NodeStatus
from gpuledger_proto.gpuledger.allocator import v1 as pb

E = TypeVar("E", OwnerKind, Isolation, AllocState, Health, Remedy, CardMode)


def enum_of(kind: type[E], value: str, field: str, default: E | None = None) -> E:
    """The member named ``value``, or a refusal naming ``field`` and the choices."""
    if not value and default is not None:
        return default
    try:
        return kind(value)
    except ValueError:
        choices = "|".join(m.value for m in kind)
        raise InvalidArgument(field, f"must be one of {choices}, got {value!r}") from None


def _typed(value: object, kind: type | tuple[type, ...], field: str) -> None:
    """A parsed message can hold a value of the wrong type (betterproto keeps a field sent with
    another wire type as it came): refuse it by name rather than fail on it later."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        problem = f"has the wrong type {type(value).__name__} (a field sent with another wire type?)"
        raise InvalidArgument(field, problem)


def owner_from(msg: pb.Owner | None, field: str = "owner") -> Owner:
    if msg is None:
        raise InvalidArgument(field, "is required")
    _typed(msg, pb.Owner, field)
    for name in ("kind", "id", "namespace", "name"):
        _typed(getattr(msg, name), str, f"{field}.{name}")
    try:
        return Owner(enum_of(OwnerKind, msg.kind, f"{field}.kind"), msg.id, msg.namespace, msg.name)
    except InvalidArgument as err:
        raise InvalidArgument(f"{field}.{err.field.removeprefix('owner.')}", err.problem) from err


def owner_to(owner: Owner) -> pb.Owner:
    return pb.Owner(kind=owner.kind.value, id=owner.id, namespace=owner.namespace, name=owner.name)


def request_from(msg: pb.ResourceRequest | None, field: str) -> Request:
    if msg is None:
        raise InvalidArgument(field, "is required")
    _typed(msg, pb.ResourceRequest, field)
    _typed(msg.gpu, int, f"{field}.gpu")
    for name in ("gpu_mem_mib", "gpu_core_permille"):
        _typed(getattr(msg, name), (int, type(None)), f"{field}.{name}")
    _typed(msg.models, list, f"{field}.models")
    for i, model in enumerate(msg.models):
        _typed(model, str, f"{field}.models[{i}]")
    _typed(msg.mig, str, f"{field}.mig")
    try:
        return Request(
            count=msg.gpu,
            mem_mib=msg.gpu_mem_mib,
            core_milli=msg.gpu_core_permille,
            models=frozenset(m for m in msg.models if m),
            mig=mig_of(msg.mig),
        )
    except InvalidArgument as err:
        raise InvalidArgument(f"{field}.{err.field}", err.problem) from err


def mig_of(asked: str) -> str:
    """A request's ``mig`` as asked: "" (none), ``MIG_SMALLEST``, or a profile some card model
    offers; any other name is refused here, as ``mig.request_of`` refuses a resource naming it,
    rather than placed nowhere. (``Request`` checks the sizes that go with each.)"""
    unknown = unknown_profile(asked) if asked and asked != MIG_SMALLEST else ""
    if unknown:
        raise InvalidArgument("mig", f"{unknown}, or {MIG_SMALLEST} for the smallest that holds gpu_mem_mib")
    return asked


def request_to(request: Request) -> pb.ResourceRequest:
    return pb.ResourceRequest(
        gpu=request.count,
        gpu_mem_mib=request.mem_mib,
        gpu_core_permille=request.core_milli,
        models=sorted(request.models),
        mig=request.mig,
    )


def asks_from(containers: list[pb.ContainerRequest]) -> tuple[ContainerAsk, ...]:
    _typed(containers, list, "containers")
    return tuple(_ask_from(c, f"containers[{i}]") for i, c in enumerate(containers))


def _ask_from(c: pb.ContainerRequest, field: str) -> ContainerAsk:
    _typed(c, pb.ContainerRequest, field)
    _typed(c.container, str, f"{field}.container")
    _typed(c.init, bool, f"{field}.init")
    return ContainerAsk(c.container, request_from(c.request, f"{field}.request"), c.init)


def share_to(s: CardShare) -> pb.CardShare:
    return pb.CardShare(
        uuid=s.uuid,
        index=s.index,
        mem_mib=s.mem_mib,
        core_permille=s.core_milli,
        exclusive=s.exclusive,
        mig=slot_to(s.mig),
    )


def share_from(m: pb.CardShare) -> CardShare:
    return CardShare(CardUuid(m.uuid), m.index, m.mem_mib, m.core_permille, m.exclusive, slot_from(m.mig))


def slot_to(slot: MigSlot | None) -> pb.MigSlot | None:
    return None if slot is None else pb.MigSlot(profile=slot.profile, start=slot.start, size=slot.size)


def slot_from(m: pb.MigSlot | None) -> MigSlot | None:
    """None when unset (a placement always names its profile)."""
    if m is None or not m.profile:
        return None
    return MigSlot(m.profile, m.start, m.size)


def instance_to(c: CardStatus, i: MigInstance) -> pb.MigInstanceStatus:
    """One of the card's instances, with the allocation holding it where one of its holders does."""
    holder = c.holder_of(i)
    return pb.MigInstanceStatus(
        profile=i.slot.profile,
        start=i.slot.start,
        size=i.slot.size,
        static=i.static,
        uuid=i.uuid,
        allocation_id=holder.allocation_id if holder is not None else "",
        fault=i.fault,
        remedy=i.remedy.value,
    )


def instance_from(m: pb.MigInstanceStatus) -> MigInstance:
    """An instance as the ledger holds it (who holds it is the card's holders' to say)."""
    slot = MigSlot(m.profile, m.start, m.size)
    return MigInstance(slot, m.static, m.uuid, m.fault, enum_of(Remedy, m.remedy, "remedy", Remedy.NONE))


def allocation_to(a: Allocation) -> pb.Allocation:
    return pb.Allocation(
        id=a.id,
        owner=owner_to(a.owner),
        node=a.node,
        grants=[pb.Grant(container=g.container, cards=[share_to(s) for s in g.cards], init=g.init) for g in a.grants],
        state=a.state.value,
        isolation=a.isolation.value,
        created_at=a.created_at,
        updated_at=a.updated_at,
        lease_expires_at=a.lease_expires_at or 0.0,
        reason=a.reason,
        drain=drain_to(a.drain) if a.drain is not None else None,
    )


def drain_to(d: Drain) -> pb.Drain:
    return pb.Drain(card=d.card, card_index=d.card_index, since=d.since, release_at=d.release_at, reason=d.reason)


def drain_from(m: pb.Drain | None) -> Drain | None:
    """None when unset (a drain always names its card)."""
    if m is None or not m.card:
        return None
    return Drain(CardUuid(m.card), m.card_index, m.since, m.release_at, m.reason)


def allocation_from(m: pb.Allocation) -> Allocation:
    return Allocation(
        id=AllocationId(m.id),
        owner=owner_from(m.owner),
        node=NodeName(m.node),
        grants=tuple(Grant(g.container, tuple(share_from(s) for s in g.cards), g.init) for g in m.grants),
        state=enum_of(AllocState, m.state, "state"),
        isolation=enum_of(Isolation, m.isolation, "isolation", Isolation.NONE),
        created_at=m.created_at,
        updated_at=m.updated_at,
        lease_expires_at=m.lease_expires_at or None,
        reason=m.reason,
        drain=drain_from(m.drain),
    )


def holder_to(h: Holder) -> pb.Holder:
    return pb.Holder(
        allocation_id=h.allocation_id,
        owner=owner_to(h.owner),
        container=h.container,
        mem_mib=h.mem_mib,
        core_permille=h.core_milli,
        exclusive=h.exclusive,
        state=h.state.value,
        since=h.since,
        measured=h.used_mib is not None,
        used_mib=h.used_mib or 0,
        over_grant=h.over,
        core_measured=h.used_core_milli is not None,
        used_core_permille=h.used_core_milli or 0,
        mig=slot_to(h.mig),
    )


def holder_from(m: pb.Holder) -> Holder:
    return Holder(
        AllocationId(m.allocation_id),
        owner_from(m.owner),
        m.container,
        m.mem_mib,
        m.core_permille,
        m.exclusive,
        enum_of(AllocState, m.state, "state"),
        m.since,
        m.used_mib if m.measured else None,
        m.over_grant,
        m.used_core_permille if m.core_measured else None,
        slot_from(m.mig),
    )


def node_status_to(s: NodeStatus) -> pb.NodeStatus:
    cards = [
        pb.CardStatus(
            uuid=c.card.uuid,
            index=c.card.index,
            model=c.card.model,
            memory_mib=c.card.memory_mib,
            free_mem_mib=c.free_mem_mib,
            free_core_permille=c.free_core_milli,
            health=c.card.health.value,
            numa=-1 if c.card.numa is None else c.card.numa,
            holders=[holder_to(h) for h in c.holders],
            processes=c.processes,
            foreign_processes=c.foreign_processes,
            foreign_mem_mib=c.foreign_mib,
            health_reason=c.card.health_reason,
            remedy=c.card.remedy.value,
            mode=c.card.mode.value,
            instances=[instance_to(c, i) for i in c.card.instances],
        )
        for c in s.cards
    ]
    return pb.NodeStatus(name=s.name, cards=cards, stale=s.stale, revision=s.revision, unreadable=s.unreadable)


def node_status_from(m: pb.NodeStatus) -> NodeStatus:
    cards = tuple(
        CardStatus(
            Card(
                CardUuid(c.uuid),
                c.index,
                c.model,
                c.memory_mib,
                None if c.numa < 0 else c.numa,
                enum_of(Health, c.health, "health", Health.HEALTHY),
                health_reason=c.health_reason,
                remedy=enum_of(Remedy, c.remedy, "remedy", Remedy.NONE),
                mode=enum_of(CardMode, c.mode, "mode", CardMode.WHOLE),
                instances=tuple(instance_from(i) for i in c.instances),
            ),
            c.free_mem_mib,
            c.free_core_permille,
            tuple(holder_from(h) for h in c.holders),
            c.processes,
            c.foreign_processes,
            c.foreign_mem_mib,
        )
        for c in m.cards
    )
    return NodeStatus(NodeName(m.name), cards, m.stale, m.revision, m.unreadable)


def event_to(e: LedgerEvent) -> pb.LedgerEvent:
    return pb.LedgerEvent(
        kind=e.kind.value,
        node=e.node,
        revision=e.revision,
        allocation=allocation_to(e.allocation) if e.allocation else None,
    )
