"""The dev overlay ships a ready NATS ``auth.conf`` (written by ``gpuledger nats-config``): each of
its users must have exactly the permissions its role has in ``gpuledger_common.natsauth``. A file
left behind a change of those would refuse, in a dev cluster only, what the services now do."""

from __future__ import annotations

import json

from gpuledger_common.natsauth import PER_NODE, Role, permissions, user_name

from .services import DEPLOY

AUTH = DEPLOY / "kubernetes" / "overlays" / "dev" / "secrets" / "auth.conf"


def users() -> dict[str, dict[str, object]]:
    lines = [line.strip().rstrip(",") for line in AUTH.read_text().splitlines()]
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    return {str(entry["user"]): entry for entry in entries}


def test_every_user_of_the_dev_auth_conf_has_its_roles_permissions() -> None:
    found = users()
    nodes = {name.split("-", 1)[1] for name in found if name.startswith(tuple(f"{r.value}-" for r in PER_NODE))}
    assert nodes, "no per-node users in the dev auth.conf"
    wanted = {user_name(role, ""): permissions(role) for role in Role if role not in PER_NODE}
    wanted |= {user_name(role, node): permissions(role, node) for role in PER_NODE for node in nodes}

    assert set(found) == set(wanted)
    for name, entry in found.items():
        assert entry["permissions"] == wanted[name].to_conf(), f"{name}: regenerate with gpuledger nats-config"
        assert entry["password"], name
