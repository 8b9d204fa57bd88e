"""deploy/monitoring: the Grafana board and the alert rules read only what the services export.

promtool itself (check rules, the alert tests, the board's queries) runs in tests/monitoring.
"""

from __future__ import annotations

import itertools
from typing import Any

import kubernetes_validate
import pytest
import yaml

from .kustomize import merge
from .manifests import named, rendered
from .monitoring import (
    COMPONENT,
    NATS_EXPORTER_SERIES,
    RULE_TESTS,
    Checker,
    Known,
    alerts,
    board_queries,
    component_rule_groups,
    dashboard,
    data_panels,
    exported,
    podmonitors,
    rules,
    target_labels,
)
from .services import DEPLOY

DOCS = DEPLOY.parent / "docs" / "monitoring.md"


# --- the checker itself -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("gpuledger_no_such_series", "no service exports the series gpuledger_no_such_series"),
        ("gpuledger_model_cards_total", "no service exports"),  # a gauge has no _total
        ('gpuledger_model_cards{node="n1"}', "gpuledger_model_cards has no label node"),
        ("sum by (uuid) (gpuledger_inventory_cards)", "sum by: no label uuid"),
        ("sum by (node) (sum by (model) (gpuledger_inventory_card_healthy))", "sum by: no label node"),
        (
            "histogram_quantile(0.9, sum by (verb) (rate(gpuledger_placement_extender_seconds_bucket[5m])))",
            "no label le",
        ),
        ("gpuledger_nodes / on (model) gpuledger_model_cards", "on (left): no label model"),
        (
            "gpuledger_plugin_devices * on (node) group_left (verb) gpuledger_inventory_cards",
            "group_left: no label verb",
        ),
    ],
)
def test_the_checker_reports_what_no_service_exports(query: str, problem: str) -> None:
    problems = Checker(Known.everything()).check(query)
    assert any(problem in p for p in problems), problems


def test_the_checker_follows_labels_through_functions_and_matching() -> None:
    queries = [
        "histogram_quantile(0.9, sum by (le, verb) "
        '(rate(gpuledger_placement_extender_seconds_bucket{verb="bind"}[5m])))',
        "max by (node) (gpuledger_inventory_nvml_up) * on (node) group_left (model) gpuledger_inventory_card_healthy",
        'sum by (dst) (label_replace(gpuledger_inventory_cards, "dst", "$1", "node", "(.*)"))',
        "sum without (uuid) (gpuledger_inventory_card_processes) > 0",
    ]
    for query in queries:
        assert Checker(Known.everything()).check(query) == [], query


def test_histograms_and_counters_have_the_suffixes_prometheus_sees() -> None:
    found = exported()
    assert found["gpuledger_placement_extender_seconds_bucket"].labels == {"verb", "le"}
    assert found["gpuledger_placement_extender_seconds_count"].labels == {"verb"}
    assert found["gpuledger_ledger_cas_attempts_total"].jobs == {
        "gpuledger-allocator",
        "gpuledger-placement",
        "gpuledger-node",
    }
    assert "gpuledger_model_cards" in found  # the allocator's scrape-time gauges
    assert "gpuledger_placement_decisions" not in found


# --- every series and label the board and the rules read ----------------------------------------


@pytest.mark.parametrize(("title", "query"), board_queries(dashboard()))
def test_every_board_query_reads_exported_series_and_labels(title: str, query: str) -> None:
    assert Checker(Known.everything()).check(query) == [], title


@pytest.mark.parametrize("name", sorted(alerts()))
def test_every_alert_reads_exported_series_and_labels(name: str) -> None:
    assert Checker(Known.everything()).check(alerts()[name]["expr"]) == []


def test_no_metric_label_is_renamed_by_a_target_label() -> None:
    """Prometheus renames a metric's label that a target label also sets (to exported_<name>)."""
    targets = target_labels()
    for name, series in exported().items():
        for job in series.jobs:
            assert not series.labels & targets[job], f"{name}: {series.labels & targets[job]} set by the scrape too"


def test_the_nats_exporter_series_come_from_the_component() -> None:
    monitor = podmonitors()["gpuledger-nats"]
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    patch = yaml.safe_load((DEPLOY / "kubernetes/components/monitoring/nats-exporter.yaml").read_text())
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 7777}
    assert "-port=7777" in container["args"]
    assert any(a.startswith("-jsz=") for a in container["args"])
    assert NATS_EXPORTER_SERIES


# --- the board ------------------------------------------------------------------------------------


def test_the_board_is_grafana_json_with_a_datasource_variable() -> None:
    board = dashboard()
    assert isinstance(board["schemaVersion"], int)
    assert board["schemaVersion"] >= 36
    assert board["uid"]
    assert board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "node"} <= variables.keys()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("panel", data_panels(dashboard()), ids=lambda p: p["title"])
