"""The plugin shim on the 3-server cluster. kubelet admits pods on one node of the fleet through
the shim, one after another (GetPreferredAllocation, then Allocate, which commits the pod's
reservation), while the ledger stream's leader is SIGKILLed (with the shim connected to another
server, then to the leader's own) and while two servers are down (no quorum, for longer than one
ledger read waits); and the shim starts while a server of its list is down.

kubelet gives those calls no deadline, follows the hint it is given and fails a pod for good on
an error; the shim holds each call to its ``answer_timeout_s``. After each fault: an admission
was under way while writes were refused; every pod was admitted, steered to its own reservation
and given it, within that deadline (a refusal only past it, naming the cause, and only if the
outage lasted as long); the ledger holds every admitted container bound on the devices and cards
kubelet was told; no card is over capacity; and the shim's watch of the ledger is alive (a
card's health reaches kubelet). How long the stream refused writes, and how long admissions
took meanwhile, is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.store import LEDGER_BUCKET, LedgerStore, node_key
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, with_node
from gpuledger_core.model import Allocation, AllocState, Health, Owner, OwnerKind, Request
from gpuledger_core.packing.api import make_policy
from gpuledger_core.pods import PodAsk, reserve_pod
from gpuledger_dev.fake_kubelet import AdmissionError, Admitted, FakeContainer, FakeKubelet, FakePod
from gpuledger_plugin.app import running
from gpuledger_plugin.settings import PluginSettings
from tests.support.ledger_check import check
from tests.support.nats_cluster import NatsCluster, stream_leader
from tests.support.replicas import RunningAllocator, wait_for
from tests.support.waiting import polled

from ..placement.helpers import gpu_pod
from ..plugin.conftest import dirs, pod, settings_for
from .burst import Probe
from .conftest import NATS_RECONNECT_LEAK, STREAMS, all_current, first_server_down, read_ledger
from .test_faults import new_leader

pytestmark = [pytest.mark.timeout(120), NATS_RECONNECT_LEAK]
__all__ = ["dirs"]  # the plugin tests' fixture: a socket directory short enough for unix sockets
LEDGER = STREAMS[0]
NODE = "h100-0"  # of the ha fleet: 8 cards
CARDS = 8
SLOTS = 8  # kubelet devices per card, as the allocators count them
MEM_MIB, MEM_STEP_MIB = 4000, 256  # each pod its own limit: no two reservations interchangeable
LEASE_S = 300  # reservations wait for kubelet longer than the test runs
PODS, BEFORE = 16, 4  # pods admitted in all, and before the fault
PAUSE_S = 0.25  # between two admissions: kubelet admits one pod at a time, as they arrive
FAULT_S = 40.0  # the longest a fault may take to play out
# A watch whose consumer was lost with its server says so after 2.5 s without a heartbeat (one a
# second) and is made again a second later (``keywatch``): by the time writes are accepted again it
# is nearly always back (0.0-0.1 s in the runs here; nats-py's ordered consumer, 5 s heartbeats and
# two missed, made the health change below reach kubelet 4.9-11 s late). Once, on a loaded CI
# machine, the watch's tries to make its consumer kept timing out for longer than 3 s after writes
# were accepted again, and it came back later. The bound is what a watch that comes back by itself
# must meet, not how fast it usually does.
WATCH_S = 15.0
CLIENT = f"gpuledger-plugin-{NODE}"  # the shim's NATS client name
DEFAULTS = PluginSettings(node=NODE)
ANSWER_TIMEOUT_S = DEFAULTS.answer_timeout_s  # what the shim holds every kubelet call to
RETRY_S = DEFAULTS.ledger_retry_s  # how long one ledger read or write waits out an outage


@dataclass
class Admission:
    """One pod kubelet admitted (GetPreferredAllocation and Allocate per container), or refused."""

    pod: FakePod
    started: float
    ended: float = 0.0
    admitted: Admitted | None = None
    error: str = ""

    @property
    def elapsed(self) -> float:
        return self.ended - self.started


@dataclass
class Kubelet:
    """kubelet's admissions, one pod after another, each recorded with what it was told."""

    fake: FakeKubelet
    admissions: list[Admission] = field(default_factory=list)

    def admitted(self) -> int:
        return sum(1 for a in self.admissions if a.admitted is not None)

    def admitted_since(self, at: float) -> int:
        return sum(1 for a in self.admissions if a.admitted is not None and a.started >= at)

    @contextlib.asynccontextmanager
    async def admitting(self, pods: list[FakePod]) -> AsyncIterator[Kubelet]:
        task = asyncio.create_task(self._admit(pods))
        try:
            yield self
            await asyncio.wait_for(task, FAULT_S)  # the rest, as they come
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _admit(self, pods: list[FakePod]) -> None:
        for fake in reversed(pods):  # the pod admitted first is none of the first reserved
            admission = Admission(fake, time.monotonic())
            self.admissions.append(admission)
            try:
                admission.admitted = await self.fake.admit(fake)
            except AdmissionError as err:
                admission.error = str(err)
            admission.ended = time.monotonic()
            await asyncio.sleep(PAUSE_S)


