"""``gpuledger nats-config``: what it writes is what a real nats-server runs on."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger_cli.natsconfig import main
from gpuledger_common import bus
from gpuledger_common.natsauth import tls_conf
from gpuledger_common.natscreds import NatsCredentials
from gpuledger_core.errors import Unavailable
from gpuledger_dev.natsserver import NatsServer, free_port
from gpuledger_dev.tlsca import ThrowawayCa


def test_passwords_are_kept_when_a_node_is_added(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--node", "gpu-1"]) == 0
    first = (tmp_path / "passwords" / "plugin-gpu-1").read_text()
    assert main(["--out", str(tmp_path), "--node", "gpu-1", "--node", "gpu-2"]) == 0
    assert (tmp_path / "passwords" / "plugin-gpu-1").read_text() == first
    assert (tmp_path / "passwords" / "plugin-gpu-2").exists()
    assert (tmp_path / "passwords" / "plugin-gpu-1").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("node", ["gpu-*", "gpu.>", "GPU 1", ""])
def test_a_node_name_that_would_widen_a_permission_is_refused(tmp_path: Path, node: str) -> None:
    assert main(["--out", str(tmp_path), "--node", node]) == 2
    assert not (tmp_path / "auth.conf").exists()


async def test_a_server_runs_on_the_written_config(tmp_path: Path) -> None:
    (tmp_path / "nodes.txt").write_text("# the fleet\ngpu-1\ngpu-2  # rack 4\n")
    assert main(["--out", str(tmp_path / "auth"), "--nodes-file", str(tmp_path / "nodes.txt")]) == 0
    ca = ThrowawayCa(tmp_path / "pki")
    served = ca.issue("nats-server")
    conf = tmp_path / "auth" / "nats.conf"
    conf.write_text(tls_conf(str(served.cert), str(served.key), str(ca.cert)) + "include ./auth.conf\n")
    store = tmp_path / "store"
    store.mkdir()
    server = NatsServer(free_port(), str(store), ("-c", str(conf)))
    await server.start()
    try:
        url = f"tls://127.0.0.1:{server.port}"
        password = str(tmp_path / "auth" / "passwords" / "plugin-gpu-2")
        nc = await bus.connect(url, "test", credentials=NatsCredentials("plugin-gpu-2", password, str(ca.cert)))
        await nc.close()
        wrong = NatsCredentials("plugin-gpu-1", password, str(ca.cert))  # gpu-2's password
        with pytest.raises(Unavailable, match="Authorization"):
            await bus.connect(url, "test", connect_timeout=2.0, credentials=wrong)
    finally:
        await server.stop()


def test_it_is_a_gpuledger_command(tmp_path: Path) -> None:
    from gpuledger_cli.__main__ import main as gpuledger

    assert gpuledger(["nats-config", "--out", str(tmp_path), "--node", "gpu-9"]) == 0
    assert "inventory-gpu-9" in (tmp_path / "auth.conf").read_text()
