"""The fault policy: every catalogued XID's action, the classes, overrides, and the doc that says so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuledger_common.settings import SettingsError, load
from gpuledger_core.ids import CardUuid
from gpuledger_inventory.faults import (
    BUCKET_ACTIONS,
    CLASS_ACTIONS,
    Action,
    FaultClass,
    FaultPolicy,
    catalog_action,
    fault_policy,
    parse_actions,
)
from gpuledger_inventory.inventory import EventKind, GpuEvent
from gpuledger_inventory.settings import InventorySettings
from gpuledger_inventory.xid_catalog import CATALOG

pytestmark = pytest.mark.timeout(5)

DOC = Path(__file__).parents[3] / "docs" / "xid-policy.md"
A = CardUuid("GPU-a")


def numbers(*parts: int | range) -> set[int]:
    return {n for p in parts for n in (p if isinstance(p, range) else [p])}


# the whole catalog, written out apart from the code: XIDs 1 to 172
APPLICATION = numbers(
    8, 11, 13, 14, 25, 31, 37, 38, range(39, 42), 43, 44, 45, 60, 63, 66, 67, 68, 69, range(70, 73),
    range(75, 78), 80, range(82, 87), 88, 89, 92, 93, range(96, 108), 108, 121, range(126, 136), 137,
    139, 141, 152, 153, 160, 161, range(162, 166),
)  # fmt: skip
RESET = numbers(46, 48, 62, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158, 171, 172)
DRAIN = {151}
RETIRE = {64}
NO_NEW_WORK = set(range(1, 173)) - APPLICATION - RESET - DRAIN - RETIRE
EXPECTED = (
    dict.fromkeys(APPLICATION, Action.APPLICATION)
    | dict.fromkeys(NO_NEW_WORK, Action.NO_NEW_WORK)
    | dict.fromkeys(DRAIN, Action.DRAIN)
    | dict.fromkeys(RESET, Action.RESET)
    | dict.fromkeys(RETIRE, Action.RETIRE)
)


def test_the_catalog_lists_xids_1_to_172() -> None:
    assert sorted(CATALOG) == list(range(1, 173))
    assert all(info.xid == n for n, info in CATALOG.items())


@pytest.mark.parametrize("number", sorted(EXPECTED))
def test_each_catalogued_xid_has_its_action(number: int) -> None:
    assert FaultPolicy().for_xid(number)[0] is EXPECTED[number]


def test_the_no_new_work_xids_are_the_unused_and_the_undecidable() -> None:
    used = {n for n in NO_NEW_WORK if not CATALOG[n].meaning.startswith("unused")}
    assert used == numbers(32, 54, 78, 94, 142, range(144, 151), 154, 157, 159, range(166, 171))


@pytest.mark.parametrize(
    ("number", "meaning", "recovery", "linked"),
    [
        (13, "graphics engine exception", "RESTART_APP", False),
        (48, "double-bit (uncorrectable) ECC error", "WORKFLOW_XID_48", True),
        (64, "a memory row remapping (or page retirement) failed", "RESET_GPU", True),
        (79, "GPU has fallen off the bus", "RESTART_BM", True),
        (119, "GSP firmware did not answer an RPC in time", "RESET_GPU", False),
        (154, "GPU recovery action changed", "XID_154", False),
        (167, "PCIe fatal timeout", "", False),
    ],
)
def test_meanings_and_nvidias_recovery(number: int, meaning: str, recovery: str, linked: bool) -> None:
    info = CATALOG[number]
    assert info.meaning.startswith(meaning)
    assert (info.recovery, info.reports_recovery) == (recovery, linked)


def test_every_bucket_in_the_catalog_has_an_action() -> None:
    assert {info.recovery for info in CATALOG.values()} <= set(BUCKET_ACTIONS)


def test_actions_are_ordered_by_severity() -> None:
    assert [a.severity for a in Action] == [0, 1, 2, 3, 4]
    assert Action.NO_NEW_WORK.at_least(Action.RESET) is Action.RESET
    assert Action.RETIRE.at_least(Action.DRAIN) is Action.RETIRE


@pytest.mark.parametrize(
    ("fault", "action"),
    [
        (FaultClass.ECC_UNCORRECTABLE, Action.RESET),
        (FaultClass.ROW_REMAP_PENDING, Action.APPLICATION),
        (FaultClass.ROW_REMAP_FAILURE, Action.RETIRE),
        (FaultClass.LOST, Action.RESET),
        (FaultClass.NVML, Action.NO_NEW_WORK),
        (FaultClass.REGISTRATION, Action.NO_NEW_WORK),
        (FaultClass.UNATTRIBUTED, Action.NO_NEW_WORK),
        (FaultClass.OPERATOR, Action.NO_NEW_WORK),
        (FaultClass.UNKNOWN_XID, Action.NO_NEW_WORK),
    ],
)
def test_the_classes_that_are_not_xids(fault: FaultClass, action: Action) -> None:
    assert FaultPolicy().for_class(fault) is action


def test_an_unknown_xid_takes_the_default() -> None:
    assert FaultPolicy().for_xid(999) == (Action.NO_NEW_WORK, "not in the catalog")
    assert FaultPolicy({999: Action.DRAIN}).for_xid(999) == (Action.DRAIN, "not in the catalog")


@pytest.mark.parametrize(
    ("event", "action", "reason"),
    [
        (GpuEvent(EventKind.XID, A, 79), Action.RESET, "XID 79: GPU has fallen off the bus"),
        (GpuEvent(EventKind.XID, A, 13, "MIG-x"), Action.APPLICATION, "XID 13 on MIG-x: graphics engine exception"),
        (GpuEvent(EventKind.ECC_DOUBLE, A), Action.RESET, "double-bit ECC error"),
        (GpuEvent(EventKind.ECC_SINGLE, A), Action.APPLICATION, ""),
        (GpuEvent(EventKind.MIG_CHANGE, A), Action.APPLICATION, ""),
        (GpuEvent(EventKind.XID, None, 64), Action.NO_NEW_WORK, "XID 64: a memory row remapping"),
        (GpuEvent(EventKind.ECC_DOUBLE, None), Action.NO_NEW_WORK, "double-bit ECC error (on a card NVML"),
        (GpuEvent(EventKind.XID, None, 43), Action.APPLICATION, "XID 43"),
    ],
)
def test_action_for_an_event(event: GpuEvent, action: Action, reason: str) -> None:
    got, why = FaultPolicy().action_for(event)
    assert got is action
    assert why.startswith(reason)


def test_overrides_lie_over_the_catalog() -> None:
    policy = fault_policy({109, 13}, "79=retire, 13=application,154=drain")
    assert policy.for_xid(79)[0] is Action.RETIRE
    assert policy.for_xid(109)[0] is Action.APPLICATION
    assert policy.for_xid(154)[0] is Action.DRAIN
    assert policy.for_xid(95)[0] is Action.RESET


def test_parse_actions() -> None:
    assert parse_actions("") == {}
    assert parse_actions(" 79 = retire ,13=drain,13=drain") == {79: Action.RETIRE, 13: Action.DRAIN}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("79", "item 1 ('79'): must be XID=ACTION, e.g. 79=retire"),
        ("13=drain,79=reboot", "item 2 ('79=reboot'): 'reboot' is not an action (application|no-new-work|"),
        ("x=drain", "item 1 ('x=drain'): 'x' is not an XID (a positive whole number)"),
        ("0=drain", "item 1 ('0=drain'): '0' is not an XID"),
        ("13=drain,,79=reset", "item 2 (''): must be XID=ACTION"),
        ("13=drain,13=reset", "item 2 ('13=reset'): XID 13 is given two actions"),
    ],
)
def test_a_bad_item_is_named(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=r"^" + re.escape(problem)):
        parse_actions(text)


def test_an_xid_ignored_and_given_another_action_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"XID 13 is in ignore_xids \(application\) and in xid_actions as drain"):
        fault_policy({13}, "13=drain")
    assert fault_policy({13}, "13=application").for_xid(13)[0] is Action.APPLICATION


def test_the_settings_refuse_a_bad_policy_at_start() -> None:
    env = {"GPULEDGER_NODE": "n"}
    with pytest.raises(SettingsError, match=r"^xid_actions: item 1 \('79=reboot'\)"):
        load(InventorySettings, ["--xid-actions", "79=reboot"], env)
    with pytest.raises(SettingsError, match=r"^xid_actions: XID 13 is in ignore_xids"):
        load(InventorySettings, ["--ignore-xids", "13", "--xid-actions", "13=reset"], env)
    settings = load(InventorySettings, [], env | {"GPULEDGER_XID_ACTIONS": "79=retire"})
    assert settings.ignore_xids == frozenset()
    assert settings.faults().for_xid(79)[0] is Action.RETIRE


# --- the doc and the code say the same ---------------------------------------------------------


def doc_table(heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading`` in docs/xid-policy.md, cells stripped."""
    text = DOC.read_text()
    after = text[text.index(heading) :]
    rows = []
    for line in after.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:]  # past the header


def test_the_docs_xid_table_is_the_catalog() -> None:
    rows = doc_table("### Every XID in the catalog")
    documented = {int(r[0]): (r[2], r[3], r[4] == "yes") for r in rows}
    code = {
        n: (catalog_action(n)[0].value, info.recovery or "(none)", info.reports_recovery) for n, info in CATALOG.items()
    }
    assert documented == code


def test_the_docs_bucket_table_is_the_code() -> None:
    rows = doc_table("### By NVIDIA's immediate action")
    assert {r[0]: r[1] for r in rows} == {(b or "(none)"): a.value for b, (a, _) in BUCKET_ACTIONS.items()}


def test_the_docs_class_table_is_the_code() -> None:
    rows = doc_table("## Faults that are not XIDs")
    assert {r[0]: r[1] for r in rows} == {c.value: a.value for c, (a, _) in CLASS_ACTIONS.items()}
