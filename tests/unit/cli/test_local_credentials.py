"""``gpuledger local-credentials --consumers``: a directory per consumer with only its own credentials,
copied from the kept originals, private to the consumer; bad flags named."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuledger_cli.__main__ import main

pytestmark = pytest.mark.timeout(60)
NODES = ("rtx-0", "p4-0")
CA_AND_PASSWORD = {"ca.crt", "nats-password"}
EXPECTED = {
    "nats": {"ca.crt", "nats.crt", "nats.key", "auth.conf"},
    "allocator": {*CA_AND_PASSWORD, "allocator.crt", "allocator.key"},
    "placement": {*CA_AND_PASSWORD, "placement.crt", "placement.key"},
    "reader": CA_AND_PASSWORD,
    "operator": CA_AND_PASSWORD,
    **{f"{role}-{node}": CA_AND_PASSWORD for node in NODES for role in ("inventory", "plugin")},
    "admin": {"ca.crt", "admin.crt", "admin.key"},
    "scheduler": {"ca.crt", "scheduler.crt", "scheduler.key"},
}


def write(tmp_path: Path, *extra: str) -> int:
    nodes = [arg for node in NODES for arg in ("--node", node)]
    argv = ["local-credentials", "--out", str(tmp_path / "all"), *nodes, *extra]
    return main([*argv, "--consumers", str(tmp_path / "each")])


def test_each_consumer_gets_only_its_own_files(tmp_path: Path) -> None:
    assert write(tmp_path) == 0
    each = tmp_path / "each"
    assert {d.name: {f.name for f in d.iterdir()} for d in each.iterdir()} == EXPECTED
    passwords = tmp_path / "all" / "nats" / "passwords"
    for user in ("allocator", "inventory-rtx-0", "plugin-p4-0"):
        assert (each / user / "nats-password").read_text() == (passwords / user).read_text()
    assert (each / "admin" / "admin.key").read_bytes() == (tmp_path / "all" / "tls" / "admin.key").read_bytes()
    # no consumer but NATS holds another's password (auth.conf names them all: it is the server's)
    secrets = {(passwords / user).read_text().strip() for user in EXPECTED if (passwords / user).exists()}
    for name in EXPECTED:
        if name == "nats":
            continue
        held = " ".join(f.read_text(errors="replace") for f in (each / name).iterdir())
        assert sum(secret in held for secret in secrets) == (1 if "nats-password" in EXPECTED[name] else 0), name


def test_keys_and_passwords_are_private_and_a_second_run_keeps_every_file(tmp_path: Path) -> None:
    assert write(tmp_path) == 0
    each = tmp_path / "each"
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (each / "allocator").iterdir()}
    assert modes == {"ca.crt": 0o644, "allocator.crt": 0o644, "allocator.key": 0o600, "nats-password": 0o600}
    assert stat.S_IMODE((each / "allocator").stat().st_mode) == 0o700
    before = {f: f.read_bytes() for f in each.rglob("*") if f.is_file()}
    assert write(tmp_path) == 0
    assert {f: f.read_bytes() for f in each.rglob("*") if f.is_file()} == before


def test_owner_hands_each_directory_and_file_to_that_user(tmp_path: Path) -> None:
    me = f"{os.getuid()}:{os.getgid()}"  # chown to oneself needs no root
    assert write(tmp_path, "--owner", me) == 0
    owned = {(f.stat().st_uid, f.stat().st_gid) for f in (tmp_path / "each").rglob("*")}
    assert owned == {(os.getuid(), os.getgid())}


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--owner", "gpuledger"], "--owner must be UID:GID, two numbers, got 'gpuledger'"),
        (["--owner", "10001:"], "--owner must be UID:GID, two numbers, got '10001:'"),
    ],
)
def test_a_bad_owner_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], said: str
) -> None:
    assert write(tmp_path, *extra) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "all").exists()  # nothing written


def test_consumers_in_the_directory_of_the_originals_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["local-credentials", "--out", str(tmp_path), "--consumers", str(tmp_path), "--node", "rtx-0"]
    assert main(argv) == 2
    assert "--consumers must be another directory than --out" in capsys.readouterr().err
    owner_alone = ["local-credentials", "--out", str(tmp_path / "x"), "--owner", "1:1"]
    assert main(owner_alone) == 2
    assert "--owner is given to the consumers' directories: it needs --consumers" in capsys.readouterr().err