@contextlib.asynccontextmanager
async def shim(nats_url: str, sockets: Path) -> AsyncIterator[FakeKubelet]:
    """The plugin shim for ``NODE`` on the cluster's server list, with its default answer timeout
    and ledger retry, registered with a fake kubelet that would give up a little after the shim's
    deadline."""
    kubelet = FakeKubelet(str(sockets / "dp"), str(sockets / "pr.sock"), rpc_timeout_s=ANSWER_TIMEOUT_S + 5)
    settings = settings_for(sockets, nats_url, node=NODE, slots_per_card=SLOTS, answer_timeout_s=ANSWER_TIMEOUT_S)
    async with kubelet, running(settings):
        await kubelet.wait_for(lambda k: len(k.healthy()) == CARDS * SLOTS, within=20)
        yield kubelet


async def reserve(store: LedgerStore, fake: FakePod, mem_mib: int) -> Allocation:
    """The pod's reservation on ``NODE`` as placement makes it at bind: its cards chosen on the
    ledger as it is, kubelet device IDs assigned, reserved, in one compare-and-set."""
    owner = Owner(OwnerKind.POD, fake.uid, fake.namespace, fake.name)
    asks = tuple(ContainerAsk(c.name, Request(c.gpus, mem_mib=mem_mib), c.init) for c in fake.containers if c.gpus)
    allocation_id = AllocationId(f"alloc-{fake.name}")

    def transition(ledger: NodeLedger | None) -> NodeLedger:
        assert ledger is not None
        return reserve_pod(
            ledger, PodAsk(owner, asks), make_policy("binpack"), allocation_id,
            now=time.time(), lease_s=LEASE_S, slots_per_card=SLOTS,
        )  # fmt: skip

    written = await store.mutate(NODE, transition)
    assert written.new is not None
    found = written.new.get(allocation_id)
    assert found is not None
    return found


async def reserved_pods(store: LedgerStore) -> tuple[list[FakePod], dict[str, Allocation]]:
    """``PODS`` one-card pods reserved on ``NODE``, each with its own memory limit."""
    pods = [pod(f"p{i:02d}", FakeContainer("main", gpus=1)) for i in range(PODS)]
    return pods, {p.name: await reserve(store, p, MEM_MIB + MEM_STEP_MIB * i) for i, p in enumerate(pods)}


async def server_of(cluster: NatsCluster, client: str) -> str:
    """The server the NATS client named ``client`` is connected to (its monitoring endpoint)."""
    async with aiohttp.ClientSession() as http:
        for member in cluster.running():
            async with http.get(f"http://127.0.0.1:{member.monitor_port}/connz") as reply:
                body = await reply.json()
            if any(c.get("name") == client for c in body.get("connections") or []):
                return member.name
    return ""


