"""An operator's word on a card's health, the inventory's ``set_health`` subject
(``Inventory.set_health``): a card marked healthy or unhealthy, or retired, by whoever decides."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpuledger_core.errors import InvalidArgument, NotFound
from gpuledger_core.ids import CardUuid
from gpuledger_inventory.remediation import Step

if TYPE_CHECKING:
    from gpuledger_inventory.service import Inventory

log = logging.getLogger("gpuledger_inventory.service")  # the service's records, under its name


async def set_health(inv: Inventory, request: Any) -> dict[str, Any]:
    if not isinstance(request, dict):
        raise InvalidArgument("body", "must be an object")
    healthy = request.get("healthy")
    who = request.get("by")
    if not isinstance(healthy, bool):
        raise InvalidArgument("healthy", "must be true or false")
    if not isinstance(who, str) or not who:
        raise InvalidArgument("by", "must name who decides (an operator or a tool)")
    info = inv.state.card_info(request.get("uuid"), _index(request.get("index")))
    if info is None:
        raise NotFound(f"no card {request.get('uuid') or request.get('index')} on node {inv.state.name}")
    note = str(request.get("note") or "")
    retire = request.get("retire", False)
    if not isinstance(retire, bool) or (retire and healthy):
        raise InvalidArgument("retire", "must be true or false, and true only with healthy false")
    if retire and inv.remediator is None:
        raise InvalidArgument("retire", f"remediation is off on node {inv.state.name}")
    uuid = CardUuid(info.uuid)
    word = _word(healthy, retire)
    log.warning("operator %s marks card %s (%s) %s%s", who, info.card.index, uuid, word, _note(note))
    changed = await _operator_word(inv, uuid, healthy, retire, who, note)
    h = inv.state.book.of(uuid)
    card = {
        "uuid": info.uuid,
        "index": info.card.index,
        "health": h.health.value,
        "reason": h.reason,
        "since": h.since,
        "by": h.by,
        "remediation": inv.state.remedies.of(uuid).stage.value,
    }
    return {"card": card, "changed": changed}


async def _operator_word(inv: Inventory, uuid: CardUuid, healthy: bool, retire: bool, who: str, note: str) -> bool:
    """An operator's word always wins: healthy ends any remediation (whatever the health book
    held), retire moves the holders off and keeps the card out. Whether anything changed."""
    now = inv.clock()
    transitions = inv.state.book.set(uuid, healthy, who, note, now)
    await inv._record(transitions)
    steps: list[Step] = []
    if retire:
        steps = inv.state.remedies.retire(uuid, who, note, now)
    elif healthy and inv.remediator is not None:
        steps = inv.state.remedies.on_healed(uuid, f"operator:{who}", now)
    await inv._changed_remedy(steps, [])
    cleared = healthy and inv.mig.clear(uuid)
    if cleared:
        await inv._save()
        await inv._publish_now()
    return bool(transitions or steps or cleared) or retire


def _index(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument("index", f"must be a card index, got {value!r}")
    return value


def _word(healthy: bool, retire: bool) -> str:
    return "retired" if retire else "healthy" if healthy else "unhealthy"


def _note(note: str) -> str:
    return f": {note}" if note else ""
