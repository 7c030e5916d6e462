"""Dashboards, alert rules and scrape configs refer only to metrics and labels that shared/metrics.py defines."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from stitchcuda.shared import metrics

from .support import (
    MONITORING,
    ROOT,
    PromQLError,
    grafana_query_metrics,
    load_yaml,
    load_yaml_docs,
    promql_grouping_labels,
    promql_matchers,
    promql_metric_names,
    promql_selectors,
)

DASHBOARD_PATH = MONITORING / "grafana" / "dashboards" / "stitchcuda.json"
DASHBOARD: dict[str, Any] = json.loads(DASHBOARD_PATH.read_text())
ALERTS = load_yaml(MONITORING / "alerts.yml")
COMPOSE = load_yaml(ROOT / "docker-compose.yml")

# Series that come from Prometheus itself rather than from our services.
EXTERNAL = {"up"}
TARGET_LABELS = {"job", "instance"}


def known_series() -> set[str]:
    return set(metrics.exposed_series()) | EXTERNAL


def labels_of(series: str) -> set[str]:
    """Label names a series can carry: its spec's labels, `le` on buckets, the scrape target's labels."""
    for spec in metrics.SPECS:
        if series in spec.series():
            extra = {"le"} if series.endswith("_bucket") else set()
            return set(spec.labels) | extra | TARGET_LABELS
    return TARGET_LABELS


def closed_values_of(series: str) -> dict[str, frozenset[str]]:
    for spec in metrics.SPECS:
        if series in spec.series():
            return spec.closed_values()
    return {}


def check_matched_values(expr: str, where: str) -> None:
    """A matcher on a label with a closed set of values must match one of them, or it selects nothing."""
    for series, label, op, value in promql_matchers(expr):
        allowed = closed_values_of(series).get(label)
        if allowed is None or op in ("!=", "!~") or "$" in value:  # a Grafana variable: any value
            continue
        matched = [v for v in allowed if (v == value if op == "=" else re.fullmatch(value, v))]
        assert matched, (
            f"{where}: {series}{{{label}{op}{value!r}}} matches none of {sorted(allowed)}, so it stays empty"
        )


def check_expr(expr: str, where: str) -> set[str]:
    names = promql_metric_names(expr)
    unknown = names - known_series()
    assert not unknown, f"{where}: {expr!r} uses metrics not defined in shared/metrics.py: {sorted(unknown)}"
    for series, matched in promql_selectors(expr):
        assert matched <= labels_of(series), (
            f"{where}: {series} has no label(s) {sorted(matched - labels_of(series))}"
        )
    available = set().union(*(labels_of(n) for n in names)) if names else set()
    grouping = promql_grouping_labels(expr)
    assert grouping <= available, f"{where}: grouping by unknown label(s) {sorted(grouping - available)}"
    check_matched_values(expr, where)
    return names


# -- the PromQL reader itself -----------------------------------------------------------------------


def test_promql_reader_finds_metrics_and_ignores_labels_functions_and_variables() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, stage) (rate(stitch_stage_seconds_bucket{stage=~"a|b(",x="}"}'
        "[$__rate_interval]))) / on() group_left sum(up offset 5m) > 1e-3 and absent(foo:bar)"
    )
    assert promql_metric_names(expr) == {"stitch_stage_seconds_bucket", "up", "foo:bar"}
    assert promql_grouping_labels(expr) == {"le", "stage"}
    assert promql_selectors(expr)[0] == ("stitch_stage_seconds_bucket", {"stage", "x"})
    assert promql_matchers(expr) == [
        ("stitch_stage_seconds_bucket", "stage", "=~", "a|b("),
        ("stitch_stage_seconds_bucket", "x", "=", "}"),
    ]
    assert grafana_query_metrics("label_values(stitch_jobs_submitted_total, tenant)") == {
        "stitch_jobs_submitted_total"
    }


def test_promql_reader_rejects_typos_and_broken_brackets() -> None:
    with pytest.raises(PromQLError, match="unknown PromQL function"):
        promql_metric_names("hisogram_quantile(0.5, x_bucket)")
    with pytest.raises(PromQLError, match=r"unbalanced|unclosed"):
        promql_metric_names("sum(rate(x[5m])")
    with pytest.raises(AssertionError, match=r"not defined in shared/metrics\.py"):
        check_expr("sum(rate(stitch_jobs_submited_total[5m]))", "self-test")
    with pytest.raises(AssertionError, match="no label"):
        check_expr('sum(rate(stitch_gpu_seconds_total{tennant="a"}[5m]))', "self-test")
    with pytest.raises(AssertionError, match="grouping by unknown"):
        check_expr("sum by (stage) (rate(stitch_verdicts_total[5m]))", "self-test")
    with pytest.raises(AssertionError, match="matches none of"):
        check_expr('sum(rate(stitch_tasks_total{outcome="error"}[5m]))', "self-test")
    with pytest.raises(AssertionError, match="matches none of"):
        check_expr('sum(rate(stitch_verdicts_total{device=~"gpu|tpu"}[5m]))', "self-test")
    check_expr('sum(rate(stitch_verdicts_total{device=~"cu.*",accepted!="maybe"}[5m]))', "self-test")


# -- Grafana ----------------------------------------------------------------------------------------


def panels() -> list[dict[str, Any]]:
    out = []
    for p in DASHBOARD["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def test_dashboard_is_well_formed() -> None:
    assert DASHBOARD["uid"] == "stitchcuda-overview" and DASHBOARD["title"]
    assert isinstance(DASHBOARD["schemaVersion"], int)
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in panels():
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_every_panel_queries_known_metrics_through_the_datasource_variable() -> None:
    variables = {v["name"] for v in DASHBOARD["templating"]["list"]}
    for p in panels():
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            check_expr(t["expr"], f"panel {p['title']!r}")
            for var in re.findall(r"\$\{?(\w+)\}?", t["expr"]):
                assert var.startswith("__") or var in variables, f"{p['title']}: undefined ${var}"


def test_template_variables_query_known_metrics() -> None:
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            assert grafana_query_metrics(query) <= known_series(), var["name"]


def test_dashboard_covers_what_operators_need() -> None:
    used: set[str] = set()
    for p in panels():
        for t in p.get("targets", []):
            used |= promql_metric_names(t["expr"])
    required = {
        "stitch_jobs_finished_total",  # job throughput
        "stitch_verdicts_total",  # accepted / rejected by reason
        "stitch_speedup_vs_eager_bucket",  # speedup distribution
        "stitch_stage_seconds_bucket",  # stage latencies
        "stitch_build_cache_total",  # compile-cache hit ratio
        "stitch_queue_depth",  # queue depths
        "stitch_llm_tokens_total",  # LLM tokens
        "stitch_gpu_seconds_total",  # GPU-seconds per tenant
    }
    assert required <= used, f"missing panels for {sorted(required - used)}"
    exprs = " ".join(t["expr"] for p in panels() for t in p.get("targets", []))
    assert "by (reason_rule)" in exprs and "by (tenant)" in exprs
    assert re.search(
        r"histogram_quantile\(0\.9\d?, sum by \(le\) \(rate\(stitch_speedup_vs_eager_bucket", exprs
    )


def test_grafana_provisioning_points_at_compose_prometheus_and_the_dashboard_folder() -> None:
    (ds,) = load_yaml(MONITORING / "grafana/provisioning/datasources/prometheus.yml")["datasources"]
    assert ds["type"] == "prometheus" and ds["uid"] == "prometheus"
    assert ds["url"] == "http://prometheus:9090" and "prometheus" in COMPOSE["services"]
    (provider,) = load_yaml(MONITORING / "grafana/provisioning/dashboards/stitchcuda.yml")["providers"]
    mount = next(v for v in COMPOSE["services"]["grafana"]["volumes"] if "dashboards:" in v)
    host, container = mount.split(":")[:2]
    assert provider["options"]["path"] == container
    assert (ROOT / host / DASHBOARD_PATH.name).is_file()
    # The dashboard's datasource variable defaults to the provisioned uid.
    ds_var = next(v for v in DASHBOARD["templating"]["list"] if v["type"] == "datasource")
    assert ds_var["current"]["value"] == ds["uid"]


# -- alert rules ------------------------------------------------------------------------------------


def rules() -> list[dict[str, Any]]:
    return [r for g in ALERTS["groups"] for r in g["rules"]]


def test_alert_rules_are_complete_and_use_known_metrics() -> None:
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names))
    for rule in rules():
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        check_expr(rule["expr"], f"alert {rule['alert']}")
    covered = set().union(*(promql_metric_names(r["expr"]) for r in rules()))
    assert {"up", "stitch_queue_depth", "stitch_verdicts_total", "stitch_jobs_finished_total"} <= covered


def test_prometheus_rule_for_the_operator_equals_the_compose_rule_file() -> None:
    (doc,) = load_yaml_docs(MONITORING / "prometheusrule.yaml")
    assert doc["kind"] == "PrometheusRule"
    assert doc["spec"]["groups"] == ALERTS["groups"], "prometheusrule.yaml drifted from alerts.yml"


# -- scrape configuration ---------------------------------------------------------------------------


def test_compose_prometheus_scrapes_every_service_on_its_metrics_port() -> None:
    config = load_yaml(MONITORING / "prometheus.yml")
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    services = COMPOSE["services"]
    jobs = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            for name in sd["names"]:
                assert name in services, f"{job['job_name']} scrapes unknown service {name}"
                jobs[job["job_name"]] = (name, sd["port"])
    ours = {n for n, s in services.items() if "build" in s}
    for name in ours:
        job = f"stitchcuda-{name}"
        assert job in jobs, f"{name} is not scraped"
        port = 8080 if name == "gateway" else int(services[name]["environment"]["STITCH_METRICS_PORT"])
        assert jobs[job] == (name, port), job
    # The alert that watches targets covers exactly these jobs.
    down = next(r for r in rules() if r["alert"] == "StitchServiceDown")
    pattern = re.search(r'job=~"([^"]+)"', down["expr"])
    assert pattern
    assert {j for j in jobs if re.fullmatch(pattern.group(1), j)} == {f"stitchcuda-{n}" for n in ours}
