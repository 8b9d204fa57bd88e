"""The plugin's ledger changes, as pure transitions for ``LedgerStore.mutate``.

- ``bind``: the container was answered: its grant holds the IDs kubelet chose (trading
  reservations first with a look-alike pending container whose cards they are on), and the
  allocation is ``bound``;
- ``rehome``: a grant moves onto the device IDs kubelet chose (same shares, maybe other cards of
  the same model), only if the cards still fit;
- ``swap``: two containers of different pods exchange their cards (kubelet gave each the other's).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from gpuledger_core.errors import Conflict, FailedPrecondition, InvalidArgument, NotFound
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, commit, reserve
from gpuledger_core.model import Allocation, AllocState, CardShare, Grant, Node
from gpuledger_core.slots import card_of, holders_of_ids

GrantRef = tuple[AllocationId, int]


def bind(
    ledger: NodeLedger | None,
    ref: GrantRef,
    expected: Collection[str],
    ids: Collection[str],
    now: float,
    trade: tuple[GrantRef, Collection[str]] | None = None,
) -> NodeLedger:
    """Re-home the grant onto ``ids`` if they differ, then commit (reserved -> bound); with
    ``trade`` (another grant and its IDs), the two swap their reservations first.

    ``expected`` is the grant's IDs when the decision was made; if someone changed them since (or
    the traded grant's), the decision is stale and this raises ``Conflict``.
    """
    ledger = _present(ledger)
    _expect(ledger, ref, expected)
    if trade is not None:
        _expect(ledger, *trade)
        ledger = swap(ledger, ref, trade[0])
    if frozenset(ids) != frozenset(_grant(ledger, ref).device_ids):
        ledger = rehome(ledger, ref, ids)
    allocation = _allocation(ledger, ref[0])
    if allocation.state is AllocState.RESERVED:
        ledger = commit(ledger, allocation.id, now)
    return ledger


def _expect(ledger: NodeLedger, ref: GrantRef, expected: Collection[str]) -> None:
    grant = _grant(ledger, ref)
    if frozenset(grant.device_ids) != frozenset(expected):
        raise Conflict(f"the reservation of container {grant.container!r} changed while answering")


def rehome(ledger: NodeLedger, ref: GrantRef, ids: Collection[str]) -> NodeLedger:
    allocation = _allocation(ledger, ref[0])
    grant = allocation.grants[ref[1]]
    holders = holders_of_ids(ledger)
    taken = sorted(i for i in ids if holders.get(i, allocation.id) != allocation.id)
    if taken:
        raise Conflict(f"devices {taken} are reserved for another pod")
    cards = _move(ledger.node, grant, ids)
    moved = replace(grant, cards=cards, device_ids=_ordered(grant, ids))
    ledger = _replace_grants(ledger, allocation, {ref[1]: moved})
    if cards != grant.cards:
        _check_fits(ledger, ref[0])
    return ledger


def swap(ledger: NodeLedger | None, one: GrantRef, other: GrantRef) -> NodeLedger:
    """The two grants exchange cards and device IDs (each container keeps its name and kind)."""
    ledger = _present(ledger)
    first, second = _grant(ledger, one), _grant(ledger, other)
    a = replace(first, cards=second.cards, device_ids=second.device_ids)
    b = replace(second, cards=first.cards, device_ids=first.device_ids)
    if one[0] == other[0]:
        ledger = _replace_grants(ledger, _allocation(ledger, one[0]), {one[1]: a, other[1]: b})
    else:
        ledger = _replace_grants(ledger, _allocation(ledger, one[0]), {one[1]: a})
        ledger = _replace_grants(ledger, _allocation(ledger, other[0]), {other[1]: b})
    _check_fits(ledger, one[0], other[0])
    return ledger


def _move(node: Node, grant: Grant, ids: Collection[str]) -> tuple[CardShare, ...]:
    if len(ids) != len(grant.cards):
        raise InvalidArgument("device_ids", f"{len(ids)} devices for a container of {len(grant.cards)} card(s)")
    arriving = sorted({card_of(i) for i in ids} - {s.uuid for s in grant.cards})
    leaving = [s for s in grant.cards if s.uuid not in {card_of(i) for i in ids}]
    if len(arriving) != len(leaving):
        raise InvalidArgument("device_ids", "must name one device on each of distinct cards")
    moves = dict(zip((s.uuid for s in leaving), arriving, strict=True))
    shares = []
    for share in grant.cards:
        target = node.card(moves.get(share.uuid, share.uuid))
        source = node.card(share.uuid)
        if target is None:
            raise NotFound(f"card {moves[share.uuid]} is not on node {node.name}")
        if source is not None and source.model != target.model:
            raise FailedPrecondition(f"card {target.uuid} is a {target.model}, not a {source.model}")
        shares.append(replace(share, uuid=target.uuid, index=target.index))
    return tuple(shares)


def _ordered(grant: Grant, ids: Collection[str]) -> tuple[str, ...]:
    by_card = {card_of(i): i for i in ids}
    kept = [by_card.pop(s.uuid) for s in grant.cards if s.uuid in by_card]
    return (*kept, *sorted(by_card.values()))


def _replace_grants(ledger: NodeLedger, allocation: Allocation, grants: dict[int, Grant]) -> NodeLedger:
    changed = replace(allocation, grants=tuple(grants.get(i, g) for i, g in enumerate(allocation.grants)))
    kept = tuple(changed if a.id == allocation.id else a for a in ledger.allocations)
    return replace(ledger, allocations=kept)


def _check_fits(ledger: NodeLedger, *allocation_ids: AllocationId) -> None:
    """Raise ``Exhausted`` if a changed allocation no longer fits beside all the others."""
    for allocation_id in allocation_ids:
        changed = _allocation(ledger, allocation_id)
        others = tuple(a for a in ledger.allocations if a.id != allocation_id)
        reserve(replace(ledger, allocations=others), changed)


def _present(ledger: NodeLedger | None) -> NodeLedger:
    if ledger is None:
        raise NotFound("this node has no ledger entry yet (has its inventory been published?)")
    return ledger


def _allocation(ledger: NodeLedger, allocation_id: AllocationId) -> Allocation:
    found = ledger.get(allocation_id)
    if found is None or not found.live:
        raise NotFound(f"allocation {allocation_id} is no longer live on {ledger.node.name}")
    return found


def _grant(ledger: NodeLedger, ref: GrantRef) -> Grant:
    allocation = _allocation(ledger, ref[0])
    if not 0 <= ref[1] < len(allocation.grants):
        raise NotFound(f"allocation {ref[0]} has no container #{ref[1]}")
    return allocation.grants[ref[1]]
