"""Servers of a 3-server JetStream cluster SIGKILLed in the middle of a burst of allocations
from two allocator replicas: the ledger stream's leader, a follower, two servers one after the
other (no quorum), and a server whose store is wiped. After each: no committed allocation lost,
no card over capacity, every client answered (success or a clear error) within its deadline,
and the ledger is what the clients were told. How long the stream refused writes is printed.
"""

from __future__ import annotations

import re
import time

import orjson
import pytest
from grpclib.const import Status
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.store.outage import RETRY_S
from tests.support.nats_cluster import NatsCluster, stream_cluster, stream_leader
from tests.support.replicas import RunningAllocator, wait_for
from tests.support.waiting import polled

from .burst import DEADLINE_S, LEASE_S, Burst, Probe, verify
from .conftest import NATS_RECONNECT_LEAK, STREAMS, all_current, allocation_history, read_ledger

pytestmark = [pytest.mark.timeout(180), NATS_RECONNECT_LEAK]
LEDGER = STREAMS[0]
BEFORE = 20  # allocations granted before the fault
AFTER = 20  # and after the cluster takes writes again
FAULT_S = 40.0  # the longest a fault may take to play out
SETTLE_S = 60.0  # the longest a restarted server may take to be current again
EXPLAINED = 5  # allocations a failed check gives the history of


async def test_the_ledger_leader_is_killed_mid_burst(
    cluster: NatsCluster, cluster_nc: Client, replicas: list[RunningAllocator]
) -> None:
    leader = await stream_leader(cluster_nc, LEDGER)
    async with Probe(cluster_nc).running() as probe, Burst(replicas).running() as burst:
        await granted(burst, BEFORE, since=0.0)
        killed = time.monotonic()
        await cluster.kill(leader)
        elected = await wait_for(lambda: new_leader(cluster_nc, leader), FAULT_S, "a new ledger leader")
        await wait_for(polled(lambda: probe.accepted_since(killed)), FAULT_S, "writes accepted again")
        await granted(burst, AFTER, since=probe.accepted[-1])
    refused = probe.refused_for(killed)
    report("leader killed", refused, burst, killed, f"{leader} -> {elected}")
    ridden_out(burst, killed, refused)
    await cluster.start(leader)
    await consistent(burst, cluster)


async def test_the_ledger_leader_stopped_cleanly_hands_over_without_refusing(
    cluster: NatsCluster, cluster_nc: Client, replicas: list[RunningAllocator]
) -> None:
    leader = await stream_leader(cluster_nc, LEDGER)
    async with Probe(cluster_nc).running() as probe, Burst(replicas).running() as burst:
        await granted(burst, BEFORE, since=0.0)
        stopped = time.monotonic()
        await cluster.terminate(leader)  # as a rolling update stops it
        elected = await wait_for(lambda: new_leader(cluster_nc, leader), FAULT_S, "a new ledger leader")
        await granted(burst, AFTER, since=stopped)
    refused = probe.refused_for(stopped)
    report("leader stopped (SIGTERM)", refused, burst, stopped, f"{leader} -> {elected}")
    assert refused < 2.0, f"writes were refused for {refused:.1f}s although the leader handed over"
    assert not [a for a in burst.asked if a.ended >= stopped and a.status is Status.UNAVAILABLE]
    await cluster.start(leader)
    await consistent(burst, cluster)


async def test_a_follower_is_killed_mid_burst(
    cluster: NatsCluster, cluster_nc: Client, replicas: list[RunningAllocator]
) -> None:
    follower = await a_follower(cluster_nc, await cluster.wait_meta_leader())
    roles = await roles_of(cluster, cluster_nc, follower)
    async with Probe(cluster_nc).running() as probe, Burst(replicas).running() as burst:
        await granted(burst, BEFORE, since=0.0)
        killed = time.monotonic()
        await cluster.kill(follower)
        await granted(burst, AFTER, since=killed)
        await wait_for(polled(lambda: probe.accepted_since(killed)), FAULT_S, "writes accepted")
    refused = probe.refused_for(killed)
    report("follower killed", refused, burst, killed, roles)
    ridden_out(burst, killed, refused)
    assert await stream_leader(cluster_nc, LEDGER) != follower
    await cluster.start(follower)
    await consistent(burst, cluster)


async def test_two_servers_killed_one_after_the_other_stop_writes_until_a_quorum_returns(
    cluster: NatsCluster, cluster_nc: Client, replicas: list[RunningAllocator]
) -> None:
    first = await stream_leader(cluster_nc, LEDGER)
    async with Probe(cluster_nc).running() as probe, Burst(replicas).running() as burst:
        await granted(burst, BEFORE, since=0.0)
        killed = time.monotonic()
        await cluster.kill(first)
        second = await wait_for(lambda: new_leader(cluster_nc, first), FAULT_S, "a new ledger leader")
        await wait_for(polled(lambda: probe.accepted_since(killed)), FAULT_S, "writes accepted again")
        elected = probe.accepted[-1]
        await cluster.kill(second)
        lost = time.monotonic()
        # One server of three: no leader can be elected. Clients are told so within their deadline.
        await wait_for(polled(lambda: burst.refusals_since(lost) >= 4), FAULT_S, "clients told UNAVAILABLE")
        assert not probe.accepted_since(lost + 1.0), "the stream took a write without a quorum"
        refusals = [a for a in burst.since(lost) if a.status is not None]
        assert all("JetStream" in a.message or "NATS" in a.message for a in refusals), refusals[:3]
        back = time.monotonic()
        await cluster.start(first)
        await wait_for(polled(lambda: probe.accepted_since(back)), FAULT_S, "writes accepted with a quorum")
        resumed = probe.accepted[-1]
        await granted(burst, AFTER, since=resumed)
    report("first of two servers killed", elected - killed, burst, killed, first, until=lost)
    report("second of two servers killed", resumed - lost, burst, lost, f"{second}; {first} back")
    print(f"  writes resumed {resumed - back:.1f}s after a second server was back")
    await cluster.start(second)
    await consistent(burst, cluster)


