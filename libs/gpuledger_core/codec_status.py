"""A node's status, as the NATS cluster listing and its readers carry it, to and from plain dicts:
each card with what is free on it and its holders, a holder of a MIG placement with it
(docs/nats-api.md, ``NodeStatus``). The card and
owner inside are written and read by ``gpuledger_core.codec``, so they read as in the ledger."""

from __future__ import annotations

from gpuledger_core.codec import Json, Reader, card_from, card_to, owner_from, owner_to
from gpuledger_core.codec_mig import slot_from, slot_to
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.model import AllocState
from gpuledger_core.status import CardStatus, Holder, NodeStatus


def holder_to(h: Holder) -> Json:
    out = {
        "allocation_id": h.allocation_id,
        "owner": owner_to(h.owner),
        "container": h.container,
        "mem_mib": h.mem_mib,
        "core_milli": h.core_milli,
        "exclusive": h.exclusive,
        "state": h.state.value,
        "since": h.since,
        "used_mib": h.used_mib,
        "over": h.over,
        "used_core_milli": h.used_core_milli,
    }
    if h.mig is not None:  # written only when set: a holder of a share is as before
        out["mig"] = slot_to(h.mig)
    return out


def holder_from(r: Reader) -> Holder:
    return Holder(
        AllocationId(r.text("allocation_id")),
        owner_from(r.obj("owner")),
        r.text("container", ""),
        r.integer("mem_mib"),
        r.integer("core_milli"),
        r.flag("exclusive"),
        r.enum("state", AllocState),
        r.number("since", 0.0),
        r.opt_int("used_mib"),
        r.flag("over"),
        r.opt_int("used_core_milli"),
        slot_from(r.obj("mig")) if r.raw.get("mig") is not None else None,
    )


def node_status_to(s: NodeStatus) -> Json:
    return {
        "name": s.name,
        "stale": s.stale,
        "revision": s.revision,
        **({"unreadable": s.unreadable} if s.unreadable else {}),
        "cards": [
            {
                **card_to(c.card),
                "free_mem_mib": c.free_mem_mib,
                "free_core_milli": c.free_core_milli,
                "holders": [holder_to(h) for h in c.holders],
                "processes": c.processes,
                "foreign_processes": c.foreign_processes,
                "foreign_mib": c.foreign_mib,
            }
            for c in s.cards
        ],
    }


def node_status_from(raw: object) -> NodeStatus:
    r = Reader(raw)

    def card_status(cr: Reader) -> CardStatus:
        free_mem, free_core = cr.integer("free_mem_mib"), cr.integer("free_core_milli")
        foreign = cr.integer("processes", 0), cr.integer("foreign_processes", 0), cr.integer("foreign_mib", 0)
        return CardStatus(card_from(cr), free_mem, free_core, cr.items("holders", holder_from), *foreign)

    name, stale = NodeName(r.text("name")), r.flag("stale")
    return NodeStatus(name, r.items("cards", card_status), stale, r.integer("revision", 0), r.text("unreadable", ""))
