"""An independent check of the ledger against Kubernetes: what the JetStream bucket holds (read
directly, not through a service) compared with the pods the API server has.

Findings, each a sentence naming the pod, allocation or card:
- a card over capacity: memory or compute granted beyond the card, more holders than slots, or an
  exclusive holder sharing its card;
- a pod that runs on a node (phase Running) holding gpuledger cards, with no live allocation there;
- a live allocation owned by a pod that no longer exists, is finished, or is bound elsewhere
  (a reservation still inside its lease, for a pod not yet bound, is not a finding);
- two live allocations for one pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.natscreds import NONE, NatsCredentials
from gpuledger_common.store import LedgerStore
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import CORE_WHOLE, Allocation, AllocState, OwnerKind
from gpuledger_core.usage import node_use

GPU = "gpuledger.io/gpu"
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class PodView:
    uid: str
    namespace: str
    name: str
    node: str
    phase: str
    wants_cards: bool
    deleting: bool


@dataclass
class Report:
    findings: list[str] = field(default_factory=list)
    live: int = 0
    running_gpu_pods: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    def __str__(self) -> str:
        head = f"{self.live} live allocation(s), {self.running_gpu_pods} running GPU pod(s)"
        return head + "".join(f"\n  - {f}" for f in self.findings)


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    wants = any(
        str(c.get("resources", {}).get(part, {}).get(GPU, "0")) not in ("0", "")
        for c in containers
        for part in ("limits", "requests")
    )
    return PodView(
        str(meta.get("uid", "")),
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        str(spec.get("nodeName", "")),
        str(status.get("phase", "")),
        wants,
        bool(meta.get("deletionTimestamp")),
    )


def check(
    ledgers: Iterable[NodeLedger],
    pods: Iterable[Mapping[str, Any]],
    slots_per_card: int,
    now: float,
    *,
    mix_isolation: bool = False,
) -> Report:
    report = Report()
    views = {v.uid: v for v in map(pod_view, pods)}
    held: dict[str, list[Allocation]] = {}
    for ledger in ledgers:
        _capacity(ledger, slots_per_card, report, mix_isolation)
        for allocation in ledger.live():
            report.live += 1
            if allocation.owner.kind == OwnerKind.POD:
                held.setdefault(allocation.owner.id, []).append(allocation)
                _owner_exists(allocation, views.get(allocation.owner.id), now, report)
    for view in views.values():
        if view.wants_cards and view.phase == "Running" and not view.deleting:
            report.running_gpu_pods += 1
            mine = [a for a in held.get(view.uid, []) if a.node == view.node]
            if not mine:
                report.findings.append(f"pod {view.namespace}/{view.name} runs on {view.node} with no live allocation")
    for uid, allocations in held.items():
        if len(allocations) > 1:
            ids = ", ".join(a.id for a in allocations)
            report.findings.append(f"pod uid {uid} holds {len(allocations)} live allocations: {ids}")
    return report


def over_capacity(ledgers: Iterable[NodeLedger], slots_per_card: int, *, mix_isolation: bool = False) -> list[str]:
    """The findings of the first kind alone: every card over capacity."""
    report = Report()
    for ledger in ledgers:
        _capacity(ledger, slots_per_card, report, mix_isolation)
    return report.findings


def _capacity(ledger: NodeLedger, slots_per_card: int, report: Report, mix_isolation: bool) -> None:
    use = node_use(ledger.live())
    for card in ledger.node.cards:
        found = use.get(card.uuid)
        if found is None:
            continue
        where = f"{ledger.node.name} card {card.index}"
        if found.mem_mib > card.memory_mib:
            report.findings.append(f"{where}: {found.mem_mib} MiB granted of {card.memory_mib}")
        if found.core_milli > CORE_WHOLE:
            report.findings.append(f"{where}: {found.core_milli}/{CORE_WHOLE} of its compute granted")
        if found.holders > slots_per_card:
            report.findings.append(f"{where}: {found.holders} holders, more than its {slots_per_card} slots")
        if found.exclusive and found.holders > 1:
            report.findings.append(f"{where}: an exclusive holder shares it with {found.holders - 1} other(s)")
        if len(found.tiers) > 1 and not mix_isolation:
            tiers = " and ".join(sorted(t.value for t in found.tiers))
            report.findings.append(f"{where}: holders of isolation {tiers} share it")


def _owner_exists(allocation: Allocation, view: PodView | None, now: float, report: Report) -> None:
    lease = allocation.lease_expires_at
    pending = allocation.state is AllocState.RESERVED and lease is not None and lease > now
    what = f"allocation {allocation.id} of {allocation.owner.describe()} on {allocation.node}"
    if view is None:
        if not pending:
            report.findings.append(f"{what}: its pod is gone")
        return
    if view.phase in TERMINAL:
        report.findings.append(f"{what}: its pod is {view.phase}")
    elif view.node and view.node != allocation.node:
        report.findings.append(f"{what}: its pod is bound to {view.node}")
    elif not view.node and not pending:
        report.findings.append(f"{what}: its pod is not bound and the reservation's lease is over")


async def read_ledger(nats_url: str, credentials: NatsCredentials = NONE) -> dict[str, NodeLedger]:
    """Every node's ledger, read straight from the JetStream bucket (not through a service), as
    the user of ``credentials`` (a reader's are enough)."""
    nc = await bus.connect(nats_url, "ledger-check", credentials=credentials)
    try:
        return await ledger_through_leader(nc)
    finally:
        await nc.close()


async def ledger_through_leader(nc: Client) -> dict[str, NodeLedger]:
    """Every node's ledger, key by key, each read answered by the stream's leader. Not from a
    watch: a reader may not make a consumer, and a consumer may be placed on any replica of the
    stream (seen: a watch's consumers spread over all three servers), where it reads what that
    server has applied. A replica its leader calls current has stored every committed write in its
    log (raft's ``Peers``), not necessarily applied it: right after a server's restart a check
    through a watch could see an older value than the clients were told."""
    store = await LedgerStore.open(nc)
    found: dict[str, NodeLedger] = {}
    for node in await store.node_names():
        ledger, _ = await store.read(node)
        if ledger is not None:
            found[str(node)] = ledger
    return found
