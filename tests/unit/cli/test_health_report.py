"""What ``gpuledger health`` shows: a node's cards with their stage and history, the cluster in short."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuledger_cli import health_report
from gpuledger_cli.__main__ import main
from gpuledger_common import card_history
from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.model import Card, Health, Remedy
from gpuledger_core.status import CardStatus, NodeStatus

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20Z


def card_extra(index: int, health: dict[str, Any] | None = None, remediation: dict[str, Any] | None = None) -> Any:
    return {
        "uuid": f"GPU-{index}",
        "index": index,
        "health": health
        or {"state": "healthy", "cause": "", "reason": "", "since": 0.0, "by": "", "action": "application"},
        "remediation": remediation or {"stage": "serving", "since": 0.0, "history": []},
    }


def message() -> Any:
    """Card 0 serving; card 1 back after a reset; card 2 draining after XID 79; card 3 faulted
    (no-new-work); card 4 retired by an operator."""
    xid79 = "XID 79: GPU has fallen off the bus"
    cards = [
        card_extra(0),
        card_extra(
            1,
            {"state": "healthy", "since": T0 + 40, "by": "rule:remediation", "action": "application"},
            {
                "stage": "serving",
                "since": T0 + 40,
                "history": [
                    {"at": T0 + 10, "stage": "quarantined", "reason": xid79},
                    {"at": T0 + 20, "stage": "drained", "reason": "no holder and no process"},
                    {"at": T0 + 21, "stage": "resetting", "reason": "reset started"},
                    {"at": T0 + 30, "stage": "checking", "reason": "reset done"},
                    {"at": T0 + 40, "stage": "serving", "reason": "checked: back in service"},
                ],
            },
        ),
        card_extra(
            2,
            {"state": "unhealthy", "reason": xid79, "since": T0 + 100, "by": "xid", "action": "reset"},
            {
                "stage": "quarantined",
                "since": T0 + 100,
                "history": [{"at": T0 + 100, "stage": "quarantined", "reason": xid79}],
            },
        ),
        card_extra(
            3, {"state": "unhealthy", "reason": "XID 31: fault", "since": T0 + 50, "by": "xid", "action": "no-new-work"}
        ),
        card_extra(
            4,
            {
                "state": "unhealthy",
                "reason": "bad fan",
                "since": T0 + 60,
                "by": "operator:ana",
                "action": "no-new-work",
            },
            {
                "stage": "retired",
                "since": T0 + 70,
                "history": [{"at": T0 + 70, "stage": "retired", "reason": "retired by operator:ana (bad fan)"}],
            },
        ),
    ]
    log = [
        {"at": T0 + 10, "uuid": "GPU-1", "health": "unhealthy", "reason": xid79, "by": "xid", "action": "reset"},
        {
            "at": T0 + 40,
            "uuid": "GPU-1",
            "health": "healthy",
            "reason": "repaired and checked",
            "by": "rule:remediation",
        },
        {"at": T0 + 100, "uuid": "GPU-2", "health": "unhealthy", "reason": xid79, "by": "xid", "action": "reset"},
    ]
    remedies = {2: "drain", 4: "retired"}
    node_cards = [{"uuid": f"GPU-{i}", "index": i, "remedy": remedies.get(i, "")} for i in range(5)]
    return {
        "node": {"name": "gpu-a", "cards": node_cards},
        "at": T0 + 200,
        "extra": {"cards": cards, "health_log": log},
    }


def test_each_card_has_its_health_action_stage_and_since() -> None:
    report = card_history.from_inventory(message())
    got = {c.index: (c.health, c.action, c.stage, c.since, c.remedy) for c in report.cards}
    assert got == {
        0: ("healthy", "", "serving", 0.0, ""),
        1: ("healthy", "", "serving", T0 + 40, ""),
        2: ("unhealthy", "reset", "quarantined", T0 + 100, "drain"),
        3: ("unhealthy", "no-new-work", "faulted", T0 + 50, ""),  # unhealthy without remediation
        4: ("unhealthy", "no-new-work", "retired", T0 + 70, "retired"),
    }


def test_a_history_merges_health_transitions_and_steps_in_time() -> None:
    one = card_history.from_inventory(message()).cards[1]
    assert [(e.at - T0, e.what, e.by) for e in one.history] == [
        (10, "fault", "xid"),
        (10, "quarantined", "rule:remediation"),
        (20, "drained", "rule:remediation"),
        (21, "resetting", "rule:remediation"),
        (30, "reset", "rule:remediation"),
        (40, "back", "rule:remediation"),
        (40, "healthy", "rule:remediation"),
    ]


def test_the_node_text_lists_every_card_then_the_histories() -> None:
    text = health_report.node_text(card_history.from_inventory(message()), T0 + 160)
    lines = text.splitlines()
    assert lines[0] == "node gpu-a: 5 card(s): 2 serving, 1 faulted, 1 quarantined, 1 retired"
    assert lines[1].split() == ["CARD", "UUID", "HEALTH", "ACTION", "STAGE", "SINCE", "REASON"]
    assert lines[4].split()[:6] == ["2", "GPU-2", "unhealthy", "reset", "quarantined", "2023-11-14"]
    assert lines[4].endswith("22:15:00Z (60s ago)   XID 79: GPU has fallen off the bus")
    assert "card 1 (GPU-1):" in lines and "card 4 (GPU-4):" in lines
    back = next(line for line in lines if " back " in line)
    assert back.split()[:4] == ["2023-11-14", "22:14:00Z", "back", "checked:"]
    assert "retired by operator:ana (bad fan)  operator:ana" in text


def test_the_node_text_of_one_card() -> None:
    text = health_report.node_text(card_history.from_inventory(message()), T0, card="GPU-4")
    assert text.splitlines()[0] == "node gpu-a: 1 card(s): 1 retired"
    assert "GPU-2" not in text and "card 4 (GPU-4):" in text


def ledger_card(
    index: int, health: Health = Health.HEALTHY, reason: str = "", remedy: Remedy = Remedy.NONE
) -> CardStatus:
    card = Card(CardUuid(f"GPU-{index}"), index, "H100", 81559, health=health, health_reason=reason, remedy=remedy)
    return CardStatus(card, 81559, 1000, ())


def test_the_cluster_text_has_a_line_per_card_not_serving_and_totals() -> None:
    fine = NodeStatus(NodeName("gpu-b"), (ledger_card(0), ledger_card(1)))
    away = NodeStatus(NodeName("gpu-c"), (ledger_card(0, Health.UNHEALTHY, "XID 79", Remedy.RESET),))
    assert not card_history.needs_inventory(fine) and card_history.needs_inventory(away)
    reports = [
        card_history.from_inventory(message()),
        card_history.from_ledger(fine, ""),
        card_history.from_ledger(away, "its inventory does not answer"),
    ]
    lines = health_report.cluster_text(reports, T0 + 160).splitlines()
    assert [line.split()[:5] for line in lines[1:5]] == [
        ["gpu-a", "2", "unhealthy", "reset", "quarantined"],
        ["gpu-a", "3", "unhealthy", "no-new-work", "faulted"],
        ["gpu-a", "4", "unhealthy", "no-new-work", "retired"],
        ["gpu-c", "0", "unhealthy", "-", "resetting"],
    ]
    assert lines[5] == "gpu-c: from the ledger (its inventory does not answer)"
    assert lines[6] == "3 node(s), 8 card(s): 4 serving, 1 faulted, 1 quarantined, 1 resetting, 1 retired"


def test_the_json_has_every_node_s_cards_and_totals() -> None:
    raw = health_report.to_json([card_history.from_inventory(message())])
    assert json.loads(json.dumps(raw)) == raw
    assert raw["totals"] == {"faulted": 1, "quarantined": 1, "retired": 1, "serving": 2}
    two = raw["nodes"][0]["cards"][2]
    assert (two["stage"], two["remedy"], two["source"]) == ("quarantined", "drain", "inventory")
    assert two["history"][0] == {
        "at": T0 + 100,
        "what": "fault",
        "reason": "XID 79: GPU has fallen off the bus",
        "by": "xid",
    }


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["health", "--healthy", "--card", "1"], "--node"),
        (["health", "--retire", "--node", "gpu-a"], "--card"),
        (["health", "--card", "1"], "--card"),
    ],
)
def test_a_mark_needs_its_node_and_card(argv: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert f"gpuledger health: invalid {field}" in capsys.readouterr().err
