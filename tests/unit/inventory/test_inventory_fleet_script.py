"""The fleet file's simulation keys (mig, processes, faults): accepted shapes and exact errors."""

from __future__ import annotations

import pytest

from gpuledger_dev.fleet import FleetError, parse_fleet
from gpuledger_dev.fleet_script import FaultKind, FaultSpec, simulate

pytestmark = pytest.mark.timeout(5)

HEAD = "nodes:\n  - name: n1\n    profile: {profile}\n"


def load(body: str, profile: str = "a100-mig-1") -> object:
    return simulate(parse_fleet(HEAD.format(profile=profile) + body, "f.yaml"))["n1"]


def test_a_valid_node() -> None:
    sim = load(
        "    mig:\n"
        "      - card: 0\n"
        "        instances: [7g.40gb]\n"
        "    processes:\n"
        "      - {card: 0, pid: 9, memory_mib: 100, mig: 0}\n"
        "    faults:\n"
        "      - {at: 2, card: 0, xid: 79}\n"
        "      - {at: 3, kind: lost, card: 0}\n"
        "      - {at: 4, kind: nvml_down, until: 6}\n"
    )
    assert [p.name for p in sim.mig[0].instances] == ["7g.40gb"]  # type: ignore[attr-defined]
    assert sim.faults == (  # type: ignore[attr-defined]
        FaultSpec(FaultKind.XID, 2.0, 0, 79),
        FaultSpec(FaultKind.LOST, 3.0, 0),
        FaultSpec(FaultKind.NVML_DOWN, 4.0, until=6.0),
    )


def test_a_mig_profile_gets_a_default_layout() -> None:
    sim = load("")
    assert [p.name for p in sim.mig[0].instances] == ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "profile", "line", "field", "problem"),
    [
        (
            "    faults:\n      - {at: 2, card: 9, xid: 79}\n",
            "a100-mig-1",
            5,
            "nodes[0].faults[0].card",
            "does not exist",
        ),
        (
            "    faults:\n      - {at: -1, card: 0, xid: 79}\n",
            "a100-mig-1",
            5,
            "nodes[0].faults[0].at",
            "negative",
        ),
        (
            "    faults:\n      - {card: 0, xid: 79, when: 3}\n",
            "a100-mig-1",
            5,
            "nodes[0].faults[0].when",
            "unknown field",
        ),
        (
            "    faults:\n      - {card: 0, kind: melt}\n",
            "a100-mig-1",
            5,
            "nodes[0].faults[0].kind",
            "must be one of",
        ),
        (
            "    faults:\n      - {card: 0}\n",
            "a100-mig-1",
            5,
            "nodes[0].faults[0].xid",
            "is required",
        ),
        (
            "    faults:\n      - {kind: lost, card: 0, xid: 3}\n",
            "a100-mig-1",
            5,
            "nodes[0].faults[0].xid",
            "does not apply",
        ),
        (
            "    faults:\n      - {kind: nvml_down, at: 5, until: 2}\n",
            "a100-mig-1",
            5,
            "nodes[0].faults[0].until",
            "after",
        ),
        (
            "    faults:\n      -\n        at: 1\n        card: 0\n        xid: x\n",
            "a100-mig-1",
            8,
            "nodes[0].faults[0].xid",
            "must be int",
        ),
        ("    faults: 3\n", "a100-mig-1", 2, "nodes[0].faults", "must be a list"),
        (
            "    processes:\n      - {card: 0, pid: 0}\n",
            "a100-mig-1",
            5,
            "nodes[0].processes[0].pid",
            "positive",
        ),
        (
            "    processes:\n      - {card: 0, pid: 3, memory_mib: 99999}\n",
            "a100-mig-1",
            5,
            "nodes[0].processes[0].memory_mib",
            "exceeds",
        ),
        (
            "    processes:\n      - {card: 0, pid: 3, mig: 0}\n",
            "tesla-p4-2",
            5,
            "nodes[0].processes[0].mig",
            "not partitioned",
        ),
        (
            "    mig:\n      - {card: 0, instances: [3g.20gb]}\n",
            "tesla-p4-2",
            5,
            "nodes[0].mig[0].card",
            "has no MIG",
        ),
        (
            "    mig:\n      - {card: 0, instances: [9g.99gb]}\n",
            "a100-mig-1",
            5,
            "nodes[0].mig[0].instances",
            "must be a list of",
        ),
        (
            "    mig:\n      - {card: 0, instances: [4g.20gb, 4g.20gb]}\n",
            "a100-mig-1",
            5,
            "nodes[0].mig[0].instances",
            "4g.20gb does not fit beside 4g.20gb",
        ),
    ],
)
def test_bad_simulation_keys_name_file_line_and_field(
    body: str, profile: str, line: int, field: str, problem: str
) -> None:
    with pytest.raises(FleetError) as caught:
        load(body, profile)
    err = caught.value
    assert (err.path, err.line, err.field) == ("f.yaml", line, field)
    assert problem in err.problem
    assert str(err).startswith(f"f.yaml:{line}: {field}: ")
