"""``gpuledger local-credentials``: every credential a stack on one machine (docker compose) needs,
in one directory, so that it runs with the controls a cluster has: TLS and a user per role and node
on NATS, mutual TLS on the allocator's gRPC API.

    gpuledger local-credentials --out /credentials --node rtx-0 --node p4-0

writes under ``--out``:

- ``nats/auth.conf``, ``nats/passwords/<user>``: users and permissions (``gpuledger nats-config``);
- ``tls/ca.crt``: a new CA, which signed
- ``tls/nats.crt``, ``tls/nats.key``: the NATS server (for ``--nats-host``),
- ``tls/allocator.crt``, ``tls/allocator.key``: the allocator's gRPC server (for ``--allocator-host``),
- ``tls/placement.crt``, ``tls/placement.key``: the extender's HTTPS server (for ``--placement-host``),
- ``tls/admin.crt``, ``tls/admin.key``: the client certificate ``gpuledger-admin`` (a gRPC admin),
- ``tls/scheduler.crt``, ``tls/scheduler.key``: the client certificate ``gpuledger-scheduler``, the
  one the extender lets in (for a kube-scheduler, or a test, that calls it).

What exists is kept: run again, nothing changes, but a node added gets its NATS users. The CA's key
is never written, so no further certificate can be signed with it. For a cluster, use your own CA
(docs/operator-guide.md).

With ``--consumers DIR`` it also gives each consumer a directory ``DIR/<consumer>`` holding only
what that consumer needs, copied from ``--out`` on every run (the compose stack mounts each one as
its own volume into one container, so that no container holds another's key or password):

- ``nats/``: ``ca.crt``, ``nats.crt``, ``nats.key``, ``auth.conf``;
- ``<user>/`` for every NATS user (``allocator``, ``placement``, ``reader``, ``operator``,
  ``inventory-<node>``, ``plugin-<node>``): ``ca.crt`` and ``nats-password``, and for
  ``allocator`` and ``placement`` their server's ``<user>.crt`` and ``<user>.key``;
- ``admin/``, ``scheduler/``: ``ca.crt`` and the client certificate ``admin.crt``, ``admin.key``
  (``scheduler.crt``, ``scheduler.key``).

Keys, passwords and ``auth.conf`` are mode 0600. ``--owner UID:GID`` hands each consumer's
directory and files to the user the consumers run as (it needs root).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuledger_cli import natsconfig
from gpuledger_common.natsauth import AuthConfigError
from gpuledger_common.pki import CertificateAuthority, Issued

ADMIN = "gpuledger-admin"
SERVERS = ("nats", "allocator", "placement")
CLIENTS = {"admin": ADMIN, "scheduler": "gpuledger-scheduler"}
FILES = ("ca.crt", *(f"{n}.{e}" for n in (*SERVERS, *CLIENTS) for e in ("crt", "key")))
NATS_PASSWORD = "nats-password"  # a NATS user's password, in its consumer directory


@dataclass(frozen=True, slots=True)
class Consumer:
    """A consumer of the stack's credentials and what it gets: file name -> source under ``--out``."""

    name: str
    files: Mapping[str, Path]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("local-credentials", help="write the credentials of a stack on one machine (docker compose)")
    p.add_argument("--out", required=True, help="directory for nats/ and tls/ (made if missing)")
    p.add_argument("--node", action="append", default=[], help="a node's name (repeatable)")
    p.add_argument("--nats-host", default="nats,localhost,127.0.0.1", help="names of the NATS server's certificate")
    p.add_argument(
        "--allocator-host", default="allocator,localhost,127.0.0.1", help="names of the gRPC server's certificate"
    )
    p.add_argument(
        "--placement-host", default="placement,localhost,127.0.0.1", help="names of the extender's certificate"
    )
    p.add_argument("--valid-days", type=int, default=365, help="how long the certificates are valid")
    p.add_argument("--consumers", default="", help="directory for one directory per consumer with only its own")
    p.add_argument("--owner", default="", help="UID:GID given the consumers' directories and files (needs root)")
    p.set_defaults(run=run)


async def run(args: argparse.Namespace) -> int:
    return write_all(args)


