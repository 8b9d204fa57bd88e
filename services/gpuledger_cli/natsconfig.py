"""``gpuledger nats-config``: the nats-server ``authorization`` block for a fleet, and a password
per user (one per central role, an inventory and a plugin user per node).

    python -m gpuledger_cli.natsconfig --out nats-auth --node gpu-1 --node gpu-2
    python -m gpuledger_cli.natsconfig --out nats-auth --nodes-file nodes.txt

writes ``nats-auth/auth.conf`` (``include`` it from nats.conf) and ``nats-auth/passwords/<user>``
(mode 0600). Passwords already in the directory are kept, so adding a node and running it again
changes nobody else's. See docs/security.md for how each password reaches its service.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuledger_common.natsauth import PER_NODE, AuthConfigError, Role, authorization_conf, user_name, users_for


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("nats-config", help="write nats-server's users and permissions for a fleet")
    add_arguments(p)
    p.set_defaults(run=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for auth.conf and passwords/ (made if missing)")
    p.add_argument("--node", action="append", default=[], help="a node's name (repeatable)")
    p.add_argument("--nodes-file", default="", help="a file of node names, one a line (# comments)")


def node_names(args: argparse.Namespace) -> list[str]:
    names = list(args.node)
    if args.nodes_file:
        for line in Path(args.nodes_file).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line)
    return names


def write(out: Path, nodes: Sequence[str]) -> list[str]:
    """Write ``auth.conf`` and any missing password under ``out``; the user names, in order."""
    passwords_dir = out / "passwords"
    passwords_dir.mkdir(parents=True, exist_ok=True)
    names = [user_name(r) for r in Role if r not in PER_NODE]
    names += [user_name(r, n) for n in sorted(set(nodes)) for r in PER_NODE]
    passwords: dict[str, str] = {}
    for name in names:
        path = passwords_dir / name
        if not path.exists():
            path.write_text(secrets.token_urlsafe(32) + "\n")
            path.chmod(0o600)
        passwords[name] = path.read_text().strip()
    conf = out / "auth.conf"
    conf.write_text(authorization_conf(users_for(nodes, passwords)))
    conf.chmod(0o600)
    return names


async def run(args: argparse.Namespace) -> int:
    return main_args(args)


def main_args(args: argparse.Namespace) -> int:
    try:
        names = write(Path(args.out), node_names(args))
    except (AuthConfigError, OSError) as err:
        print(f"gpuledger nats-config: {err}", file=sys.stderr)
        return 2
    print(f"wrote {Path(args.out) / 'auth.conf'} with {len(names)} users: {', '.join(names)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuledger nats-config", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return main_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
