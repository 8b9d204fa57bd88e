"""``gpuledger health``: each card's health, remediation stage and history (a node's in full, the
cluster's in short), or an operator's word on one card: healthy, unhealthy or retired (recorded
with who said it, never silent). The operator's NATS user may do both; a reader's may only look."""

from __future__ import annotations

import argparse
import getpass
import json
import time
from typing import Any

from nats.aio.client import Client

from gpuledger_cli import health_report
from gpuledger_common import bus, card_history, inventory_api
from gpuledger_common.natscreds import FIELDS, HELP, credentials_of
from gpuledger_common.settings import SettingsError, env_default, nats_servers
from gpuledger_core import codec_status
from gpuledger_core.errors import InvalidArgument, Unavailable
from gpuledger_core.status import NodeStatus

DEFAULT_NATS = "nats://127.0.0.1:4222"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "health",
        help="cards' health, remediation and history; or mark a card healthy, unhealthy or retired",
        description="Without --healthy/--unhealthy/--retire: a report (--node: every card of the node "
        "with its history; without: one line per card not serving, and totals).",
    )
    p.add_argument(
        "--nats-url",
        "--nats",
        dest="nats_url",
        default=env_default("nats_url", DEFAULT_NATS),
        help="NATS servers: one URL or a comma-separated list (env GPULEDGER_NATS_URL; default %(default)s)",
    )
    for name in FIELDS:  # the operator's NATS user (role operator) and TLS, as the services take them
        flag = "--" + name.replace("_", "-")
        shown = f"{HELP[name]} (env GPULEDGER_{name.upper()})"
        p.add_argument(flag, dest=name, default=env_default(name, ""), help=shown)
    p.add_argument("--node", default="", help="the node (required to mark a card)")
    p.add_argument("--card", default="", help="card index or UUID (required to mark a card)")
    state = p.add_mutually_exclusive_group()
    state.add_argument("--healthy", dest="mark", action="store_const", const="healthy", help="bring the card back")
    state.add_argument("--unhealthy", dest="mark", action="store_const", const="unhealthy", help="take the card out")
    state.add_argument(
        "--retire", dest="mark", action="store_const", const="retire", help="move its holders off, then keep it out"
    )
    p.add_argument("--by", default="", help="who is doing this (default: the current user)")
    p.add_argument("--note", default="", help="why; recorded with the change")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=health, mark="")


def card_ref(value: str) -> str | int:
    if value.isdigit():
        return int(value)
    if not value.startswith(("GPU-", "MIG-")):
        raise InvalidArgument("--card", f"must be a card index or a GPU-/MIG- UUID, got {value!r}")
    return value


def servers(value: str) -> str:
    try:
        return ",".join(nats_servers(value, "--nats-url"))
    except SettingsError as err:
        raise InvalidArgument("--nats-url", str(err).removeprefix("--nats-url: ")) from None


async def health(args: argparse.Namespace) -> int:
    if args.mark:
        return await set_health(args)
    if args.card and not args.node:
        raise InvalidArgument("--card", "needs --node")
    nc = await connect(args)
    try:
        reports = [await node_report(nc, args.node)] if args.node else await cluster_reports(nc)
    finally:
        await nc.close()
    if args.json:
        print(json.dumps(health_report.to_json(reports), indent=2, sort_keys=True))
    elif args.node:
        print(health_report.node_text(reports[0], time.time(), args.card))
    else:
        print(health_report.cluster_text(reports, time.time()))
    return 0


async def connect(args: argparse.Namespace) -> Client:
    try:
        credentials = credentials_of(args)
    except SettingsError as err:
        field, _, problem = str(err).partition(": ")
        raise InvalidArgument("--" + field.replace("_", "-"), problem) from None
    return await bus.connect(servers(args.nats_url), "gpuledger-cli", credentials=credentials)


async def node_report(nc: Client, node: str, status: NodeStatus | None = None) -> card_history.NodeReport:
    """The node's inventory's account; the ledger's (``status``, else asked for) if it does not answer."""
    try:
        return card_history.from_inventory(await inventory_api.get_inventory(nc, node))
    except Unavailable as err:
        problem = f"its inventory does not answer: {err}"
    status = status or (await ledger_nodes(nc, node))[0]
    return card_history.from_ledger(status, problem)


async def cluster_reports(nc: Client) -> list[card_history.NodeReport]:
    """Every node of the ledger; the inventory of each node with a card not serving is asked."""
    reports = []
    for status in await ledger_nodes(nc):
        if card_history.needs_inventory(status):
            reports.append(await node_report(nc, status.name, status))
        else:
            reports.append(card_history.from_ledger(status, ""))
    return reports


async def ledger_nodes(nc: Client, node: str = "") -> list[NodeStatus]:
    """The ledger's nodes as the allocator lists them (``gpuledger.v1.allocator.cluster``), every page."""
    found: list[NodeStatus] = []
    token = ""
    while True:
        body: dict[str, Any] = {"node": node, "page_token": token}
        reply = await bus.request(nc, f"{bus.SUBJECT_PREFIX}.allocator.cluster", body, 10.0)
        found += [codec_status.node_status_from(n) for n in reply.get("nodes", [])]
        token = reply.get("next_page_token", "")
        if not token:
            return found


async def set_health(args: argparse.Namespace) -> int:
    for flag in ("node", "card"):
        if not getattr(args, flag):
            raise InvalidArgument(f"--{flag}", f"is required with --{args.mark}")
    card = card_ref(args.card)
    who = args.by or getpass.getuser()
    healthy, retire = args.mark == "healthy", args.mark == "retire"
    nc = await connect(args)
    try:
        result = await inventory_api.set_card_health(nc, args.node, card, healthy, who, args.note, retire=retire)
    finally:
        await nc.close()
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    c = result.get("card", {})
    change = "now" if result.get("changed") else "already"
    stage = c.get("remediation", "")
    shown = f" (remediation: {stage})" if stage and stage != "serving" else ""
    print(
        f"{args.node} card {c.get('index')} ({c.get('uuid')}) is {change} {c.get('health')}: {c.get('reason')}{shown}"
    )
    return 0
