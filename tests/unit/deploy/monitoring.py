"""What the monitoring files ask of Prometheus, against the series gpuledger's services export.

A series is known with its labels: the metric's own (read from the prometheus_client objects each
service's metrics modules define, with the suffixes the client adds) and the target labels the
scrape adds (the Prometheus Operator's, and the relabelings of the monitoring component's
PodMonitors). PromQL is parsed with promql-parser; each expression's result labels are followed
through selectors, functions, aggregations and vector matching, so that ``sum by (x)`` over a
series that has no ``x`` (or lost it in an inner aggregation) is reported like a missing series.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser as pp
import yaml
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase

from gpuledger_allocator.metrics import LedgerMetrics
from gpuledger_allocator.view import ClusterView

from .services import DEPLOY

MONITORING = DEPLOY / "monitoring"
RULES = MONITORING / "gpuledger-alerts.yaml"
RULE_TESTS = MONITORING / "gpuledger-alerts.test.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
COMPONENT = DEPLOY / "kubernetes" / "components" / "monitoring"

# The scrape jobs (the component's PodMonitors) and the modules whose metrics each one's pods serve.
JOB_MODULES = {
    "gpuledger-allocator": ("gpuledger_common.metrics", "gpuledger_allocator.metrics"),
    "gpuledger-placement": ("gpuledger_common.metrics", "gpuledger_placement.metrics"),
    "gpuledger-node": (
        "gpuledger_common.metrics",
        "gpuledger_inventory.metrics",
        "gpuledger_plugin.metrics",
        "gpuledger_plugin.dra.metrics",
    ),
}
# Target labels the Prometheus Operator gives every PodMonitor target.
OPERATOR_TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "container", "endpoint"})
# prometheus-nats-exporter 0.20.1 (collector/jsz.go, serverLabels), run by the component beside
# each NATS server with -jsz=streams: the server gauges the board and the rules read.
NATS_EXPORTER_LABELS = frozenset({"server_id", "server_name", "cluster", "domain", "meta_leader", "is_meta_leader"})
NATS_EXPORTER_SERIES = (
    "jetstream_server_jetstream_disabled",
    "jetstream_server_total_message_bytes",
    "jetstream_server_max_storage",
)
SUFFIXES = {
    "counter": (("_total", frozenset()),),
    "gauge": (("", frozenset()),),
    "histogram": (("_bucket", frozenset({"le"})), ("_count", frozenset()), ("_sum", frozenset())),
    "summary": (("_count", frozenset()), ("_sum", frozenset())),
}
# Grafana's variables, as a query holds them, and what stands for them when it is parsed.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "6h"}


@dataclass(frozen=True, slots=True)
class Series:
    labels: frozenset[str]  # its own labels
    jobs: frozenset[str]  # the scrape jobs whose targets serve it


class _NoStore:
    def remember(self, *_: Any) -> None:
        pass


def _module_series(module_name: str) -> dict[str, frozenset[str]]:
    found: dict[str, frozenset[str]] = {}
    for value in vars(importlib.import_module(module_name)).values():
        if isinstance(value, MetricWrapperBase):
            (described,) = value.describe()
            for suffix, extra in SUFFIXES[described.type]:
                found[described.name + suffix] = frozenset(value._labelnames) | extra
    return found


def _ledger_gauges() -> dict[str, frozenset[str]]:
    """The allocator's gauges made at scrape time from its view of the ledger."""
    view = ClusterView(_NoStore())  # type: ignore[arg-type]
    families = LedgerMetrics(view).families()
    return {f.name: frozenset(f._labelnames) for f in families if isinstance(f, GaugeMetricFamily)}


