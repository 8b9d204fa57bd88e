"""The share audit's cost per card and poll (docs/audit.md, "Cost").

    python -m benchmarks.audit_cost [--cards 8] [--processes 8] [--runs 200] [--proc-root DIR]

On the node: each poll reads every GPU process's ``/proc/<pid>/cgroup`` (``attribution.attribute``
over ``cgroups.ProcCgroups``). A proc tree of ``cards`` x ``processes`` processes is written in a
temporary folder, each with a systemd-driver cgroup v2 line as kubelet writes it (half of them in
one pod per card, half in others), so the files read are the ones production reads, on a tmpfs or
disk like /proc is not: the figure is an upper bound of the read, not of the kernel's /proc. With
``--proc-root`` the real /proc is read instead, for the PIDs it holds (the benchmark's own).

In the allocator (and placement's auditor): ``node_status`` over a node of ``cards`` cards, each
shared by ``processes`` pods, against the same usage with and without attribution.

Prints the median over ``runs`` of each, per card and per node poll.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from gpuledger_core.card_usage import ProcessUse, Usage
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, AllocState, Card, CardShare, Grant, Node, Owner, OwnerKind
from gpuledger_core.status import node_status
from gpuledger_inventory.attribution import attribute
from gpuledger_inventory.cgroups import ProcCgroups
from gpuledger_inventory.inventory import CardUsage, GpuProcess
from gpuledger_inventory.inventory import Usage as NodeUsage


def cgroup_line(pod_uid: str) -> str:
    underscored = pod_uid.replace("-", "_")
    container = uuid.uuid4().hex + uuid.uuid4().hex
    return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice/"
            f"cri-containerd-{container}.scope\n")  # fmt: skip


def proc_tree(root: Path, cards: int, processes: int) -> tuple[NodeUsage, list[list[str]]]:
    """The tree, the node's usage as NVML gives it, and each card's pods."""
    usage, pods, pid = [], [], 1000
    for c in range(cards):
        uids = [str(uuid.uuid4()) for _ in range(processes)]
        found = []
        for p in range(processes):
            pid += 1
            (root / str(pid)).mkdir()
            (root / str(pid) / "cgroup").write_text(cgroup_line(uids[0] if p % 2 else uids[p]))
            found.append(GpuProcess(pid, 512))
        usage.append(CardUsage(CardUuid(f"GPU-{c}"), 512 * processes, tuple(found)))
        pods.append(uids)
    return NodeUsage(tuple(usage)), pods


def timed(runs: int, call: object) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        call()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def ledger_of(cards: int, pods: list[list[str]]) -> NodeLedger:
    node = Node(NodeName("n1"), tuple(Card(CardUuid(f"GPU-{c}"), c, "H100", 81559) for c in range(cards)))
    allocations = tuple(
        Allocation(AllocationId(f"a-{uid}"), Owner(OwnerKind.POD, uid, "ns", f"p-{uid}"), node.name,
                   (Grant("main", (CardShare(CardUuid(f"GPU-{c}"), c, 1024, 100),)),), AllocState.BOUND)
        for c, uids in enumerate(pods) for uid in dict.fromkeys(uids)
    )  # fmt: skip
    return NodeLedger(node, allocations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--processes", type=int, default=8, help="processes per card")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--proc-root", default="", help="read this /proc instead of a written tree")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        usage, pods = proc_tree(Path(tmp), args.cards, args.processes)
        if args.proc_root:  # the real /proc, for the PIDs it has: this process, as many times
            me = os.getpid()
            usage = NodeUsage(tuple(
                CardUsage(c.uuid, c.memory_used_mib, tuple(GpuProcess(me, p.used_mib) for p in c.processes))
                for c in usage.cards
            ))  # fmt: skip
        reader = ProcCgroups(Path(args.proc_root or tmp))
        read = timed(args.runs, lambda: attribute(usage, reader.of))
        attributed = attribute(usage, ProcCgroups(Path(tmp)).of)
    seen: dict[str, Usage] = {
        c.uuid: Usage(len(c.processes), c.memory_used_mib or 0, tuple(ProcessUse(p.used_mib or 0, p.pod_uid)
                                                                       for p in c.processes))
        for c in attributed.cards
    }  # fmt: skip
    plain: dict[str, Usage] = {uuid: Usage(u.processes, u.used_mib) for uuid, u in seen.items()}
    ledger = ledger_of(args.cards, pods)
    audited = timed(args.runs, lambda: node_status(ledger, usage=seen))
    heuristic = timed(args.runs, lambda: node_status(ledger, usage=plain))
    n = args.cards
    print(f"{args.cards} cards x {args.processes} processes, median of {args.runs} runs")
    print(f"inventory: cgroups read   {read * 1e6:9.1f} us per poll  {read / n * 1e6:8.1f} us per card")
    print(f"allocator: node_status    {audited * 1e6:9.1f} us per node  {audited / n * 1e6:8.1f} us per card "
          f"(without attribution {heuristic * 1e6:.1f} us per node)")  # fmt: skip


if __name__ == "__main__":
    main()
