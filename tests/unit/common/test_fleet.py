from __future__ import annotations

import re
import textwrap
from importlib import resources
from pathlib import Path

import pytest

from gpuledger_common.profiles import PROFILES
from gpuledger_core.model import Link, PcieLevel
from gpuledger_dev.fleet import FleetError, card_uuid, load_fleet, parse_fleet


def _fleet(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


@pytest.mark.parametrize(
    ("profile", "cards", "memory_mib", "links"),
    [
        ("h100-sxm-8", 8, 81559, 28),
        ("a100-sxm-8", 8, 81920, 28),
        ("dgx1-v100", 8, 32510, 28),
        ("a100-pcie-4", 4, 40960, 6),
        ("rtx3090-1", 1, 24259, 0),
        ("tesla-p4-2", 2, 7611, 1),
        ("a100-mig-1", 1, 40960, 0),
    ],
)
def test_every_profile_loads(profile: str, cards: int, memory_mib: int, links: int) -> None:
    fleet = parse_fleet(f"nodes:\n  - name: n-0\n    profile: {profile}\n")
    (only,) = fleet.nodes
    assert only.profile == profile
    assert len(only.node.cards) == cards
    assert {c.memory_mib for c in only.node.cards} == {memory_mib}
    assert len(only.node.links) == links
    assert [c.index for c in only.node.cards] == list(range(cards))
    assert len({c.uuid for c in only.node.cards}) == cards
    assert only.node.cpu_milli > 0 and only.node.memory_mib > 0
    for link in only.node.links:
        assert 0 <= link.a < link.b < cards


def test_the_profile_table_is_the_tested_one() -> None:
    assert set(PROFILES) == {
        "h100-sxm-8",
        "a100-sxm-8",
        "dgx1-v100",
        "a100-pcie-4",
        "rtx3090-1",
        "tesla-p4-2",
        "a100-mig-1",
    }


def _nvlinks_per_card(profile: str) -> dict[int, int]:
    p = PROFILES[profile]()
    return {i: sum(ln.nvlinks for ln in p.links if i in (ln.a, ln.b)) for i in range(len(p.cards))}


def test_dgx1_gives_every_gpu_six_nvlinks_to_four_peers() -> None:
    assert _nvlinks_per_card("dgx1-v100") == dict.fromkeys(range(8), 6)
    links = PROFILES["dgx1-v100"]().links
    for i in range(8):
        assert sum(1 for ln in links if i in (ln.a, ln.b) and ln.nvlinks) == 4


def test_h100_joins_every_pair_over_nvswitch() -> None:
    p = PROFILES["h100-sxm-8"]()
    assert p.nvswitch
    assert {(ln.a, ln.b) for ln in p.links} == {(a, b) for a in range(8) for b in range(a + 1, 8)}
    assert {ln.nvlinks for ln in p.links} == {18}
    # cards 0-3 are on one socket, 4-7 on the other
    assert p.links[0] == Link(0, 1, 18, PcieLevel.NUMA_NODE)
    node = parse_fleet("nodes:\n  - name: h\n    profile: h100-sxm-8\n").nodes[0].node
    assert node.link(3, 4).pcie is PcieLevel.SYSTEM
    assert [c.numa for c in node.cards] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a100_pcie_has_two_bridged_pairs() -> None:
    bridged = {(ln.a, ln.b) for ln in PROFILES["a100-pcie-4"]().links if ln.nvlinks}
    assert bridged == {(0, 1), (2, 3)}


def test_cards_links_and_labels_can_be_given_by_hand() -> None:
    fleet = parse_fleet(
        _fleet(
            """
            nodes:
              - name: lab-1
                cards:
                  - {model: Tesla T4, memory_mib: 15360}
                  - {model: Tesla T4, memory_mib: 15360, numa: 1}
                links:
                  - {a: 1, b: 0, nvlinks: 2, pcie: pix}
                cpu_milli: 8000
                memory_mib: 32768
                labels: {zone: b, rack: 7}
                faults: [{card: 0, xid: 79}]
            """
        )
    )
    (only,) = fleet.nodes
    n = only.node
    assert only.profile is None
    assert [(c.model, c.memory_mib, c.numa, c.minor) for c in n.cards] == [
        ("Tesla T4", 15360, 0, 0),
        ("Tesla T4", 15360, 1, 1),
    ]
    assert n.links == (Link(0, 1, 2, PcieLevel.SINGLE_SWITCH),)
    assert (n.cpu_milli, n.memory_mib) == (8000, 32768)
    assert n.labels == (("rack", "7"), ("zone", "b"))
    assert only.extra == {"faults": [{"card": 0, "xid": 79}]}


def test_a_profile_can_be_overridden() -> None:
    fleet = parse_fleet("nodes:\n  - name: h\n    profile: h100-sxm-8\n    cpu_milli: 1000\n")
    assert fleet.nodes[0].node.cpu_milli == 1000
    assert fleet.nodes[0].node.memory_mib == PROFILES["h100-sxm-8"]().memory_mib


def test_the_packaged_dev_fleet_loads() -> None:
    text = (resources.files("gpuledger_dev") / "fleets" / "dev.yaml").read_text(encoding="utf-8")
    fleet = parse_fleet(text, "dev.yaml")
    assert [n.node.name for n in fleet.nodes] == ["rtx-0", "p4-0", "h100-0", "a100-mig-0"]
    assert fleet.node("p4-0").profile == "tesla-p4-2"
    with pytest.raises(KeyError, match="rtx-0, p4-0, h100-0, a100-mig-0"):
        fleet.node("nope")


def test_a_fleet_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("nodes:\n  - name: Bad_Name\n    profile: rtx3090-1\n", encoding="utf-8")
    with pytest.raises(FleetError) as caught:
        load_fleet(path)
    assert str(caught.value).startswith(f"{path}:2: nodes[0].name: ")


BAD_FLEETS = [
    (
        """
        nodes:
          - name: ok-0
            profile: rtx3090-1
          - name: Not_OK
            profile: rtx3090-1
        """,
        4,
        "nodes[1].name",
        "'Not_OK' is not a valid node name (lower-case DNS name)",
    ),
    (
        """
        nodes:
          - name: a
            profile: rtx3090-1
          - name: b
            profile: rtx3090-1
          - name: a
            profile: tesla-p4-2
        """,
        6,
        "nodes[2].name",
        "node 'a' repeats line 2",
    ),
    (
        """
        nodes:
          - name: a
            profile: rtx3090-1
            gpus: 4
        """,
        4,
        "nodes[0].gpus",
        "unknown field (expected one of ",
    ),
    (
        """
        # a comment first
        nodes:
          - name: a
            profile: rtx3090-1
        extra: true
        """,
        5,
        "extra",
        "unknown field (expected one of nodes)",
    ),
    (
        """
        nodes:
          - name: a
            profile: h200-sxm-8
        """,
        3,
        "nodes[0].profile",
        "unknown profile 'h200-sxm-8' (known: a100-mig-1, a100-pcie-4, ",
    ),
    (
        """
        nodes:
          - name: a
            labels: {}
        """,
        2,
        "nodes[0].profile",
        "give either a profile or a list of cards",
    ),
    (
        """
        nodes:
          - profile: rtx3090-1
        """,
        2,
        "nodes[0].name",
        "is required",
    ),
    (
        """
        nodes:
          - name: a
            cards:
              - model: T4
                memory_mib: 0
        """,
        5,
        "nodes[0].cards[0].memory_mib",
        "must be positive",
    ),
    (
        """
        nodes:
          - name: a
            cards:
              - {model: T4, memory_mib: 16000}
              - model: T4
                memory_mib: -1
        """,
        6,
        "nodes[0].cards[1].memory_mib",
        "must not be negative, got -1",
    ),
    (
        """
        nodes:
          - name: a
            cards:
              - {model: T4, memory_mib: 16000, vram: 1}
        """,
        4,
        "nodes[0].cards[0].vram",
        "unknown field (expected one of memory_mib, model, numa)",
    ),
    (
        """
        nodes:
          - name: a
            cards:
              - model: T4
                memory_mib: lots
        """,
        5,
        "nodes[0].cards[0].memory_mib",
        "must be int, got 'lots'",
    ),
    (
        """
        nodes:
          - name: a
            profile: tesla-p4-2
            cpu_milli: true
        """,
        4,
        "nodes[0].cpu_milli",
        "must be int, got True",
    ),
    (
        """
        nodes:
          - name: a
            profile: tesla-p4-2
            links:
              - a: 0
                b: 2
        """,
        6,
        "nodes[0].links[0].b",
        "card 2 does not exist (the node has 2 cards)",
    ),
    (
        """
        nodes:
          - name: a
            profile: tesla-p4-2
            links:
              - {a: 1, b: 1}
        """,
        5,
        "nodes[0].links[0].b",
        "a link joins two different cards",
    ),
    (
        """
        nodes:
          - name: a
            profile: tesla-p4-2
            links:
              - a: 0
                b: 1
                pcie: NVL
        """,
        7,
        "nodes[0].links[0].pcie",
        "must be one of BOARD, PIX, PXB, PHB, NODE, SYS, got 'NVL'",
    ),
    (
        """
        nodes:
          - name: a
            profile: tesla-p4-2
            labels: [zone]
        """,
        4,
        "nodes[0].labels",
        "must be dict, got ['zone']",
    ),
    ("nodes: []\n", 1, "nodes", "the fleet has no nodes"),
    ("", 1, "fleet", "must be a mapping"),
    ("- just\n- a list\n", 1, "fleet", "must be a mapping"),
    ("nodes:\n  - name: a\n    profile: [unclosed\n", 4, "fleet", "not valid YAML: "),
]


@pytest.mark.parametrize(("text", "line", "field", "problem"), BAD_FLEETS)
def test_a_bad_fleet_names_file_line_and_field(text: str, line: int, field: str, problem: str) -> None:
    with pytest.raises(FleetError) as caught:
        parse_fleet(_fleet(text), "fleet.yaml")
    err = caught.value
    assert (err.path, err.line, err.field) == ("fleet.yaml", line, field)
    assert err.problem.startswith(problem)
    assert str(err).startswith(f"fleet.yaml:{line}: {field}: {problem}")


def test_card_uuids_are_stable_and_distinct() -> None:
    assert card_uuid("h100-0", 3) == "GPU-73417507-1aa2-5779-893e-b4265f010eef"
    assert card_uuid("h100-0", 3) == card_uuid("h100-0", 3)
    seen = {card_uuid(n, i) for n in ("a", "b", "a-0") for i in range(8)}
    assert len(seen) == 24
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", u) for u in seen)


def test_a_node_keeps_its_uuids_across_loads() -> None:
    text = "nodes:\n  - name: p4-0\n    profile: tesla-p4-2\n"
    first, again = parse_fleet(text).nodes[0].node, parse_fleet(text).nodes[0].node
    assert [c.uuid for c in first.cards] == [c.uuid for c in again.cards]
    assert [c.uuid for c in first.cards] == [card_uuid("p4-0", 0), card_uuid("p4-0", 1)]
