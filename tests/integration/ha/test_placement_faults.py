"""Pod binds through placement's extender while a 3-server JetStream cluster loses servers: the
ledger stream's leader SIGKILLed, a follower SIGKILLed, two servers killed one after the other (no
quorum until one is back), and a follower whose store is wiped rejoining. A scheduler's loop
(filter one pod at a time, bind each as it goes) against placement on the whole server list, with
the fake API server for the pods. After each: every bind answered within the extender's HTTP
timeout (bound, or a clear error the scheduler retries), every bound pod's annotated allocation
live in the ledger, no card over capacity, no pod holding two allocations, and the binds go
through again once the stream has a leader.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client

from gpuledger_dev.fake_apiserver import FakeApiServer
from tests.support.ledger_check import check
from tests.support.nats_cluster import NatsCluster, stream_leader
from tests.support.replicas import RunningAllocator, running_placement, wait_for

from ..placement.helpers import args, bind_args, gpu_pod, post
from .conftest import NATS_RECONNECT_LEAK, STREAMS, all_current, read_ledger
from .test_faults import a_follower, new_leader

pytestmark = [pytest.mark.timeout(180), NATS_RECONNECT_LEAK]
LEDGER = STREAMS[0]
NODES = ["h100-0", "h100-1"]
HTTP_TIMEOUT_S = 10.0  # httpTimeout in deploy/scheduler/scheduler-config.yaml
BEFORE, AFTER = 20, 20


@dataclass(frozen=True)
class Answer:
    pod: str
    error: str
    started: float
    seconds: float


class Scheduler:
    """kube-scheduler's part: filter one pod at a time, bind each in the background, retry a pod
    whose bind failed (as its back-off would)."""

    def __init__(self, http: aiohttp.ClientSession, url: str, apiserver: FakeApiServer) -> None:
        self.http, self.url, self.apiserver = http, url, apiserver
        self.answers: list[Answer] = []  # binds
        self.filter_errors: list[Answer] = []
        self.binds: set[asyncio.Task[None]] = set()

    def bound(self) -> set[str]:
        return {a.pod for a in self.answers if not a.error}

    async def schedule(self, name: str) -> None:
        pod = self.apiserver.pod("default", name)
        started = time.monotonic()
        _, body = await post(self.http, f"{self.url}/filter", args(pod, NODES))
        chosen = body["NodeNames"] or []
        if len(chosen) != 1:  # back to the queue, as kube-scheduler does with a filter error
            error = str(body.get("Error") or body)
            self.filter_errors.append(Answer(name, error, started, time.monotonic() - started))
            return
        task = asyncio.create_task(self._bind(name, chosen[0]))
        self.binds.add(task)
        task.add_done_callback(self.binds.discard)

    async def _bind(self, name: str, node: str) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(HTTP_TIMEOUT_S):
                _, body = await post(self.http, f"{self.url}/bind", bind_args(name, node))
            error = str(body["Error"])
        except TimeoutError:
            error = "no answer within the scheduler's httpTimeout"
        self.answers.append(Answer(name, error, started, time.monotonic() - started))

    async def settle(self) -> None:
        while self.binds:
            await asyncio.gather(*self.binds)


async def kill_leader(cluster: NatsCluster, nc: Client, scheduler: Scheduler, _: list[str]) -> list[str]:
    leader = await stream_leader(nc, LEDGER)
    await cluster.kill(leader)
    return [leader]


async def kill_follower(cluster: NatsCluster, nc: Client, scheduler: Scheduler, _: list[str]) -> list[str]:
    follower = await a_follower(nc, await cluster.wait_meta_leader())
    await cluster.kill(follower)
    return [follower]


async def kill_two(cluster: NatsCluster, nc: Client, scheduler: Scheduler, names: list[str]) -> list[str]:
    """The leader, then the next leader: one server of three left, no quorum. Binds meanwhile are
    refused with a clear error within the scheduler's timeout, and none is bound; one server back,
    the stream elects a leader again (the other stays down until the end)."""
    first = await stream_leader(nc, LEDGER)
    await cluster.kill(first)
    second = await wait_for(lambda: new_leader(nc, first), 40.0, "a new ledger leader")
    await cluster.kill(second)
    for name in names[:3]:
        await scheduler.schedule(name)
    await scheduler.settle()
    blind = [a for a in (*scheduler.answers, *scheduler.filter_errors) if a.pod in names[:3]]
    assert len(blind) >= 3 and all(a.error for a in blind), blind  # filter or bind refused: no quorum
    assert not scheduler.bound() & set(names[:3])
    await cluster.start(first)
    return [second]


async def wipe_follower(cluster: NatsCluster, nc: Client, scheduler: Scheduler, _: list[str]) -> list[str]:
    victim = await a_follower(nc, await cluster.wait_meta_leader())
    await cluster.kill(victim)
    await cluster.wipe(victim)
    await cluster.start(victim)
    return []


FAULTS = {
    "leader-sigkill": kill_leader,
    "follower-sigkill": kill_follower,
    "two-servers": kill_two,
    "wiped-follower": wipe_follower,
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_binds_through_placement_ride_out_a_server_loss(
    cluster: NatsCluster, cluster_nc: Client, replicas: list[RunningAllocator], tmp_path: Path, fault: str
) -> None:
    apiserver = await FakeApiServer().start()
    kubeconfig = str(apiserver.kubeconfig(tmp_path / "kubeconfig"))
    names = [f"p{i:03d}" for i in range(BEFORE + AFTER)]
    for name in names:
        apiserver.add_pod(gpu_pod(name, gpu=1, mem=1000))
    try:
        placement = running_placement(cluster.url, kube="kubeconfig", kubeconfig=kubeconfig)
        async with placement as running, aiohttp.ClientSession() as http:
            scheduler = Scheduler(http, running.url, apiserver)
            for name in names[:BEFORE]:
                await scheduler.schedule(name)
            await scheduler.settle()
            assert scheduler.bound() == set(names[:BEFORE]), [a for a in scheduler.answers if a.error]

            killed = time.monotonic()
            down = await FAULTS[fault](cluster, cluster_nc, scheduler, names[BEFORE:])
            pending = list(names[BEFORE:])
            deadline = time.monotonic() + 60.0
            while pending and time.monotonic() < deadline:  # the scheduler retries what failed
                for name in pending:
                    await scheduler.schedule(name)
                    await asyncio.sleep(0.05)
                await scheduler.settle()
                pending = [n for n in pending if n not in scheduler.bound()]
                if pending:
                    await asyncio.sleep(0.5)
            assert not pending, f"still unbound a minute after {fault}: {pending}"

            late = [a for a in scheduler.answers if a.seconds > HTTP_TIMEOUT_S - 0.5]
            assert not late, late
            refused = [a for a in scheduler.answers if a.error]
            for answer in refused:  # says what is wrong and to retry
                assert any(w in answer.error for w in ("electing a leader", "quorum", "JetStream outage")), answer
            for answer in scheduler.filter_errors:  # while placement's own connection moves to a live server
                assert "NATS" in answer.error and answer.seconds < 1.0, answer
            window = max((a.started + a.seconds for a in refused), default=killed) - killed
            print(
                f"\n{fault}: {len(refused)} bind(s) refused with a clear error over {window:.1f} s, "
                f"{len(scheduler.filter_errors)} filter(s) refused, all retried and bound; "
                f"slowest answer {max(a.seconds for a in scheduler.answers):.1f} s"
            )
            for server in down:
                await cluster.start(server)
            await all_current(cluster, cluster_nc, 60.0)

            ledgers = await read_ledger(cluster_nc)
            report = check(ledgers.values(), apiserver.pods.values(), 8, time.time())
            assert report.ok, str(report)
            for name in names:
                pod = apiserver.pod("default", name)
                assert pod["spec"].get("nodeName") in NODES, name
                held = [a for a in ledgers[pod["spec"]["nodeName"]].live() if a.owner.id == pod["metadata"]["uid"]]
                annotated = pod["metadata"]["annotations"]["gpuledger.io/allocation"]
                assert len(held) == 1 and held[0].id in annotated, (name, held)
    finally:
        await apiserver.close()
