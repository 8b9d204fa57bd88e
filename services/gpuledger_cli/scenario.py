"""The demo scenario of the local stack, checked as it runs.

It follows the field reports the project grew from: three apps sharing one RTX 3090 by memory
(50, 40 and 1 units of 256 MiB), a fourth that no longer fits and says why, three apps on two
Tesla P4 (4, 20 and 20 units), and a 4-card job on the H100 node.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuledger_core.errors import Exhausted, GpuledgerError
from gpuledger_proto.gpuledger.allocator import v1 as pb
from gpuledger_cli.client import allocator

UNIT_MIB = 256


async def _alloc(server: str, owner: str, node: str, request: pb.ResourceRequest) -> pb.Allocation:
    async with allocator(server) as api:
        reply = await api.allocate(
            pb.AllocateRequest(
                owner=pb.Owner(kind="tool", id=owner, name=owner),
                containers=[pb.ContainerRequest(request=request)],
                commit=True, node=node,
            )
        )
    return reply.allocation


def _units(n: int) -> pb.ResourceRequest:
    return pb.ResourceRequest(gpu=1, gpu_mem_mib=n * UNIT_MIB)


async def run_scenario(server: str, say: Callable[[str], None]) -> bool:
    ok = True

    def check(condition: bool, good: str, bad: str) -> None:
        nonlocal ok
        say(("ok   " if condition else "FAIL ") + (good if condition else bad))
        ok = ok and condition

    for name, units in (("app-a", 50), ("app-b", 40), ("app-c", 1)):
        a = await _alloc(server, f"rtx-{name}", "rtx-0", _units(units))
        check(a.state == "bound", f"rtx-0: {name} holds {units * UNIT_MIB} MiB on card 0", f"{name} is {a.state}")
    try:
        await _alloc(server, "rtx-app-d", "rtx-0", _units(10))
        check(False, "", "rtx-0: app-d with 10 units was placed although the card is full")
    except Exhausted as err:
        check("MiB" in str(err), f"rtx-0: app-d (10 units) stays pending: {err}", f"unclear reason: {err}")

    placed = []
    for name, units in (("app-a", 4), ("app-b", 20), ("app-c", 20)):
        a = await _alloc(server, f"p4-{name}", "p4-0", _units(units))
        placed.append(a.grants[0].cards[0].index)
    two_and_one = sorted(placed.count(i) for i in set(placed)) == [1, 2]
    check(two_and_one, f"p4-0: apps of 4, 20, 20 units on cards {placed} (two on one card, one on the other)",
          f"p4-0: apps landed on cards {placed}")

    try:
        a = await _alloc(server, "train-4", "h100-0", pb.ResourceRequest(gpu=4))
        cards = sorted(s.index for s in a.grants[0].cards)
        check(len(cards) == 4, f"h100-0: a 4-card job holds cards {cards} exclusively", f"got cards {cards}")
    except GpuledgerError as err:
        check(False, "", f"h100-0: the 4-card job failed: {err}")
    return ok