async def watched_on(nc: Client) -> str:
    """The server of the shim's watch of its node's key (an ephemeral consumer of one replica)."""
    subject = f"$KV.{LEDGER_BUCKET}.{node_key(NODE)}"
    consumers = await nc.jetstream(timeout=2.0).consumers_info(LEDGER)
    return next((c.cluster.leader or "" for c in consumers if c.config.filter_subject == subject and c.cluster), "")


async def lead(cluster: NatsCluster, nc: Client, name: str) -> None:
    """Have ``name`` lead the ledger stream (a clean hand-over), unless it does already; then
    every replica current."""
    if await stream_leader(nc, LEDGER) != name:
        stepdown = orjson.dumps({"placement": {"preferred": name}})
        await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{LEDGER}", stepdown, timeout=5)

        async def leads() -> bool:
            return await stream_leader(nc, LEDGER) == name

        await wait_for(leads, 20, f"{name} leading the ledger stream")
    await all_current(cluster, nc, 20)


@pytest.mark.parametrize("shims_server", [False, True], ids=["leader-elsewhere", "leader-is-the-shims-server"])
async def test_admissions_ride_out_the_ledger_leader_killed(
    cluster: NatsCluster,
    cluster_nc: Client,
    replicas: list[RunningAllocator],
    dirs: Path,
    caplog: pytest.LogCaptureFixture,
    shims_server: bool,
) -> None:
    """The leader is the shim's own server (the shim reconnects, and says where), or another one:
    the server of the shim's watch if that is not the shim's (the watch must come back by itself)."""
    caplog.set_level(logging.INFO, logger="gpuledger_common.bus")
    store = await LedgerStore.open(cluster_nc)
    pods, reserved = await reserved_pods(store)
    async with shim(cluster.url, dirs) as fake:
        reached = await wait_for(lambda: server_of(cluster, CLIENT), 10, "the shim's server")
        watch = await wait_for(lambda: watched_on(cluster_nc), 10, "the shim's watch")
        others = sorted((m.name != watch, m.name) for m in cluster.members if m.name != reached)
        leader = reached if shims_server else others[0][1]
        await lead(cluster, cluster_nc, leader)
        async with Probe(cluster_nc).running() as probe, Kubelet(fake).admitting(pods) as kubelet:
            await wait_for(polled(lambda: kubelet.admitted() >= BEFORE), FAULT_S, "pods admitted")
            killed = time.monotonic()
            await cluster.kill(leader)
            elected = await wait_for(lambda: new_leader(cluster_nc, leader), FAULT_S, "a new ledger leader")
            await wait_for(polled(lambda: probe.accepted_since(killed)), FAULT_S, "writes accepted again")
        servers = f"{leader} -> {elected}; the shim on {reached}, its watch on {watch}"
        judge("ledger leader killed", servers, probe, kubelet, reserved, killed)
        if shims_server:
            now_on = cluster.member(await wait_for(lambda: server_of(cluster, CLIENT), 10, "the shim reconnected"))
            assert f"nats reconnected to {now_on.url}" in caplog.text
        await watch_alive(store, fake)
    await consistent(cluster, kubelet)


async def test_admissions_wait_out_a_lost_quorum_longer_than_one_ledger_read(
    cluster: NatsCluster,
    cluster_nc: Client,
    replicas: list[RunningAllocator],
    dirs: Path,
) -> None:
    """Both servers but the shim's, which leads the ledger stream, killed: it leads on alone for
    a while (refusing every write to a key while an earlier one is in flight), then no server
    leads; one comes back after longer than one ledger read waits (``ledger_retry_s``). Meanwhile
    admissions go on from the shim's copy of its node's ledger (``allocate_wait_s``), each pod
    steered to its own reservation and admitted within the deadline; their binds are written once
    the quorum is back (``consistent``)."""
    store = await LedgerStore.open(cluster_nc)
    pods, reserved = await reserved_pods(store)
    async with shim(cluster.url, dirs) as fake:
        reached = await wait_for(lambda: server_of(cluster, CLIENT), 10, "the shim's server")
        down = [m.name for m in cluster.members if m.name != reached]
        await lead(cluster, cluster_nc, reached)
        async with Probe(cluster_nc).running() as probe, Kubelet(fake).admitting(pods) as kubelet:
            await wait_for(polled(lambda: kubelet.admitted() >= BEFORE), FAULT_S, "pods admitted")
            killed = time.monotonic()
            for name in down:
                await cluster.kill(name)
            await wait_for(polled(lambda: kubelet.admitted_since(killed) >= 2), FAULT_S, "admitted without a quorum")
            await asyncio.sleep(max(0.0, killed + RETRY_S + 1 - time.monotonic()))  # longer than one read
            await cluster.start(down[0])
            await wait_for(polled(lambda: probe.accepted_since(killed)), FAULT_S, "writes accepted again")
        servers = f"{' and '.join(down)}, {down[0]} back; the shim on {reached}"
        judge("two servers killed", servers, probe, kubelet, reserved, killed)
    await consistent(cluster, kubelet)


