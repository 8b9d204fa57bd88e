"""What the high-availability tests run while they break the cluster, and what they check after.

- ``Burst``: clients allocating (and releasing some) over gRPC through several allocator
  replicas, each request recorded with what its client was told and how long it took.
- ``Probe``: a raw writer on the ledger's stream (a key no service reads), to measure how long
  JetStream refused writes.
- ``verify``: the ledger, read from the bucket, against what the clients were told.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from grpclib import GRPCError
from grpclib.const import Status
from nats.aio.client import Client

from gpuledger_common.allocator_client import DEFAULT_TIMEOUT_S
from gpuledger_common.store import LEDGER_BUCKET
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import AllocState
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.ledger_check import check
from tests.support.replicas import RunningAllocator
from tests.support.waiting import cancelled

DEADLINE_S = DEFAULT_TIMEOUT_S  # each client's gRPC deadline, as the CLI's
LEASE_S = 16  # longer than an Allocate's outage window: a reservation waiting for its commit lives on
SLOTS_PER_CARD = 8
MAX_HELD = 3  # per client: 8 clients hold at most 32 of the fleet's 64 shares, so no refusal is for want of room
CLEAR = {Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED, Status.ABORTED, Status.NOT_FOUND}
# Answers after which an Allocate may still be written (a write sent before the stream lost its
# leader can be applied once a quorum is back): the client asks again for the same owner.
UNSETTLED = {Status.UNAVAILABLE, Status.ABORTED}
SETTLE_TRIES = 2  # after the burst, each client's last open owner is asked again this often


@dataclass
class Asked:
    """One request and what its client was told."""

    verb: str  # allocate or release
    target: str  # the owner an allocate asks for, the allocation a release names
    started: float
    ended: float = 0.0
    allocation: pb.Allocation | None = None  # a success's answer
    status: Status | None = None  # an error's status
    message: str = ""
    failure: str = ""  # no answer at all: what the client saw instead

    @property
    def ok(self) -> bool:
        return self.allocation is not None

    @property
    def elapsed(self) -> float:
        return self.ended - self.started


@dataclass
class Burst:
    """Clients allocating one shared card each through the replicas, releasing some of what they
    hold, until ``stop`` is set."""

    replicas: list[RunningAllocator]
    clients: int = 8
    asked: list[Asked] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def since(self, at: float) -> list[Asked]:
        return [a for a in self.asked if a.started >= at and a.ended]

    def successes_since(self, at: float) -> int:
        return sum(1 for a in self.since(at) if a.ok and a.verb == "allocate")

    def refusals_since(self, at: float) -> int:
        return sum(1 for a in self.since(at) if a.status is Status.UNAVAILABLE)

    def unavailable(self) -> list[Asked]:
        return [a for a in self.asked if a.status is Status.UNAVAILABLE]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Burst]:
        tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]
        try:
            yield self
        except BaseException:
            # The test failed: its error is the news. Settling the clients could take up to
            # a minute more and end in the test's timeout instead.
            self.stop.set()
            for task in tasks:
                with contextlib.suppress(Exception):
                    await cancelled(task, "a burst client")
            raise
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S * (2 + SETTLE_TRIES))

    async def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        stubs = [r.stub() for r in self.replicas]
        for stub in stubs:
            stub.timeout = DEADLINE_S
        held: list[str] = []
        i = 0
        unsettled = ""  # an owner whose Allocate ended with an error that leaves its outcome open
        while not self.stop.is_set():
            i += 1
            stub = stubs[(seed + i) % len(stubs)]
            owner = unsettled or f"c{seed}-{i}"
            asked = await self._allocate(stub, owner)
            unsettled = owner if asked.status in UNSETTLED else ""
            allocation = asked.allocation
            if allocation is not None:
                held.append(allocation.id)
            if held and (len(held) > MAX_HELD or rng.random() < 0.3):
                allocation_id = held.pop(rng.randrange(len(held)))
                if not await self._release(stubs[(seed + i + 1) % len(stubs)], allocation_id):
                    held.append(allocation_id)  # not known to be gone: released again later
        # As the API asks of a caller told UNAVAILABLE: the same owner again, until it hears how it ended.
        for attempt in range(SETTLE_TRIES):
            if not unsettled:
                break
            asked = await self._allocate(stubs[(seed + attempt) % len(stubs)], unsettled)
            unsettled = unsettled if asked.status in UNSETTLED else ""

    async def _allocate(self, stub: pb.AllocatorStub, owner: str) -> Asked:
        request = pb.AllocateRequest(
            owner=pb.Owner(kind="tool", id=owner),
            containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1, gpu_mem_mib=20000))],
            commit=True,
            lease_seconds=LEASE_S,
        )
        asked = self._ask("allocate", owner)
        await self._answer(asked, lambda: stub.allocate(request))
        return asked

    async def _release(self, stub: pb.AllocatorStub, allocation_id: str) -> bool:
        """Whether the allocation is gone (released now, or not found)."""
        asked = self._ask("release", allocation_id)
        await self._answer(asked, lambda: stub.release(pb.ReleaseRequest(allocation_id=allocation_id)))
        return asked.ok or asked.status is Status.NOT_FOUND

    def _ask(self, verb: str, owner: str) -> Asked:
        asked = Asked(verb, owner, time.monotonic())
        self.asked.append(asked)
        return asked

    async def _answer(self, asked: Asked, call: Callable[[], object]) -> None:
        try:
            reply = await call()  # type: ignore[misc]
            asked.allocation = reply.allocation if isinstance(reply, pb.AllocateResponse) else reply
        except GRPCError as err:
            asked.status, asked.message = err.status, err.message or ""
            if err.status not in CLEAR:
                asked.failure = f"{err.status.name}: {err.message}"
        except Exception as err:  # a timeout, a broken stream: no answer
            asked.failure = f"{type(err).__name__}: {err}"
        asked.ended = time.monotonic()
        if asked.status is not None and not asked.failure:
            await asyncio.sleep(0.05)  # a refused client waits a moment before asking again


@dataclass
class Probe:
    """A write to the ledger's stream every ``every_s`` (key ``probe.writes``, which no service
    reads), each bounded by ``timeout_s``; the longest time between two accepted writes tells
    how long the stream refused writes."""

    nc: Client
    every_s: float = 0.05
    timeout_s: float = 0.5
    accepted: list[float] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Probe]:
        kv = await self.nc.jetstream(timeout=self.timeout_s).key_value(LEDGER_BUCKET)
        stop = asyncio.Event()
        task = asyncio.create_task(self._write(kv.put, stop))
        try:
            yield self
        finally:
            stop.set()  # a write in flight ends the loop too, should its cancel be lost
            await cancelled(task, "the probe's writer")

    async def _write(self, put: Callable[[str, bytes], Awaitable[object]], stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.timeout_s):
                    await put("probe.writes", str(i).encode())
                self.accepted.append(time.monotonic())
            await asyncio.sleep(self.every_s)

    def accepted_since(self, at: float) -> bool:
        return bool(self.accepted) and self.accepted[-1] > at

    def refused_for(self, after: float) -> float:
        """The longest time without an accepted write, among the gaps that end after ``after``."""
        gaps = [b - a for a, b in zip(self.accepted, self.accepted[1:], strict=False) if b > after]
        return max(gaps, default=0.0)


def verify(burst: Burst, ledgers: dict[str, NodeLedger], unreported_left: bool) -> list[str]:
    """What is wrong with the ledger given what the clients were told (empty: nothing). With
    ``unreported_left``, reservations of errored Allocates may still be live (their lease has
    not ended); without, none may."""
    problems = [f"{a.verb} {a.target}: no clear answer ({a.failure})" for a in burst.asked if a.failure]
    problems += [
        f"{a.verb} {a.target}: answered after {a.elapsed:.1f}s, past its {DEADLINE_S:g}s deadline"
        for a in burst.asked
        if a.elapsed > DEADLINE_S
    ]
    problems += check(ledgers.values(), [], SLOTS_PER_CARD, time.time()).findings
    live = {str(a.id): a for ledger in ledgers.values() for a in ledger.live()}
    every = {str(a.id): a for ledger in ledgers.values() for a in ledger.allocations}
    told = {a.allocation.id: a.allocation for a in burst.asked if a.verb == "allocate" and a.allocation is not None}
    released = {a.target for a in burst.asked if a.verb == "release" and a.ok}
    unsure = {a.target for a in burst.asked if a.verb == "release" and not a.ok}
    errored = {a.target for a in burst.asked if a.verb == "allocate" and not a.ok}
    for allocation_id, answer in told.items():
        found = every.get(allocation_id)
        if allocation_id in released:
            if found is not None and found.live:
                problems.append(f"{allocation_id}: released (the client was told) but live in the ledger")
        elif allocation_id in unsure:
            continue  # a release whose answer was an error: held or released, either is right
        elif found is None or found.state is not AllocState.BOUND:
            problems.append(f"{allocation_id} of {answer.owner.id}: committed (the client was told) but lost")
        elif [c.uuid for c in found.shares()] != [c.uuid for g in answer.grants for c in g.cards]:
            problems.append(f"{allocation_id}: the ledger holds other cards than the client was told")
    owners: dict[str, str] = {}
    for allocation_id, allocation in live.items():
        if allocation.owner.key in owners:
            problems.append(f"{allocation.owner.describe()} holds {owners[allocation.owner.key]} and {allocation_id}")
        owners[allocation.owner.key] = allocation_id
        if allocation_id in told:
            continue
        pending = allocation.state is AllocState.RESERVED and allocation.owner.id in errored
        if not (pending and unreported_left):
            what = f"{allocation_id} of {allocation.owner.describe()} ({allocation.state})"
            problems.append(f"{what}: no client was told")
    return problems
