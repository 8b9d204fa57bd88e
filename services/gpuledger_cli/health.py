"""``gpuledger health``: an operator marks a card healthy or unhealthy (recorded, never silent)."""

from __future__ import annotations

import argparse
import getpass
import json

from gpuledger_common import bus, inventory_api
from gpuledger_common.natscreds import FIELDS, HELP, credentials_of
from gpuledger_common.settings import SettingsError, env_default, nats_servers
from gpuledger_core.errors import InvalidArgument

DEFAULT_NATS = "nats://127.0.0.1:4222"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("health", help="mark a card healthy or unhealthy (asks the node's inventory)")
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
    p.add_argument("--node", required=True, help="the node")
    p.add_argument("--card", required=True, help="card index or UUID")
    state = p.add_mutually_exclusive_group(required=True)
    state.add_argument("--healthy", dest="healthy", action="store_true", help="bring the card back")
    state.add_argument("--unhealthy", dest="healthy", action="store_false", help="take the card out")
    p.add_argument("--by", default="", help="who is doing this (default: the current user)")
    p.add_argument("--note", default="", help="why; recorded with the change")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=set_health)


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


async def set_health(args: argparse.Namespace) -> int:
    card = card_ref(args.card)
    who = args.by or getpass.getuser()
    try:
        credentials = credentials_of(args)
    except SettingsError as err:
        field, _, problem = str(err).partition(": ")
        raise InvalidArgument("--" + field.replace("_", "-"), problem) from None
    nc = await bus.connect(servers(args.nats_url), "gpuledger-cli", credentials=credentials)
    try:
        result = await inventory_api.set_card_health(nc, args.node, card, args.healthy, who, args.note)
    finally:
        await nc.close()
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    c = result.get("card", {})
    change = "now" if result.get("changed") else "already"
    print(f"{args.node} card {c.get('index')} ({c.get('uuid')}) is {change} {c.get('health')}: {c.get('reason')}")
    return 0