async def test_the_shim_starts_while_a_server_of_its_list_is_down(
    cluster: NatsCluster,
    cluster_nc: Client,
    replicas: list[RunningAllocator],
    dirs: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first server of its list is down: the shim connects to another, says which, and admits."""
    down = await first_server_down(cluster, cluster_nc)
    caplog.set_level(logging.INFO, logger="gpuledger_common.bus")
    caplog.clear()
    store = await LedgerStore.open(cluster_nc)
    one = pod("p", FakeContainer("main", gpus=1))
    reserved = await reserve(store, one, MEM_MIB)
    async with shim(cluster.url, dirs) as kubelet:
        reached = cluster.member(await wait_for(lambda: server_of(cluster, CLIENT), 10, "the shim's server"))
        assert reached.name != down.name
        assert f"nats connected to {reached.url} (of {cluster.url})" in caplog.text
        assert f"nats connected to {down.url}" not in caplog.text
        admitted = await kubelet.admit(one)
    assert admitted.visible("main") == [s.uuid for s in reserved.grants[0].cards]


# --- checks ---


def judge(
    fault: str, servers: str, probe: Probe, kubelet: Kubelet, reserved: dict[str, Allocation], killed: float
) -> None:
    """Report how the fault played out, and fail on any pod that was not told its own answer in time."""
    refused_s = probe.refused_for(killed)
    report(fault, servers, kubelet, killed, refused_s)
    problems = told(kubelet, reserved, killed, refused_s)
    assert not problems, "\n".join(problems)


def told(kubelet: Kubelet, reserved: dict[str, Allocation], at: float, refused_s: float) -> list[str]:
    """What is wrong with what kubelet was told, given a fault at ``at`` and writes refused for
    ``refused_s`` after it (empty: nothing)."""
    during = [a for a in kubelet.admissions if a.started < at + refused_s and a.ended > at]
    problems = [] if during else [f"no admission was under way in the {refused_s:.1f}s writes were refused"]
    for a in kubelet.admissions:
        if a.elapsed > ANSWER_TIMEOUT_S:
            problems.append(f"{a.pod.name}: answered after {a.elapsed:.1f}s, past the {ANSWER_TIMEOUT_S:g}s deadline")
        if a.admitted is None:
            if refused_s < ANSWER_TIMEOUT_S - 2.0 or a.elapsed < ANSWER_TIMEOUT_S - 2.0:
                why = f"refused after {a.elapsed:.1f}s, writes refused for {refused_s:.1f}s"
                problems.append(f"{a.pod.name}: {why}: {a.error}")
            elif "ledger" not in a.error or "NATS" not in a.error:
                problems.append(f"{a.pod.name}: refused without naming the cause: {a.error}")
            continue
        own, hint = reserved[a.pod.name], a.admitted.hints["main"]
        if sorted(hint) != sorted(own.grants[0].device_ids):
            problems.append(f"{a.pod.name}: steered to {hint}, not its reserved {list(own.grants[0].device_ids)}")
        if (given := a.admitted.env("main")["GPULEDGER_ALLOCATION_ID"]) != own.id:
            problems.append(f"{a.pod.name}: given {given}, not its own {own.id}")
    return problems


async def watch_alive(store: LedgerStore, kubelet: FakeKubelet) -> None:
    """A card turned unhealthy in the ledger reaches kubelet through the shim's watch, and back."""
    ledger, _ = await store.read(NODE)
    assert ledger is not None
    card = ledger.node.cards[-1]
    started = time.monotonic()
    await mark(store, card.index, Health.UNHEALTHY)
    await kubelet.wait_for(lambda k: k.devices.get(f"{card.uuid}::0") == "Unhealthy", within=WATCH_S)
    print(f"  a card's health reached kubelet {time.monotonic() - started:.1f}s after it changed")
    await mark(store, card.index, Health.HEALTHY)
    await kubelet.wait_for(lambda k: len(k.healthy()) == CARDS * SLOTS, within=WATCH_S)


async def mark(store: LedgerStore, index: int, health: Health) -> None:
    def change(ledger: NodeLedger | None) -> NodeLedger:
        assert ledger is not None
        cards = tuple(replace(c, health=health) if c.index == index else c for c in ledger.node.cards)
        return with_node(ledger, replace(ledger.node, cards=cards))

    await store.mutate(NODE, change)


async def consistent(cluster: NatsCluster, kubelet: Kubelet) -> None:
    """The ledger, read afresh through the stream's leader (the killed server stays down: its
    catching up is test_faults' business), against kubelet's admissions: each admitted container
    bound on the devices and cards it was given, every refused pod's reservation not bound, no
    card over capacity."""
    nc = await bus.connect(cluster.url, "ha-check")
    try:
        ledger = (await read_ledger(nc))[NODE]
    finally:
        await nc.close()
    pods = [running_pod(a.pod) for a in kubelet.admissions if a.admitted is not None]
    problems = list(check([ledger], pods, SLOTS, time.time()).findings)
    for a in kubelet.admissions:
        held = ledger.get(AllocationId(f"alloc-{a.pod.name}"))
        if held is None:
            problems.append(f"{a.pod.name}: its reservation is gone from the ledger")
        elif a.admitted is None:
            if held.state is AllocState.BOUND:
                problems.append(f"{a.pod.name}: refused by kubelet, yet bound in the ledger")
        elif held.state is not AllocState.BOUND:
            problems.append(f"{a.pod.name}: admitted, yet {held.state} in the ledger")
        elif sorted(ids := held.grants[0].device_ids) != sorted(a.admitted.devices["main"]):
            problems.append(f"{a.pod.name}: the ledger holds {ids}, kubelet gave {a.admitted.devices['main']}")
        elif [s.uuid for s in held.grants[0].cards] != a.admitted.visible("main"):
            problems.append(f"{a.pod.name}: the ledger holds other cards than its container was given")
    assert not problems, "\n".join(problems)


def running_pod(fake: FakePod) -> dict[str, Any]:
    """The pod as the API server holds it once kubelet has admitted it."""
    raw = gpu_pod(fake.name, gpu=1, uid=fake.uid)
    raw["spec"]["nodeName"] = NODE
    raw["status"] = {"phase": "Running"}
    return raw


def report(fault: str, servers: str, kubelet: Kubelet, at: float, refused_s: float) -> None:
    after = [a for a in kubelet.admissions if a.ended >= at]
    during = [a for a in after if a.started < at + refused_s]
    longest = max((a.elapsed for a in after), default=0.0)
    print(
        f"\nHA plugin, {fault} ({servers}): writes refused for {refused_s:.1f}s; "
        f"{sum(a.admitted is not None for a in after)} pods admitted after it ({len(during)} asked while writes "
        f"were refused), {sum(a.admitted is None for a in after)} refused; longest admission {longest:.1f}s "
        f"(GetPreferredAllocation and Allocate, each held to {ANSWER_TIMEOUT_S:g}s)"
    )
    for message in sorted({a.error for a in after if a.error})[:3]:
        print(f"  refused: {message}")