async def test_a_server_whose_store_is_wiped_rejoins_and_catches_up(
    cluster: NatsCluster, cluster_nc: Client, replicas: list[RunningAllocator]
) -> None:
    victim = await a_follower(cluster_nc, await cluster.wait_meta_leader())
    async with Probe(cluster_nc).running() as probe, Burst(replicas).running() as burst:
        await granted(burst, BEFORE, since=0.0)
        killed = time.monotonic()
        await cluster.kill(victim)
        await cluster.wipe(victim)
        await cluster.start(victim)
        await all_current(cluster, cluster_nc, SETTLE_S)
        caught_up = time.monotonic()
        await granted(burst, AFTER, since=caught_up)
    report("store wiped", probe.refused_for(killed), burst, killed, victim)
    print(f"  {victim} was current again {caught_up - killed:.1f}s after it was killed")
    # What the wiped server holds is the ledger: read it through that server as the leader.
    stepdown = orjson.dumps({"placement": {"preferred": victim}})
    await cluster_nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{LEDGER}", stepdown, timeout=5)
    await wait_for(lambda: is_leader(cluster_nc, victim), SETTLE_S, f"{victim} leading the ledger stream")
    await consistent(burst, cluster)


# --- helpers ---


def ridden_out(burst: Burst, at: float, refused_s: float) -> None:
    """No client was refused for an election shorter than what the allocator waits out (its
    default ledger_retry_s, less a margin for a client that asked just before the fault)."""
    if refused_s < RETRY_S - 2.0:
        refusals = [a for a in burst.asked if a.ended >= at and a.status is Status.UNAVAILABLE]
        assert not refusals, f"writes were refused for {refused_s:.1f}s only, yet: {refusals[0].message}"


async def granted(burst: Burst, count: int, since: float) -> None:
    what = f"{count} allocations granted"
    await wait_for(polled(lambda: burst.successes_since(since) >= count), FAULT_S, what)


async def new_leader(nc: Client, old: str) -> str:
    leader = await stream_leader(nc, LEDGER)
    return leader if leader and leader != old else ""


async def is_leader(nc: Client, name: str) -> bool:
    return await stream_leader(nc, LEDGER) == name


async def a_follower(nc: Client, meta_leader: str) -> str:
    """A follower of the ledger stream: one that leads nothing (neither the owner stream nor the
    JetStream meta group) if there is one, else one that leads least."""
    ledger, owners = await stream_cluster(nc, LEDGER), await stream_cluster(nc, STREAMS[1])
    followers = [p.name for p in ledger.replicas or [] if p.name]
    return min(followers, key=lambda name: (name == owners.leader) + (name == meta_leader))


async def roles_of(cluster: NatsCluster, nc: Client, name: str) -> str:
    """``name``, and what it leads besides following the ledger stream."""
    leads = [what for what, leader in (("owner stream", await stream_leader(nc, STREAMS[1])),) if leader == name]
    leads += ["JetStream meta group"] if await cluster.wait_meta_leader() == name else []
    return f"{name}, leading {' and '.join(leads) or 'nothing'}"


async def consistent(burst: Burst, cluster: NatsCluster) -> None:
    """Every stream replica current, then the ledger checked against the clients' answers, and
    checked again once the reservations of errored Allocates have reached the end of their lease.
    The check is an observer of its own: a fresh connection to the cluster's server list."""
    nc = await bus.connect(cluster.url, "ha-check")
    try:
        await all_current(cluster, nc, SETTLE_S)
        problems = verify(burst, await read_ledger(nc), unreported_left=True)
        if problems:
            named = dict.fromkeys(re.findall(r"\ba-[0-9a-f]{16}\b", "\n".join(problems)))
            for allocation_id in list(named)[:EXPLAINED]:
                problems += await allocation_history(nc, allocation_id)
        assert not problems, "\n".join(problems)

        async def settled() -> bool:
            return not verify(burst, await read_ledger(nc), unreported_left=False)

        await wait_for(settled, LEASE_S + 10, "reservations no client was told of released")
    finally:
        await nc.close()


def report(fault: str, refused_s: float, burst: Burst, at: float, servers: str, until: float = float("inf")) -> None:
    """One line on a fault: how long writes were refused, and the calls that ended after it
    (in flight at the fault, or asked after), until ``until``."""
    after = [a for a in burst.asked if at <= a.ended < until]
    longest_ok = max((a.elapsed for a in after if a.ok), default=0.0)
    longest = max((a.elapsed for a in after), default=0.0)
    statuses = ", ".join(sorted({a.status.name for a in after if a.status}))
    print(
        f"\nHA {fault} ({servers}): writes refused for {refused_s:.1f}s; {sum(a.ok for a in after)} answered ok, "
        f"{sum(not a.ok for a in after)} refused ({statuses}); longest successful call {longest_ok:.1f}s, "
        f"longest call {longest:.1f}s (deadline {DEADLINE_S:g}s)"
    )
    for message in sorted({a.message for a in after if a.status is Status.UNAVAILABLE})[:3]:
        print(f"  refused: {message}")
