"""What an atomic batch publish would save an Allocate, measured on the shipped nats-server.

An Allocate writes two keys: the reservation on the node's key and the owner's record. Today they
are two compare-and-set writes to two buckets, sent together (``asyncio.gather``). nats-server
2.12+ can take several messages to one stream as one atomic batch (ADR-50: headers
``Nats-Batch-Id``, ``Nats-Batch-Sequence``, ``Nats-Batch-Commit``; the stream needs
``allow_atomic``), which needs both keys in one stream. This measures, on one embedded server,
interleaved in rounds, for 1 and 16 concurrent writers:

- one compare-and-set (a ``kv.update``): the floor of a reservation;
- two compare-and-sets to two buckets, concurrently (what an Allocate does now);
- the same two as one atomic batch to one stream (each message with its expected last subject
  sequence), committed by the second; and that batch on a stream in memory storage, which the
  buckets may not use (it shows what the file store's commit costs);
- the raw nats-py echo (request/reply through the same server, answered by its own process);

and prints each median and its ratio to the echo's. It also checks the batch is atomic: a batch
whose first message's expected sequence is stale writes neither message.

    python -m benchmarks.batch_publish_bench [--seconds 4] [--rounds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import nats
import orjson
from nats.aio.client import Client
from nats.js.api import Header, KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from gpuledger_dev.natsserver import embedded_nats
from tests.support.echo import ECHO

VALUE = b'{"schema":1,"node":{"name":"n"},"allocations":[' + b'{"id":"a-0123456789abcdef"},' * 8 + b"{}]}"
Op = Callable[[int], Awaitable[None]]


async def server_version(nc: Client) -> str:
    return str(nc._server_info.get("version", "?"))


async def batch(nc: Client, writes: list[tuple[str, bytes, int]], timeout: float = 5.0) -> dict[str, object]:
    """Publish ``writes`` (subject, data, expected last subject sequence) as one atomic batch; the
    commit's answer (a pub ack naming the batch, or an error)."""
    batch_id = secrets.token_hex(8)
    *first, last = writes
    for seq, (subject, data, revision) in enumerate(first, start=1):
        headers = {
            Header.BATCH_ID.value: batch_id,
            Header.BATCH_SEQUENCE.value: str(seq),
            Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(revision),
        }
        await nc.publish(subject, data, headers=headers)
    subject, data, revision = last
    headers = {
        Header.BATCH_ID.value: batch_id,
        Header.BATCH_SEQUENCE.value: str(len(writes)),
        Header.BATCH_COMMIT.value: "1",
        Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(revision),
    }
    reply = await nc.request(subject, data, timeout=timeout, headers=headers)
    answer: dict[str, object] = orjson.loads(reply.data)
    return answer


async def make_bucket(
    js: JetStreamContext, name: str, atomic: bool, storage: StorageType = StorageType.FILE
) -> KeyValue:
    kv = await js.create_key_value(KeyValueConfig(bucket=name, history=5, storage=storage))
    if atomic:
        info = await js.stream_info(f"KV_{name}")
        info.config.allow_atomic = True
        info = await js.update_stream(info.config)
        if not info.config.allow_atomic:
            raise SystemExit(f"the server ({name}) does not keep allow_atomic: no atomic batch publish here")
    return kv


async def check_atomic(nc: Client, kv: KeyValue) -> str:
    """A batch whose first write is on a stale revision must write neither key."""
    r1 = await kv.put("node.x", VALUE)
    r2 = await kv.put("owner.x", b"{}")
    await kv.put("node.x", VALUE)  # node.x moves on: r1 is stale now
    answer = await batch(nc, [("$KV.atomic.node.x", VALUE, r1), ("$KV.atomic.owner.x", b'{"new":1}', r2)])
    owner = await kv.get("owner.x")
    if "error" not in answer or owner.revision != r2:
        raise SystemExit(f"the batch was not atomic: {answer}, owner record at {owner.revision} (was {r2})")
    return f"a batch with a stale first write: refused ({answer['error']}), the other key unchanged"


