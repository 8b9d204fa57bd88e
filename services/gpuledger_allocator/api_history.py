"""The dashboard's card history: ``GET /api/nodes/<node>/cards/<uuid>/history``.

A card's remediation stages and health transitions, with times, reasons and who, as its node's
inventory tells them (``gpuledger.v1.inventory.<node>.get``: the one request of an inventory the
allocator's NATS user may make). Where the inventory does not answer within ``ASK_TIMEOUT_S``, the
ledger's health and remedy, with ``problem`` saying so. Read-only: the page asks when a card's
details open. A node must be in this replica's view, and the card on it, before anything is asked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from nats.aio.client import Client

from gpuledger_allocator.view import ClusterView
from gpuledger_common import inventory_api
from gpuledger_common.card_history import CardReport, card_json, from_inventory, from_ledger
from gpuledger_common.natsauth import AuthConfigError, check_node
from gpuledger_core.errors import InvalidArgument, NotFound, Unavailable
from gpuledger_core.ids import NodeName
from gpuledger_core.status import NodeStatus

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 3.0  # a page waits on it: an inventory that is up answers in milliseconds
NO_ANSWER = "history unavailable: the node's inventory did not answer"
UNREADABLE = "history unavailable: the node's inventory answered what could not be read"
_UUID = re.compile(r"^(GPU|MIG)-[A-Za-z0-9-]{1,80}$")

AskInventory = Callable[[NodeName], Awaitable[Mapping[str, Any]]]


def inventory_asker(nc: Client, timeout: float = ASK_TIMEOUT_S) -> AskInventory:
    """Ask a node's inventory for its message (each card's health, remediation and history)."""

    async def ask(node: NodeName) -> Mapping[str, Any]:
        return await inventory_api.get_inventory(nc, node, timeout)

    return ask


def history_route(view: ClusterView, ask: AskInventory) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler: 200 with the card's history, 400 for a name that is not one, 404 for a node
    not in the ledger or a card not on it."""

    async def history(request: web.Request) -> web.Response:
        try:
            body = await card_history(view, ask, request.match_info["node"], request.match_info["uuid"])
        except InvalidArgument as err:
            return web.json_response({"error": str(err)}, status=400)
        except NotFound as err:
            return web.json_response({"error": str(err)}, status=404)
        return web.json_response(body)

    return history


async def card_history(view: ClusterView, ask: AskInventory, node: str, uuid: str) -> dict[str, Any]:
    """The card's report as JSON (``card_history.card_json``) and ``problem`` ("" when its
    inventory answered)."""
    status = _node(view, node)
    _check_card(status, uuid)
    try:
        report = _card(from_inventory(await ask(status.name)).cards, uuid)
    except Unavailable as err:
        log.info("card history of %s on %s: %s", uuid, node, err)
        return _from_ledger(status, uuid, NO_ANSWER)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        log.warning("card history of %s on %s: the inventory's answer cannot be read: %r", uuid, node, err)
        return _from_ledger(status, uuid, UNREADABLE)
    if report is None:
        return _from_ledger(status, uuid, f"history unavailable: the node's inventory does not know card {uuid}")
    return card_json(report) | {"problem": ""}


def _node(view: ClusterView, node: str) -> NodeStatus:
    try:
        check_node(node)  # it becomes a NATS subject: no wildcard, no space
    except AuthConfigError:
        raise InvalidArgument("node", f"{node[:80]!r} is not a Kubernetes node name") from None
    status = view.status(NodeName(node))
    if status is None:
        raise NotFound(f"node {node!r} is not in the ledger")
    return status


def _check_card(status: NodeStatus, uuid: str) -> None:
    if not _UUID.match(uuid):
        raise InvalidArgument("uuid", f"{uuid[:80]!r} is not a card UUID (GPU-... or MIG-...)")
    if not any(c.card.uuid == uuid for c in status.cards):
        raise NotFound(f"card {uuid} is not on node {status.name!r}")


def _card(cards: tuple[CardReport, ...], uuid: str) -> CardReport | None:
    return next((c for c in cards if c.uuid == uuid), None)


def _from_ledger(status: NodeStatus, uuid: str, problem: str) -> dict[str, Any]:
    """What the ledger shows of the card (health, reason, remedy; no times or history)."""
    report = _card(from_ledger(status, problem).cards, uuid)
    assert report is not None  # _check_card found it on the node
    return card_json(report) | {"problem": problem}