def exported() -> dict[str, Series]:
    """Every series gpuledger's pods serve, with its own labels and the jobs that scrape it."""
    own: dict[str, frozenset[str]] = {}
    jobs: dict[str, set[str]] = {}
    for job, modules in JOB_MODULES.items():
        served = {name: labels for module in modules for name, labels in _module_series(module).items()}
        if job == "gpuledger-allocator":
            served.update(_ledger_gauges())
        for name, labels in served.items():
            assert own.setdefault(name, labels) == labels, f"{name} is defined twice with different labels"
            jobs.setdefault(name, set()).add(job)
    return {name: Series(own[name], frozenset(jobs[name])) for name in own}


def podmonitors() -> dict[str, dict[str, Any]]:
    path = COMPONENT / "podmonitors.yaml"
    return {o["metadata"]["name"]: o for o in yaml.safe_load_all(path.read_text()) if o}


def target_labels() -> dict[str, frozenset[str]]:
    """Per job (PodMonitor): the labels every one of its targets gets from the scrape."""
    found: dict[str, frozenset[str]] = {}
    for name, monitor in podmonitors().items():
        per_endpoint = [
            OPERATOR_TARGET_LABELS | {r["targetLabel"] for r in endpoint.get("relabelings", ())}
            for endpoint in monitor["spec"]["podMetricsEndpoints"]
        ]
        found[name] = frozenset.intersection(*per_endpoint)
    return found


@dataclass(frozen=True, slots=True)
class Known:
    """Each series a query may read, with every label it has once scraped."""

    series: dict[str, frozenset[str]]

    @classmethod
    def everything(cls) -> Known:
        targets = target_labels()
        series = {
            name: found.labels | frozenset.intersection(*(targets[job] for job in found.jobs))
            for name, found in exported().items()
        }
        series.update(dict.fromkeys(NATS_EXPORTER_SERIES, NATS_EXPORTER_LABELS | targets["gpuledger-nats"]))
        series["up"] = frozenset.intersection(*targets.values())  # Prometheus's own, per target
        return cls(series)


@dataclass(frozen=True, slots=True)
class _Result:
    labels: frozenset[str]
    scalar: bool = False