def test_every_panel_has_a_title_a_unit_a_description_and_the_datasource_variable(panel: dict[str, Any]) -> None:
    assert panel["title"].strip()
    assert panel["description"].strip()
    assert panel["fieldConfig"]["defaults"]["unit"]
    assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert panel["targets"]
    for target in panel["targets"]:
        assert target["datasource"]["uid"] == "${datasource}"
        assert target["legendFormat"]
    assert [t["refId"] for t in panel["targets"]] == [chr(ord("A") + i) for i in range(len(panel["targets"]))]


def _cells(panel: dict[str, Any]) -> set[tuple[int, int]]:
    g = panel["gridPos"]
    return {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}


def test_no_two_panels_overlap_and_all_fit_the_grid() -> None:
    panels = dashboard()["panels"]
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] >= 0, panel["title"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        assert g["h"] > 0, panel["title"]
    for a, b in itertools.combinations(panels, 2):
        assert not _cells(a) & _cells(b), f"{a['title']!r} overlaps {b['title']!r}"


def test_the_board_follows_the_namespace_and_node_variables() -> None:
    """Every selector of a gpuledger series is narrowed to the chosen namespace, and per-node series to the nodes."""
    node_jobs = {"gpuledger-node"}
    series = exported()
    for panel in data_panels(dashboard()):
        for target in panel["targets"]:
            checker = Checker(Known.everything())
            checker.check(target["expr"].replace("$__rate_interval", "5m"))
            assert 'namespace=~"$namespace"' in target["expr"], panel["title"]
            if any(series[n].jobs <= node_jobs for n in checker.read if n in series):
                assert 'node=~"$node"' in target["expr"], panel["title"]


# --- the rules --------------------------------------------------------------------------------


def test_the_rules_cover_what_the_issue_asks() -> None:
    assert {
        "GpuledgerCardUnhealthy",
        "GpuledgerCardRetired",
        "GpuledgerShareOverGrant",
        "GpuledgerLedgerUnreachable",
        "GpuledgerPlacementRefusing",
        "GpuledgerNatsNoMetaLeader",
    } <= alerts().keys()


@pytest.mark.parametrize("name", sorted(alerts()))
def test_every_alert_has_a_severity_a_summary_a_runbook_and_its_docs(name: str) -> None:
    rule = alerts()[name]
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert {"summary", "description", "runbook"} <= rule["annotations"].keys()
    assert f"`{name}`" in DOCS.read_text(), f"docs/monitoring.md does not explain {name}"


@pytest.mark.parametrize("name", sorted(alerts()))
def test_every_alert_has_a_promtool_test_where_it_fires_and_one_where_it_stays_quiet(name: str) -> None:
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    mine = [c for c in cases if c["alertname"] == name]
    assert any(c["exp_alerts"] for c in mine), f"no test where {name} fires"
    assert any(not c["exp_alerts"] for c in mine), f"no test where {name} stays quiet"


def test_the_prometheusrule_of_the_component_holds_the_rules_file() -> None:
    assert component_rule_groups() == rules()["groups"]


# --- the kustomize component -----------------------------------------------------------------


def test_the_component_lists_every_file_beside_it() -> None:
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    listed = {*component["resources"], *(p["path"] for p in component["patches"])}
    assert listed == {p.name for p in COMPONENT.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize("version", ["1.30", "1.36"])
def test_the_component_keeps_nats_and_its_policy_valid(version: str) -> None:
    """The exporter patched into the production NATS StatefulSet, and the NetworkPolicy for its port."""
    nats = named(rendered("overlays/production"), "StatefulSet", "gpuledger-nats")
    merge(nats, yaml.safe_load((COMPONENT / "nats-exporter.yaml").read_text()))
    names = [c["name"] for c in nats["spec"]["template"]["spec"]["containers"]]
    assert sorted(names) == ["nats", "nats-exporter"]
    kubernetes_validate.validate(nats, version, strict=True)
    policy = yaml.safe_load((COMPONENT / "network.yaml").read_text())
    kubernetes_validate.validate(policy, version, strict=True)
    assert policy["spec"]["podSelector"]["matchLabels"] == nats["spec"]["selector"]["matchLabels"]


def test_the_podmonitors_select_the_pods_and_ports_that_serve_metrics() -> None:
    objects = rendered("overlays/production")
    workloads = {
        "gpuledger-allocator": "Deployment",
        "gpuledger-placement": "Deployment",
        "gpuledger-node": "DaemonSet",
    }
    for name, kind in workloads.items():
        monitor = podmonitors()[name]
        template = named(objects, kind, name)["spec"]["template"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items(), name
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", ())}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in ports, name
            assert endpoint["path"] == "/metrics"
