"""NATS least privilege: one user per role, the subjects each may use, and the server's
``authorization`` block built from them (``gpuledger nats-config``; see docs/security.md).

A node's inventory and plugin get a user of their own (``inventory-<node>``, ``plugin-<node>``)
that may publish only that node's subjects and write only that node's ledger key: a JetStream KV
put is a publish on ``$KV.<bucket>.<key>``, and the reads and watches a role needs are listed as
the ``$JS.API`` subjects they use, one by one. Every user gets its own inbox prefix
(``_INBOX.<user>``), so no user can subscribe to the replies meant for another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from gpuledger_common.bus import SUBJECT_PREFIX
from gpuledger_common.natscreds import inbox_prefix

LEDGER = "gpuledger-ledger"
OWNERS = "gpuledger-owners"
API = "$JS.API"
EVENTS = f"{SUBJECT_PREFIX}.events"
INVENTORY = f"{SUBJECT_PREFIX}.inventory"
HEARTBEAT = f"{SUBJECT_PREFIX}.heartbeat"
ALLOCATOR = f"{SUBJECT_PREFIX}.allocator"
PLACEMENT = f"{SUBJECT_PREFIX}.placement"
LEDGER_YIELD = f"{SUBJECT_PREFIX}.ledger.yield"  # the ledger's writers ask one another to yield a hot key

# A node name as Kubernetes allows it (a DNS subdomain): nothing a subject would read as a wildcard.
_NODE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


class Role(StrEnum):
    ALLOCATOR = "allocator"
    PLACEMENT = "placement"
    INVENTORY = "inventory"  # one user per node
    PLUGIN = "plugin"  # one user per node
    READER = "reader"  # the CLI's and the dashboard's reads: nothing written
    OPERATOR = "operator"  # a reader that may also mark cards healthy or unhealthy (``gpuledger health``)


PER_NODE = (Role.INVENTORY, Role.PLUGIN)


class AuthConfigError(ValueError):
    """A node name or user that cannot be given a safe set of permissions."""


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False

    def to_conf(self) -> dict[str, object]:
        conf: dict[str, object] = {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            conf["allow_responses"] = True
        return conf


def check_node(node: str) -> str:
    """``node`` if it is a Kubernetes node name; a wildcard (``*``, ``>``) or a space in it
    would widen a permission beyond the node, so anything else is refused."""
    if len(node) > 253 or not _NODE.match(node):
        raise AuthConfigError(f"node {node!r}: not a Kubernetes node name (lower-case DNS subdomain)")
    return node


def user_name(role: Role, node: str = "") -> str:
    if role in PER_NODE:
        if not node:
            raise AuthConfigError(f"role {role}: needs a node")
        return f"{role}-{check_node(node)}"
    if node:
        raise AuthConfigError(f"role {role}: is not per node, got node {node!r}")
    return str(role)


def _reads(bucket: str, key: str) -> tuple[str, ...]:
    """What reading ``key`` (a wildcard allowed) of ``bucket`` needs: the bucket's stream info
    (opening it, listing its keys), a direct get of the key's last value and a stream message
    get (a write whose answer was lost is looked up by sequence)."""
    stream = f"KV_{bucket}"
    return (
        f"{API}.STREAM.INFO.{stream}",
        f"{API}.DIRECT.GET.{stream}.$KV.{bucket}.{key}",
        f"{API}.STREAM.MSG.GET.{stream}",
    )


def _watches(bucket: str, key: str) -> tuple[str, ...]:
    """What watching ``key`` of ``bucket`` needs: an ordered consumer (nats-py names none, so it
    is made on the subject that carries no filter: a watcher may read every key of the bucket),
    its deletion and its flow-control replies."""
    stream = f"KV_{bucket}"
    return (
        f"{API}.CONSUMER.CREATE.{stream}",
        f"{API}.CONSUMER.INFO.{stream}.*",
        f"{API}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    )


def permissions(role: Role, node: str = "") -> Permissions:
    user = user_name(role, node)
    inbox = f"{inbox_prefix(user)}.>"
    if role is Role.ALLOCATOR:  # the ledger's owner: makes and tunes the buckets
        return Permissions(
            (
                f"{API}.>",
                f"$KV.{LEDGER}.>",
                f"$KV.{OWNERS}.>",
                "$JS.FC.>",
                f"{EVENTS}.>",
                f"{PLACEMENT}.place",
                f"{INVENTORY}.*.get",  # a card's history for the dashboard: the inventory's read only
                LEDGER_YIELD,
            ),
            (f"{ALLOCATOR}.>", f"{INVENTORY}.*", f"{HEARTBEAT}.*", LEDGER_YIELD, inbox),
            allow_responses=True,
        )
    if role is Role.PLACEMENT:  # binds pods: reserves on any node, claims owners
        return Permissions(
            (
                *_reads(LEDGER, ">"),
                *_watches(LEDGER, "node.>"),
                *_reads(OWNERS, ">"),
                f"$KV.{LEDGER}.node.>",  # a node name may hold dots (a DNS subdomain)
                f"$KV.{OWNERS}.>",
                f"{EVENTS}.>",
                LEDGER_YIELD,
                f"{INVENTORY}.*.mig.make",  # mode C: a claim's MIG instances made before its allocation is written
            ),
            (f"{PLACEMENT}.>", f"{INVENTORY}.*", f"{HEARTBEAT}.*", LEDGER_YIELD, inbox),
            allow_responses=True,
        )
    if role is Role.INVENTORY:  # it reads (never writes) its node's ledger: taints, drains, MIG instances' holders
        key = f"node.{node}"
        return Permissions(
            (
                f"{INVENTORY}.{node}",
                f"{INVENTORY}.{node}.health",
                f"{HEARTBEAT}.{node}",
                *_reads(LEDGER, key),
                *_watches(LEDGER, key),
                f"{API}.STREAM.INFO.KV_{OWNERS}",
            ),
            (f"{INVENTORY}.{node}.set_health", f"{INVENTORY}.{node}.get", f"{INVENTORY}.{node}.mig.make", inbox),
            allow_responses=True,
        )
    if role is Role.PLUGIN:
        key = f"node.{node}"
        return Permissions(
            (
                *_reads(LEDGER, key),
                *_watches(LEDGER, key),
                f"{API}.STREAM.INFO.KV_{OWNERS}",
                f"$KV.{LEDGER}.{key}",
                f"{EVENTS}.{node}",
                f"{PLACEMENT}.preferred",
                f"{INVENTORY}.{node}.mig.make",  # its node's inventory makes a MIG instance before a container starts
            ),
            (inbox,),
        )
    reads = (
        *_reads(LEDGER, ">"),
        *_reads(OWNERS, ">"),
        f"{ALLOCATOR}.get",
        f"{ALLOCATOR}.list",
        f"{ALLOCATOR}.cluster",
        f"{INVENTORY}.*.get",
    )
    extra = (f"{INVENTORY}.*.set_health",) if role is Role.OPERATOR else ()
    return Permissions((*reads, *extra), (f"{EVENTS}.>", f"{INVENTORY}.>", f"{HEARTBEAT}.*", inbox))


@dataclass(frozen=True, slots=True)
class User:
    role: Role
    node: str
    password: str

    @property
    def name(self) -> str:
        return user_name(self.role, self.node)


def users_for(nodes: Iterable[str], passwords: dict[str, str]) -> list[User]:
    """Every user of a deployment: the central roles, then an inventory and a plugin per node;
    ``passwords`` by user name (a user missing from it is an error: no default password)."""
    wanted = [(role, "") for role in Role if role not in PER_NODE]
    wanted += [(role, check_node(node)) for node in sorted(set(nodes)) for role in PER_NODE]
    found: list[User] = []
    for role, node in wanted:
        name = user_name(role, node)
        if not passwords.get(name):
            raise AuthConfigError(f"user {name}: no password given")
        found.append(User(role, node, passwords[name]))
    return found


def authorization_conf(users: Iterable[User]) -> str:
    """The nats-server ``authorization`` block for ``users`` (strings JSON-quoted, which the
    server's config format reads as they are: no ``$`` variable expansion inside quotes)."""
    lines = ["authorization {", "  users = ["]
    for user in users:
        entry = {
            "user": user.name,
            "password": user.password,
            "permissions": permissions(user.role, user.node).to_conf(),
        }
        lines.append("    " + json.dumps(entry, sort_keys=True) + ",")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def tls_conf(cert: str, key: str, ca: str, *, verify: bool = False, indent: str = "") -> str:
    """A ``tls`` block (clients; with ``verify``, each must present a certificate from ``ca``)."""
    body = [f"cert_file: {json.dumps(cert)}", f"key_file: {json.dumps(key)}", f"ca_file: {json.dumps(ca)}"]
    if verify:
        body.append("verify: true")
    inner = "".join(f"{indent}  {line}\n" for line in body)
    return f"{indent}tls {{\n{inner}{indent}}}\n"