@dataclass
class Checker:
    """Follows one expression's labels; what does not hold is added to ``problems``."""

    known: Known
    problems: list[str] = field(default_factory=list)
    read: set[str] = field(default_factory=set)

    def check(self, query: str) -> list[str]:
        self.problems = []
        self.walk(pp.parse(query))
        return self.problems

    def walk(self, expr: pp.Expr) -> _Result:
        if isinstance(expr, pp.VectorSelector):
            return self.selector(expr)
        if isinstance(expr, pp.MatrixSelector):
            return self.selector(expr.vector_selector)
        if isinstance(expr, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
            return self.walk(expr.expr)
        if isinstance(expr, pp.NumberLiteral):
            return _Result(frozenset(), scalar=True)
        if isinstance(expr, pp.StringLiteral):
            return _Result(frozenset(), scalar=True)
        if isinstance(expr, pp.Call):
            return self.call(expr)
        if isinstance(expr, pp.AggregateExpr):
            return self.aggregate(expr)
        if isinstance(expr, pp.BinaryExpr):
            return self.binary(expr)
        raise TypeError(f"no rule for {type(expr).__name__}")

    def selector(self, selector: pp.VectorSelector) -> _Result:
        matchers = selector.matchers.matchers
        name = selector.name or next((m.value for m in matchers if m.name == "__name__"), None)
        if name is None or name not in self.known.series:
            self.problems.append(f"no service exports the series {name}")
            return _Result(frozenset())
        self.read.add(name)
        labels = self.known.series[name]
        for matcher in matchers:
            if matcher.name != "__name__" and matcher.name not in labels:
                self.problems.append(f"{name} has no label {matcher.name} (it has {sorted(labels)})")
        return _Result(labels)

    def need(self, labels: list[str], having: frozenset[str], where: str) -> None:
        for label in labels:
            if label not in having:
                self.problems.append(f"{where}: no label {label} there (only {sorted(having)})")

    def call(self, call: pp.Call) -> _Result:
        name = call.func.name
        args = [self.walk(a) if isinstance(a, pp.Expr) else _Result(frozenset(), True) for a in call.args]
        vectors = [a for a in args if not a.scalar]
        inner = vectors[0].labels if vectors else frozenset()
        if name in ("label_replace", "label_join"):
            given = call.args[3:4] if name == "label_replace" else call.args[3:]  # label_replace's last: a regex
            sources = [str(a.val) for a in given if isinstance(a, pp.StringLiteral)]
            self.need([s for s in sources if s], inner, name)
            return _Result(inner | {str(call.args[1].val)})
        if name == "histogram_quantile":
            self.need(["le"], inner, name)
            return _Result(inner - {"le"})
        if name in ("absent", "absent_over_time", "vector"):
            return _Result(frozenset())
        if name in ("scalar", "time", "pi"):
            return _Result(frozenset(), scalar=True)
        return _Result(inner)

    def aggregate(self, agg: pp.AggregateExpr) -> _Result:
        inner = self.walk(agg.expr).labels
        if isinstance(agg.param, pp.Expr):
            self.walk(agg.param)
        op = str(agg.op)
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            return _Result(inner)
        modifier = agg.modifier
        if modifier is None:
            found: frozenset[str] = frozenset()
        elif modifier.type == pp.AggModifierType.By:
            self.need(modifier.labels, inner, f"{op} by")
            found = frozenset(modifier.labels)
        else:
            found = inner - set(modifier.labels)
        if op == "count_values" and isinstance(agg.param, pp.StringLiteral):
            found |= {str(agg.param.val)}
        return _Result(found)

    def binary(self, binary: pp.BinaryExpr) -> _Result:
        lhs, rhs = self.walk(binary.lhs), self.walk(binary.rhs)
        if lhs.scalar or rhs.scalar:
            return _Result(rhs.labels if lhs.scalar else lhs.labels, scalar=lhs.scalar and rhs.scalar)
        op, modifier = str(binary.op), binary.modifier
        matching = modifier.matching if modifier is not None else None
        if matching is not None and matching.type == pp.LabelModifierType.Include:
            self.need(matching.labels, lhs.labels, f"{op} on (left)")
            self.need(matching.labels, rhs.labels, f"{op} on (right)")
        if op in ("and", "unless"):
            return _Result(lhs.labels)
        if op == "or":
            return _Result(lhs.labels | rhs.labels)
        card = modifier.card if modifier is not None else pp.VectorMatchCardinality.OneToOne
        group = list(modifier.group_labels or ()) if modifier is not None else []
        if card == pp.VectorMatchCardinality.ManyToOne:
            self.need(group, rhs.labels, f"{op} group_left")
            return _Result(lhs.labels | set(group))
        if card == pp.VectorMatchCardinality.OneToMany:
            self.need(group, lhs.labels, f"{op} group_right")
            return _Result(rhs.labels | set(group))
        if matching is None:
            return _Result(lhs.labels)
        if matching.type == pp.LabelModifierType.Include:
            return _Result(frozenset(matching.labels))
        return _Result(lhs.labels - set(matching.labels))


def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return loaded


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rules()["groups"] for r in g["rules"] if "alert" in r}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def data_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def for_prometheus(query: str) -> str:
    """A board query as Prometheus gets it: Grafana's variables replaced by what stands for them."""
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    for variable in ("$namespace", "$node"):
        query = query.replace(variable, ".*")
    assert "$" not in query.replace("$labels", ""), f"a variable left in {query}"
    return query


def board_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, query as Prometheus gets it) for every target and query variable of the board."""
    found = [(p["title"], for_prometheus(t["expr"])) for p in data_panels(board) for t in p["targets"]]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            inner = variable["query"]["query"].removeprefix("label_values(").removesuffix(")")
            series, _, label = inner.rpartition(",")
            found.append((f"variable {variable['name']}", for_prometheus(f"count by ({label.strip()}) ({series})")))
    return found


def component_rule_groups(path: Path | None = None) -> Any:
    rule = yaml.safe_load((path or COMPONENT / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    return rule["spec"]["groups"]
