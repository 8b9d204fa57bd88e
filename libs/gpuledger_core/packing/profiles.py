"""Node states with the interconnects of real systems (DGX-1, HGX H100, bridged PCIe pairs).

For tests and demos; see shared/reference/topologies.md for the systems.
"""

from __future__ import annotations

from gpuledger_core.model import PcieLevel
from gpuledger_core.packing.state import CardState, NodeState, Topology

SYS = int(PcieLevel.SYSTEM)
PIX = int(PcieLevel.SINGLE_SWITCH)
NODE = int(PcieLevel.NUMA_NODE)

# DGX-1 (V100) hybrid cube-mesh: two fully connected quads {0-3} and {4-7} (some links doubled)
# plus the cube's vertical edges i <-> i+4; every GPU has six NVLinks.
DGX1_LINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 1, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 1,
}  # fmt: skip


def node_of(
    name: str,
    size: int,
    nvlinks: dict[tuple[int, int], int],
    pcie: dict[tuple[int, int], int] | None = None,
    numa: tuple[int | None, ...] | None = None,
    model: str = "V100",
    busy: frozenset[int] = frozenset(),
) -> NodeState:
    nv = [[0] * size for _ in range(size)]
    pc = [[SYS] * size for _ in range(size)]
    for (a, b), count in nvlinks.items():
        nv[a][b] = nv[b][a] = count
    for (a, b), level in (pcie or {}).items():
        pc[a][b] = pc[b][a] = level
    numas = numa or tuple(None for _ in range(size))
    cards = tuple(
        CardState(i, model, 0 if i in busy else 1000, 16384, 0 if i in busy else 16384,
                  idle=i not in busy, numa=numas[i])
        for i in range(size)
    )  # fmt: skip
    return NodeState(name, cards, Topology(tuple(map(tuple, nv)), tuple(map(tuple, pc))))


def dgx1(busy: frozenset[int] = frozenset()) -> NodeState:
    same_numa = {(a, b): NODE for a in range(8) for b in range(a + 1, 8) if a // 4 == b // 4}
    return node_of("dgx1", 8, DGX1_LINKS, same_numa, (0, 0, 0, 0, 1, 1, 1, 1), busy=busy)


def hgx_h100(busy: frozenset[int] = frozenset()) -> NodeState:
    links = {(a, b): 18 for a in range(8) for b in range(a + 1, 8)}
    same_numa = {(a, b): NODE for a in range(8) for b in range(a + 1, 8) if a // 4 == b // 4}
    return node_of("h100", 8, links, same_numa, (0, 0, 0, 0, 1, 1, 1, 1), "H100", busy)


def bridged_pairs(busy: frozenset[int] = frozenset()) -> NodeState:
    """Four PCIe cards as two NVLink-bridged pairs (0-1, 2-3), each pair on one switch."""
    return node_of("pairs", 4, {(0, 1): 4, (2, 3): 4}, {(0, 1): PIX, (2, 3): PIX}, busy=busy,
                   model="A40")  # fmt: skip
