"""docs/prometheus/awa-alerts.yml evaluated by Prometheus's own engine
(`promtool test rules`): each alert fires on the series that should raise
it, with its labels and rendered annotations, and stays quiet on the near
misses beside them. Every case runs twice: behind one exporter of the
database, and behind two (an admin server's /metrics beside `awa metrics
serve`), where each database series comes once per target and must still
raise one alert, not two."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.support.dashboard import ALERTS, DASHBOARD, dashboard_queries

EXPORTERS = ("db-a:9187", "db-b:9187")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: apt-get install prometheus "
                    "(scripts/system-deps.sh test does)")
    return found


@dataclass
class Case:
    """One scenario. ``database`` series are an exporter's reads of the
    database, given once per exporter; ``own`` series belong to one process
    and carry its instance. ``expect`` gives, at each minute checked, the
    label sets each alert fires with: every alert not named is checked to
    be silent then. Each exporter reports ``awa_up 1`` unless ``up`` says
    otherwise."""
    name: str
    expect: dict[int, dict[str, list[dict[str, str]]]]
    database: dict[str, str] = field(default_factory=dict)
    own: dict[str, str] = field(default_factory=dict)
    up: bool = True
    value: str = ""  # what {{ $value | humanizePercentage }} renders to


CASES = [
    Case("an exporter that cannot read the database",
         own={'awa_up{instance="db-a:9187",job="awa"}': "1 1 1 0x10",
              'awa_up{instance="db-b:9187",job="awa"}': "1x12"},
         up=False,
         expect={4: {}, 6: {"AwaExporterDown": [{"instance": "db-a:9187", "job": "awa"}]}}),
    Case("no exporter scraped at all",
         own={'awa_maintain_errors_total{instance="m:9",task="promote"}': "0x10"},
         up=False,
         expect={1: {}, 3: {"AwaExporterDown": [{}]}}),
    Case("a queue waits, a paused one waits on purpose, one keeps up",
         database={'awa_queue_lag_seconds{queue="slow"}': "400x80",
                   'awa_queue_paused{queue="slow"}': "0x80",
                   'awa_queue_lag_seconds{queue="held"}': "400x80",
                   'awa_queue_paused{queue="held"}': "1x80",
                   'awa_queue_lag_seconds{queue="fine"}': "200x80",
                   'awa_queue_paused{queue="fine"}': "0x80"},
         expect={4: {}, 6: {"AwaQueueLagHigh": [{"queue": "slow"}]},
                 70: {"AwaQueueLagHigh": [{"queue": "slow"}]}}),
    Case("a pause forgotten for an hour",
         database={'awa_queue_lag_seconds{queue="held"}': "0+60x80",
                   'awa_queue_paused{queue="held"}': "1x80",
                   'awa_queue_lag_seconds{queue="late"}': "0+60x80",
                   'awa_queue_paused{queue="late"}': "0x80"},
         expect={64: {"AwaQueueLagHigh": [{"queue": "late"}]},
                 67: {"AwaQueueLagHigh": [{"queue": "late"}],
                      "AwaQueuePausedWithBacklog": [{"queue": "held"}]}}),
    Case("a backlog that grows, one that bursts and drains, a paused one, a quick one",
         database={'awa_queue_depth{queue="growing"}': "0+10x60",
                   'awa_queue_lag_seconds{queue="growing"}': "120x60",
                   'awa_queue_paused{queue="growing"}': "0x60",
                   'awa_queue_depth{queue="burst"}': "0+100x20 2000-100x20 0x20",
                   'awa_queue_lag_seconds{queue="burst"}': "120x60",
                   'awa_queue_paused{queue="burst"}': "0x60",
                   'awa_queue_depth{queue="held"}': "0+10x60",
                   'awa_queue_lag_seconds{queue="held"}': "120x60",
                   'awa_queue_paused{queue="held"}': "1x60",
                   'awa_queue_depth{queue="quick"}': "0+10x60",
                   'awa_queue_lag_seconds{queue="quick"}': "5x60",
                   'awa_queue_paused{queue="quick"}': "0x60"},
         expect={45: {"AwaBacklogGrowing": [{"queue": "growing"}]}}),
    Case("a backlog grown for 15 minutes: a new queue, and one seen again after a gap",
         database={'awa_queue_depth{queue="new"}': "_x30 0+10x50",
                   'awa_queue_lag_seconds{queue="new"}': "_x30 120x50",
                   'awa_queue_paused{queue="new"}': "_x30 0x50",
                   'awa_queue_depth{queue="gap"}': "0+10x10 _x20 300+10x50",
                   'awa_queue_lag_seconds{queue="gap"}': "120x10 _x20 120x50",
                   'awa_queue_paused{queue="gap"}': "0x10 _x20 0x50"},
         # A slope from minute 31 (new) and 32 (gap) on: 27 minutes of them at
         # 57 and 58, then 5 more for `for`. The edge is pinned, so that a
         # count reached a few minutes later fails (31: promtool 2.42 counts
         # 31 steps in 30 minutes, Prometheus 3 only 30, and never fires).
         expect={45: {}, 61: {}, 62: {"AwaBacklogGrowing": [{"queue": "new"}]},
                 63: {"AwaBacklogGrowing": [{"queue": "gap"}, {"queue": "new"}]}}),
    Case("jobs failing for good, attempts retried, a queue with no attempt",
         database={'awa_queue_finished_total{queue="broken",state="failed"}': "0x10 1x30",
                   'awa_queue_finished_total{queue="broken",state="completed"}': "0+10x40",
                   'awa_queue_retried_total{queue="broken"}': "0x40",
                   'awa_queue_finished_total{queue="flaky",state="failed"}': "0x40",
                   'awa_queue_finished_total{queue="flaky",state="completed"}': "0+10x40",
                   'awa_queue_retried_total{queue="flaky"}': "0+2x40",
                   'awa_queue_finished_total{queue="mostly",state="failed"}': "0x40",
                   'awa_queue_finished_total{queue="mostly",state="completed"}': "0+10x40",
                   'awa_queue_retried_total{queue="mostly"}': "0+1x40",
                   'awa_queue_finished_total{queue="idle",state="failed"}': "0x40",
                   'awa_queue_finished_total{queue="idle",state="completed"}': "0x40",
                   'awa_queue_retried_total{queue="idle"}': "0x40"},
         expect={20: {"AwaJobsFailing": [{"queue": "broken"}, {"queue": "flaky"}]},
                 35: {"AwaJobsFailing": [{"queue": "flaky"}]}}),
    Case("dead rows held back in one hot table",
         database={'awa_table_dead_tuples{table="ready"}': "2000000x30",
                   'awa_table_dead_tuples{table="running"}': "1000x30"},
         expect={14: {}, 16: {"AwaDeadRowsHeldBack": [{"table": "ready"}]}}),
    Case("the horizon held for 15 minutes, and held again after a gap in the scrapes",
         database={"awa_xmin_horizon_age_transactions": "200000x20 _x20 200000x10"},
         expect={14: {}, 16: {"AwaXminHorizonHeld": [{}]}, 50: {}}),
    Case("one maintenance task stopped, the others run",
         database={'awa_maintenance_last_run_timestamp_seconds{task="promote"}': "0+60x30",
                   'awa_maintenance_last_run_timestamp_seconds{task="prune"}': "60x30"},
         expect={15: {}, 17: {"AwaMaintenanceNotRunning": [{"task": "prune"}]}}),
    Case("a pass failing twice in each of two processes, another failing once",
         own={'awa_maintain_errors_total{instance="m1:9",task="prune"}': "0x4 1x4 2x20",
              'awa_maintain_errors_total{instance="m2:9",task="prune"}': "0x6 1x4 2x20",
              'awa_maintain_errors_total{instance="m1:9",task="carry"}': "0 1x30"},
         expect={8: {}, 12: {"AwaMaintenanceFailing": [{"task": "prune"}]}, 28: {}}),
    Case("one exporter's scrapes slow",
         own={'awa_scrape_duration_seconds{instance="db-a:9187",job="awa"}': "3x30",
              'awa_scrape_duration_seconds{instance="db-b:9187",job="awa"}': "0.1x30"},
         expect={14: {},
                 16: {"AwaScrapeSlow": [{"instance": "db-a:9187", "job": "awa"}]}}),
    Case("near the queue limit",
         database={"awa_queues": "900x30", "awa_queues_max": "1000x30"},
         expect={9: {}, 11: {"AwaQueueLimitNear": [{}]}}, value="90%"),
    Case("far from it",
         database={"awa_queues": "700x30", "awa_queues_max": "1000x30"},
         expect={20: {}}),
]


def rules() -> dict[str, dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule for group in doc["groups"] for rule in group["rules"]}


def with_labels(series: str, extra: dict[str, str]) -> str:
    name, _, labels = series.partition("{")
    inner = labels.rstrip("}")
    added = ",".join(f'{k}="{v}"' for k, v in extra.items())
    return f"{name}{{{','.join(x for x in (inner, added) if x)}}}"


def per_database(expr: str) -> str:
    """docs/observability.md's recipe for one Prometheus scraping several
    databases: a label of one's own per database (here ``database``) in
    every by and on list, and in max()."""
    return re.sub(r"\b(by|on) \(", r"\1 (database, ", expr).replace(
        "max(", "max by (database) (")


def render(template: str, labels: dict[str, str], value: str) -> str:
    out = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels[m.group(1)], template)
    out = re.sub(r"\{\{\s*\$value \| humanizePercentage\s*\}\}", value, out)
    assert "{{" not in out, f"a template this test cannot render: {template!r}"
    return out


def promtool_test(case: Case, exporters: tuple[str, ...], by_name: dict[str, dict],
                  databases: tuple[str, ...]) -> dict:
    """The case as one promtool test; each series once per database of
    ``databases`` with a ``database`` label (none for "")."""
    def own(d: str) -> dict[str, str]:
        return {"database": d} if d else {}

    series = [{"series": with_labels(s, {"instance": e, "job": "awa", **own(d)}), "values": v}
              for s, v in case.database.items() for e in exporters for d in databases]
    if case.up:
        series += [{"series": with_labels("awa_up", {"instance": e, "job": "awa", **own(d)}),
                    "values": "1x90"} for e in exporters for d in databases]
    series += [{"series": with_labels(s, own(d)), "values": v}
               for s, v in case.own.items() for d in databases]
    checks = [{"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": [
        {"exp_labels": {**labels, **own(d), **rule["labels"]},
         "exp_annotations": {k: render(v, labels, case.value)
                             for k, v in rule["annotations"].items()}}
        for labels in firing.get(alert, []) for d in databases]}
        for minute, firing in case.expect.items() for alert, rule in by_name.items()]
    return {"name": f"{case.name} ({len(exporters)} exporter(s), {len(databases)} database(s))",
            "interval": "1m", "input_series": series, "alert_rule_test": checks}


def run_promtool(tmp_path: Path, rule_file: Path, cases: list[Case],
                 databases: tuple[str, ...] = ("",)) -> subprocess.CompletedProcess:
    by_name = rules()
    tests = [promtool_test(case, exporters, by_name, databases)
             for case in cases for exporters in (EXPORTERS[:1], EXPORTERS)]
    test_file = tmp_path / "awa-alerts.test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [str(rule_file)],
                                         "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run([promtool(), "test", "rules", str(test_file)],
                          capture_output=True, text=True, timeout=120)


def test_the_rules_file_passes_promtools_check():
    result = subprocess.run([promtool(), "check", "rules", str(ALERTS)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_every_dashboard_query_is_promql_prometheus_accepts(tmp_path):
    """The dashboard's queries as recording rules, Grafana's variables given
    values, checked by the same parser Prometheus loads rules with."""
    grafana = {"$__rate_interval": "5m", "$queue": "emails"}
    exprs = [expr for _, expr in dashboard_queries(json.loads(DASHBOARD.read_text()))]
    recorded = []
    for i, expr in enumerate(exprs):
        for variable, value in grafana.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"a Grafana variable this test does not know: {expr!r}"
        recorded.append({"record": f"awa:panel_{i}", "expr": expr})
    rule_file = tmp_path / "dashboard.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    result = subprocess.run([promtool(), "check", "rules", str(rule_file)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_the_rules_with_a_database_label_fire_once_per_database(tmp_path):
    """One Prometheus, two databases, each behind two exporters with a label
    of its own: the rules as they ship merge the two databases' queues, the
    rules rewritten as docs/observability.md says fire once per database,
    with its label. (Not the case of no awa_up at all: absent() knows no
    database.)"""
    cases = [c for c in CASES if c.up or any(s.startswith("awa_up") for s in c.own)]
    databases = ("orders", "billing")
    shipped = run_promtool(tmp_path, ALERTS, cases, databases)
    assert shipped.returncode != 0
    assert 'database="billing"' in shipped.stdout + shipped.stderr
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = per_database(rule["expr"])
    rewritten = tmp_path / "per-database.yml"
    rewritten.write_text(yaml.safe_dump(doc))
    result = run_promtool(tmp_path, rewritten, cases, databases)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_case_that_fires_it():
    fired = {alert for case in CASES for firing in case.expect.values() for alert in firing}
    assert fired == set(rules())


def test_each_alert_fires_once_on_its_signal_behind_one_exporter_or_two(tmp_path):
    result = run_promtool(tmp_path, ALERTS, CASES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 1


@pytest.mark.parametrize(("alert", "old", "new"), [
    # Read per exporter, the lag fires twice behind two exporters.
    ("AwaQueueLagHigh", "max by (queue) (awa_queue_lag_seconds)", "awa_queue_lag_seconds"),
    # A paused queue would say "add workers".
    ("AwaQueueLagHigh", " unless on (queue) max by (queue) (awa_queue_paused) == 1", ""),
    # Summed, two exporters read 180% of the limit.
    ("AwaQueueLimitNear", "max(awa_queues / awa_queues_max)", "sum(awa_queues / awa_queues_max)"),
    # A burst that drains would fire.
    ("AwaBacklogGrowing", "min_over_time(", "max_over_time("),
    # A count of slopes that a minute more or less of data would change.
    ("AwaBacklogGrowing", ">= 27", ">= 31"),
    ("AwaBacklogGrowing", ">= 27", ">= 26"),
    # A new queue would fire on its first minutes of growth.
    ("AwaBacklogGrowing", "\n  and count_over_time(deriv(awa_queue_depth[5m])[30m:1m]) >= 27", ""),
    # One job failed for good is enough.
    ("AwaJobsFailing", ") > 0 or", ") > 1 or"),
])
def test_the_cases_catch_a_rule_gone_wrong(tmp_path, alert, old, new):
    doc = yaml.safe_load(ALERTS.read_text())
    [rule] = [r for group in doc["groups"] for r in group["rules"] if r["alert"] == alert]
    assert old in rule["expr"]
    rule["expr"] = rule["expr"].replace(old, new)
    mutated = tmp_path / "mutated.yml"
    mutated.write_text(yaml.safe_dump(doc))
    result = run_promtool(tmp_path, mutated, CASES)
    assert result.returncode != 0
    assert alert in result.stdout + result.stderr