async def drive(clients: int, seconds: float, op: Op, samples: list[float]) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def client(c: int) -> None:
        while loop.time() < end:
            t0 = time.perf_counter()
            await op(c)
            samples.append(time.perf_counter() - t0)

    await asyncio.gather(*(client(c) for c in range(clients)))


async def measure(seconds: float, rounds: int) -> None:
    async with embedded_nats() as server:
        echo = await asyncio.create_subprocess_exec(sys.executable, "-c", ECHO, server.url, "bench.echo", "asyncio")
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream(timeout=5)
            ledger = await make_bucket(js, "ledger", atomic=False)
            owners = await make_bucket(js, "owners", atomic=False)
            atomic = await make_bucket(js, "atomic", atomic=True)
            memory = await make_bucket(js, "memory", atomic=True, storage=StorageType.MEMORY)
            for _ in range(100):
                try:
                    await nc.request("bench.echo", b"{}", timeout=1)
                    break
                except Exception:  # not subscribed yet
                    await asyncio.sleep(0.1)
            print(f"nats-server {await server_version(nc)}; {check_atomic.__doc__}")
            print(await check_atomic(nc, atomic))
            print()
            print("| clients | path | ops/s | p50 ms | p50 / echo p50 |")
            print("|---|---|---|---|---|")
            for clients in (1, 16):
                await rows(nc, ledger, owners, (atomic, memory), clients, seconds, rounds)
        finally:
            await nc.close()
            echo.terminate()
            await echo.wait()


async def rows(
    nc: Client,
    ledger: KeyValue,
    owners: KeyValue,
    atomic: tuple[KeyValue, KeyValue],
    clients: int,
    seconds: float,
    rounds: int,
) -> None:
    revs: dict[str, int] = {}
    for c in range(clients):
        for kv, key in ((ledger, f"node.{c}"), (owners, f"owner.{c}")):
            revs[f"{kv._name}.{key}"] = await kv.put(key, VALUE)
        for kv in atomic:
            for key in (f"node.{c}", f"owner.{c}"):
                revs[f"{kv._name}.{key}"] = await kv.put(key, VALUE)

    async def one(c: int) -> None:
        k = f"ledger.node.{c}"
        revs[k] = await ledger.update(f"node.{c}", VALUE, last=revs[k])

    async def two(c: int) -> None:
        k1, k2 = f"ledger.node.{c}", f"owners.owner.{c}"
        revs[k1], revs[k2] = await asyncio.gather(
            ledger.update(f"node.{c}", VALUE, last=revs[k1]), owners.update(f"owner.{c}", b"{}", last=revs[k2])
        )

    def batched(bucket: str) -> Op:
        async def op(c: int) -> None:
            k1, k2 = f"{bucket}.node.{c}", f"{bucket}.owner.{c}"
            node, owner = f"$KV.{bucket}.node.{c}", f"$KV.{bucket}.owner.{c}"
            answer = await batch(nc, [(node, VALUE, revs[k1]), (owner, b"{}", revs[k2])])
            seq = answer.get("seq")
            if "error" in answer or not isinstance(seq, int):
                raise SystemExit(f"batch refused: {answer}")
            revs[k1], revs[k2] = seq - 1, seq

        return op

    async def echo(c: int) -> None:
        await nc.request("bench.echo", b'{"x":1}', timeout=5)

    ops: dict[str, Op] = {
        "raw nats-py echo": echo,
        "one compare-and-set": one,
        "two compare-and-sets, two buckets, together": two,
        "one atomic batch of two, one stream": batched("atomic"),
        "the same batch, memory storage (not the buckets')": batched("memory"),
    }
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(rounds):
        for name, op in ops.items():
            await drive(clients, seconds / rounds, op, samples[name])
    floor = statistics.median(samples["raw nats-py echo"])
    for name, values in samples.items():
        p50 = statistics.median(values)
        print(f"| {clients} | {name} | {len(values) / seconds:.0f} | {p50 * 1000:.2f} | {p50 / floor:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(measure(args.seconds, args.rounds))