def write_all(args: argparse.Namespace) -> int:
    """Write what ``args`` asks; the exit code (2, with the reason on stderr, for bad input)."""
    out = Path(args.out)
    try:
        owner = _owner(args.owner, args.consumers)
        if args.consumers and Path(args.consumers).resolve() == out.resolve():
            raise ValueError(f"--consumers must be another directory than --out ({args.out})")
        users = natsconfig.write(out / "nats", args.node)
        hosts = {n: _hosts(getattr(args, f"{n}_host")) for n in SERVERS}
        made = write_tls(out / "tls", hosts, args.valid_days)
        given = consumers(out, users)
        if args.consumers:
            for consumer in given:
                give(Path(args.consumers), consumer, owner)
    except (AuthConfigError, OSError, ValueError) as err:
        print(f"gpuledger local-credentials: {err}", file=sys.stderr)
        return 2
    print(f"{out / 'nats'}: {len(users)} NATS users; {out / 'tls'}: {'new certificates' if made else 'kept'}")
    if args.consumers:
        print(f"{args.consumers}: a directory for each of {len(given)} consumers")
    return 0


def consumers(out: Path, users: Sequence[str]) -> list[Consumer]:
    """Each consumer of the credentials under ``out`` and the files it needs: NATS its certificate
    and the users; every NATS user its password (the allocator and placement also the certificate
    of the server they run); each client certificate's holder that certificate; all of them the CA."""
    tls = out / "tls"
    ca = {"ca.crt": tls / "ca.crt"}

    def pair(name: str) -> dict[str, Path]:
        return {f"{name}.crt": tls / f"{name}.crt", f"{name}.key": tls / f"{name}.key"}

    found = [Consumer("nats", {**ca, **pair("nats"), "auth.conf": out / "nats" / "auth.conf"})]
    for user in users:
        served = pair(user) if user in SERVERS else {}
        found.append(Consumer(user, {**ca, **served, NATS_PASSWORD: out / "nats" / "passwords" / user}))
    found += [Consumer(name, {**ca, **pair(name)}) for name in CLIENTS]
    return found


def give(root: Path, consumer: Consumer, owner: tuple[int, int] | None) -> None:
    """Write ``consumer``'s files into ``root/<name>`` (each replaced whole), private to ``owner``."""
    directory = root / consumer.name
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in consumer.files.items():
        work = directory / f".{name}.new"
        shutil.copyfile(source, work)
        work.chmod(0o644 if name.endswith(".crt") else 0o600)
        if owner is not None:
            os.chown(work, *owner)
        work.replace(directory / name)
    if owner is not None:
        os.chown(directory, *owner)
    directory.chmod(0o700)


def _owner(raw: str, consumers_dir: str) -> tuple[int, int] | None:
    if not raw:
        return None
    if not consumers_dir:
        raise ValueError("--owner is given to the consumers' directories: it needs --consumers")
    uid, sep, gid = raw.partition(":")
    if not (sep and uid.isdigit() and gid.isdigit()):
        raise ValueError(f"--owner must be UID:GID, two numbers, got {raw!r}")
    return int(uid), int(gid)


def write_tls(tls: Path, hosts: Mapping[str, Sequence[str]], valid_days: int) -> bool:
    """The CA and the certificates, unless every file is there already (then False)."""
    if all((tls / name).is_file() for name in FILES):
        return False
    if valid_days < 1:
        raise ValueError(f"--valid-days must be at least 1, got {valid_days}")
    work = tls.with_name(tls.name + ".new")
    shutil.rmtree(work, ignore_errors=True)
    ca = CertificateAuthority(work, "gpuledger-local-ca", datetime.timedelta(days=valid_days))
    ca.cert.rename(work / "ca.crt")
    for name in SERVERS:
        _keep(ca.issue(f"gpuledger-{name}", tuple(hosts[name])), work, name)
    for name, common in CLIENTS.items():
        _keep(ca.issue(common, client=True), work, name)
    shutil.rmtree(tls, ignore_errors=True)
    work.rename(tls)  # all of them or none: a half-written set is never left in place
    return True


def _keep(issued: Issued, directory: Path, name: str) -> None:
    issued.cert.rename(directory / f"{name}.crt")
    issued.key.rename(directory / f"{name}.key")


def _hosts(raw: str) -> list[str]:
    hosts = [h.strip() for h in raw.split(",") if h.strip()]
    if not hosts:
        raise ValueError("a certificate needs at least one host name")
    return hosts
