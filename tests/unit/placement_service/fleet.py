"""An in-memory fleet for the placement service's unit tests: a view fed directly, no NATS."""

from __future__ import annotations

from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_dev.fleet import parse_fleet
from gpuledger_placement.app import Parts, build
from gpuledger_placement.hosts import HostUsage
from gpuledger_placement.kube import NoPodApi
from gpuledger_placement.settings import PlacementSettings

FLEET = """
nodes:
  - name: rtx-0
    profile: rtx3090-1
  - name: p4-0
    profile: tesla-p4-2
  - name: h100-0
    profile: h100-sxm-8
  - name: a100-0
    profile: a100-pcie-4
"""


def parts(
    policy: str = "default", stale_after_s: float = 0.0, guard: str = "off", hosts: HostUsage | None = None
) -> Parts:
    settings = PlacementSettings(kube="off", stale_after_s=stale_after_s, policy=policy, guard=guard)
    built = build(settings, None, NoPodApi(), None, hosts)
    for revision, node in enumerate(parse_fleet(FLEET).nodes, start=1):
        built.view.apply(NodeName(node.node.name), NodeLedger(node.node), revision)
    return built
