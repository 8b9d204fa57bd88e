"""The demo scenario of the local stack, checked as it runs.

It follows the two field reports the project grew from (apps sharing one RTX 3090 and two Tesla P4
by memory, in units of 256 MiB), plus a 4-card job on an 8xH100 NVSwitch node, a card that
turns unhealthy mid-run, and MIG instances on an A100 node (``scenario_mig``). Every pod goes the
whole way: the scheduler asks the extender (filter,
prioritize, bind: the ledger reserves), then the node's kubelet admits it and the plugin shim
answers Allocate with the cards and limits the ledger holds for that container. A deleted pod's
cards come back through the allocator's reconciliation with the (simulated) API server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuledger_common.allocator_client import allocator
from gpuledger_core.model import Node
from gpuledger_dev.fake_cluster import Outcome, gpu_pod
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.scenario_mig import run_classic_mig
from gpuledger_proto.gpuledger.allocator import v1 as pb

UNIT_MIB = 256
FAULT_WAIT_S = 60.0
RELEASE_WAIT_S = 20.0
Say = Callable[[str], None]


def units(n: int) -> dict[str, str]:
    return {"gpuledger.io/gpu": "1", "gpuledger.io/gpu-mem": str(n * UNIT_MIB)}


def whole(n: int) -> dict[str, str]:
    return {"gpuledger.io/gpu": str(n)}


@dataclass
class Checks:
    say: Say
    failed: list[str] = field(default_factory=list)

    def check(self, ok: bool, good: str, bad: str) -> bool:
        self.say(("ok   " if ok else "FAIL ") + (good if ok else bad))
        if not ok:
            self.failed.append(bad)
        return ok


def describe(o: Outcome) -> str:
    env = o.env.get("app", {})
    return (
        f"{o.pod} on {o.node}: CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '?')} "
        f"memory limit {env.get('GPULEDGER_MEMORY_LIMIT_MIB', '?')} MiB"
    )


async def run_scenario(stack: Stack, say: Say) -> bool:
    checks = Checks(say)
    await _rtx(stack, checks)
    await _p4(stack, checks)
    await _h100(stack, checks)
    await run_classic_mig(stack, checks)
    return not checks.failed


async def _rtx(stack: Stack, checks: Checks) -> None:
    card = _card(stack, "rtx-0", 0)
    placed = [
        await stack.cluster.run(gpu_pod(name, units(n)), ["rtx-0"])
        for name, n in (("app-a", 50), ("app-b", 40), ("app-c", 1))
    ]
    for o, n in zip(placed, (50, 40, 1), strict=True):
        env = o.env.get("app", {})
        ok = (
            not o.pending
            and env.get("CUDA_VISIBLE_DEVICES") == card
            and env.get("GPULEDGER_MEMORY_LIMIT_MIB") == str(n * UNIT_MIB)
        )
        checks.check(ok, describe(o), f"{o.pod}: {o.pending or o.env}")
    # The third app is raised to 10 units: it is deleted (its cards given back) and submitted again.
    await _delete_pod(stack, checks, "app-c")
    bigger = await stack.cluster.run(gpu_pod("app-c-10", units(10)), ["rtx-0"])
    checks.check(
        bool(bigger.pending) and "MiB" in bigger.pending,
        f"app-c raised to 10 units stays pending: {bigger.pending}",
        f"app-c with 10 units: {bigger}",
    )


async def _p4(stack: Stack, checks: Checks) -> None:
    got = [await stack.cluster.run(gpu_pod(f"p4-{n}u-{i}", units(n)), ["p4-0"]) for i, n in enumerate((4, 20, 20))]
    cards = [o.env.get("app", {}).get("CUDA_VISIBLE_DEVICES", "") for o in got]
    ok = all(not o.pending for o in got) and sorted(cards.count(c) for c in set(cards)) == [1, 2]
    for o in got:
        checks.say(f"     {describe(o)}")
    checks.check(ok, "p4-0: 4, 20 and 20 units land as two on one card and one on the other", f"p4-0: {got}")


async def _h100(stack: Stack, checks: Checks) -> None:
    node = fleet_node(stack, "h100-0")
    job = await stack.cluster.run(gpu_pod("train-4", whole(4)), ["h100-0"])
    chosen = card_indexes(node, job)
    connected = all(node.link(a, b).nvlinks > 0 for a in chosen for b in chosen if a < b)
    one_numa = len({node.cards[i].numa for i in chosen}) == 1
    checks.check(
        len(chosen) == 4 and connected,
        f"h100-0: the 4-card job got cards {chosen}, every pair on NVLink{', one NUMA node' if one_numa else ''}",
        f"h100-0: the 4-card job got {chosen} ({job.pending})",
    )
    await _unhealthy_card(stack, checks, node, chosen)


async def _unhealthy_card(stack: Stack, checks: Checks, node: Node, taken: list[int]) -> None:
    sick = await wait_unhealthy(stack, "h100-0")
    if not checks.check(sick is not None, f"h100-0: card {sick} turned unhealthy (XID)", "no card turned unhealthy"):
        return
    free = [c.index for c in node.cards if c.index not in taken and c.index != sick]
    too_many = await stack.cluster.run(gpu_pod("after-fault-big", whole(len(free) + 1)), ["h100-0"])
    checks.check(bool(too_many.pending), f"a {len(free) + 1}-card job now waits: {too_many.pending}", f"{too_many}")
    fits = await stack.cluster.run(gpu_pod("after-fault", whole(len(free))), ["h100-0"])
    got = card_indexes(node, fits)
    checks.check(got == sorted(free), f"a {len(free)}-card job gets {got}, never card {sick}", f"{fits}")


async def wait_unhealthy(stack: Stack, node: str) -> int | None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FAULT_WAIT_S
    while loop.time() < deadline:
        async with allocator(stack.grpc) as api:
            reply = await api.get_cluster(pb.GetClusterRequest(node=node))
        sick = [int(c.index) for c in reply.nodes[0].cards if c.health != "healthy"]
        if sick:
            return sick[0]
        await asyncio.sleep(0.5)
    return None


async def _delete_pod(stack: Stack, checks: Checks, name: str) -> None:
    """Delete the pod; the allocator's reconciliation with the API server releases its cards."""
    uid = await stack.cluster.pod_uid("demo", name)
    await stack.cluster.delete("demo", name)
    reason = await released_reason(stack, "pod", uid)
    checks.check(
        bool(reason), f"{name} deleted: the allocator released its cards ({reason})", f"{name} deleted, still held"
    )


async def released_reason(stack: Stack, owner_kind: str, owner_id: str) -> str:
    """Why the owner's allocation was released, once the ledger says so ('' if not within RELEASE_WAIT_S)."""
    mine = pb.ListAllocationsRequest(owner_kind=owner_kind, owner_id=owner_id, include_released=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RELEASE_WAIT_S
    while loop.time() < deadline:
        async with allocator(stack.grpc) as api:
            found = (await api.list_allocations(mine)).allocations
        reason = next((a.reason for a in found if a.state == "released"), "")
        if reason:
            return reason
        await asyncio.sleep(0.2)
    return ""


def card_indexes(node: Node, outcome: Outcome) -> list[int]:
    """The indexes of the cards the container was given (from CUDA_VISIBLE_DEVICES)."""
    index = {str(c.uuid): c.index for c in node.cards}
    given = outcome.env.get("app", {}).get("CUDA_VISIBLE_DEVICES", "").split(",")
    return sorted(index.get(u, -1) for u in given if u)


def fleet_node(stack: Stack, name: str) -> Node:
    return stack.fleet.node(name).node


def _card(stack: Stack, node: str, index: int) -> str:
    return next(c.uuid for c in fleet_node(stack, node).cards if c.index == index)
