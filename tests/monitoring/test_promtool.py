"""The alert rules and the Grafana board's queries through promtool, built from its Go module.

``tox -e monitoring`` builds promtool first (``python -m tests.support.promtool``); without it these
tests fail, naming that command.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.promtool import promtool_binary
from tests.unit.deploy.monitoring import RULE_TESTS, RULES, board_queries, component_rule_groups, dashboard


@pytest.fixture(scope="module")
def promtool() -> Path:
    binary = promtool_binary()
    if not binary.is_file():
        pytest.fail(f"no promtool at {binary}: build it with python -m tests.support.promtool (tox -e monitoring does)")
    return binary


def run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_rules(promtool: Path) -> None:
    done = run(promtool, "check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_fires_and_stays_quiet_as_its_tests_say(promtool: Path) -> None:
    done = run(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_would_catch_a_broken_rule_and_a_wrong_expectation(promtool: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: sum by (node (up)\n")
    assert run(promtool, "check", "rules", str(broken)).returncode != 0
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = [str(RULES)]
    first = tests["tests"][0]["alert_rule_test"]
    first[0]["exp_alerts"], first[1]["exp_alerts"] = first[1]["exp_alerts"], first[0]["exp_alerts"]
    swapped = tmp_path / "swapped.test.yaml"
    swapped.write_text(yaml.safe_dump(tests))
    assert run(promtool, "test", "rules", str(swapped)).returncode != 0


def test_every_board_query_is_valid_promql(promtool: Path, tmp_path: Path) -> None:
    """Each query of the board (its variables replaced) as a recording rule, checked by promtool."""
    queries = board_queries(dashboard())
    records = [{"record": f"gpuledger:board_query_{i}", "expr": q} for i, (_, q) in enumerate(queries)]
    path = tmp_path / "board.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "board", "rules": records}]}))
    done = run(promtool, "check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(records)} rules found" in done.stdout


def test_promtool_checks_the_prometheusrule_of_the_component(promtool: Path, tmp_path: Path) -> None:
    path = tmp_path / "component.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": component_rule_groups()}))
    done = run(promtool, "check", "rules", "--lint=all", "--lint-fatal", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
