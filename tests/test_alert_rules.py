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
import shlex
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


def plain(queue: str) -> dict[str, str]:
    """The labels of a plain queue: its own logical queue."""
    return {"queue": queue, "logical_queue": queue}


def failing(*queues: str) -> dict[str, list[dict[str, str]]]:
    return {"AwaJobsFailing": [plain(queue) for queue in queues]}


def queue_series(queue: str, failed: str, completed: str, retried: str) -> dict[str, str]:
    """A queue's terminal and retry counters, as the exporter labels them."""
    labels = f'queue="{queue}",logical_queue="{queue}"'
    return {f'awa_queue_finished_total{{{labels},state="failed"}}': failed,
            f'awa_queue_finished_total{{{labels},state="completed"}}': completed,
            f"awa_queue_retried_total{{{labels}}}": retried}


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
         database={'awa_queue_lag_seconds{queue="held",logical_queue="held"}': "0+60x80",
                   'awa_queue_paused{queue="held",logical_queue="held"}': "1x80",
                   'awa_queue_lag_seconds{queue="late",logical_queue="late"}': "0+60x80",
                   'awa_queue_paused{queue="late",logical_queue="late"}': "0x80"},
         expect={64: {"AwaQueueLagHigh": [{"queue": "late"}]},
                 67: {"AwaQueueLagHigh": [{"queue": "late"}],
                      "AwaQueuePausedWithBacklog": [{"queue": "held",
                                                     "logical_queue": "held"}]}}),
    # A stripe's name is no name a command takes (22023): the commands in
    # the text name its logical queue (test_a_stripes_alerts_name_...).
    Case("a striped queue paused for an hour, a stripe's jobs failing",
         database={'awa_queue_lag_seconds{queue="orders#1",logical_queue="orders"}':
                   "0+60x80",
                   'awa_queue_paused{queue="orders#1",logical_queue="orders"}': "1x80",
                   'awa_queue_lag_seconds{queue="orders#0",logical_queue="orders"}': "0x80",
                   'awa_queue_paused{queue="orders#0",logical_queue="orders"}': "1x80",
                   'awa_queue_finished_total{queue="orders#1",logical_queue="orders",'
                   'state="failed"}': "0x10 1x70",
                   'awa_queue_finished_total{queue="orders#1",logical_queue="orders",'
                   'state="completed"}': "0x80",
                   'awa_queue_retried_total{queue="orders#1",logical_queue="orders"}': "0x80"},
         expect={20: {"AwaJobsFailing": [{"queue": "orders#1", "logical_queue": "orders"}]},
                 67: {"AwaQueuePausedWithBacklog": [{"queue": "orders#1",
                                                     "logical_queue": "orders"}]}}),
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
         database={**queue_series("broken", failed="0x10 1x30", completed="0+10x40",
                                  retried="0x40"),
                   **queue_series("flaky", failed="0x40", completed="0+10x40",
                                  retried="0+2x40"),
                   **queue_series("mostly", failed="0x40", completed="0+10x40",
                                  retried="0+1x40"),
                   **queue_series("idle", failed="0x40", completed="0x40", retried="0x40")},
         expect={20: failing("broken", "flaky"), 35: failing("flaky")}),
    # Backoff doubles up to an hour: a job that fails every attempt is
    # retried up to an hour apart, and most 15-minute windows hold no retry
    # (poison, from minute 40 on, fired 10 minutes in each 40). A retry long
    # past stops firing: once's, at minute 10, fires from 15 until the
    # 90-minute window lets it go at 99.
    Case("a job retried every 40 minutes for hours, one retried once",
         database={**queue_series("poison", failed="0x240", completed="0x240",
                                  retried="0x39 1x39 2x39 3x39 4x39 5x39"),
                   **queue_series("once", failed="0x240", completed="0x240",
                                  retried="0x9 1x230")},
         expect={14: {}, 39: failing("once"), 44: failing("once"),
                 **{minute: failing(*["once"] * (minute < 99), *["poison"] * (minute >= 45))
                    for minute in range(15, 240, 5)}}),
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
    # promote_due runs every second and moves a due job within about one.
    Case("due jobs left in awa.scheduled, promotion stopped",
         database={"awa_scheduled_overdue_seconds": "0+60x30"},
         expect={10: {}, 11: {"AwaPromotionBehind": [{}]}}),
    Case("promotion a second behind, then a burst it caught up on in 8 minutes",
         database={"awa_scheduled_overdue_seconds": "1x10 0+60x8 1x20"},
         expect={minute: {} for minute in range(0, 40, 2)}),
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
                    "values": f"1x{max(case.expect) + 1}"} for e in exporters for d in databases]
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
    # A job retried an hour apart would fire 10 minutes in each 40 (40 here).
    ("AwaJobsFailing", "[90m]", "[15m]"),
    # One retry long past would fire for hours.
    ("AwaJobsFailing", "[90m]", "[6h]"),
    # The commands of the text need the logical queue.
    ("AwaJobsFailing", "max by (queue, logical_queue)", "max by (queue)"),
    ("AwaQueuePausedWithBacklog", "max by (queue, logical_queue)", "max by (queue)"),
    # Ten minutes with a due job unpromoted, not fifteen.
    ("AwaPromotionBehind", "> 300", "> 600"),
])
def test_the_cases_catch_a_rule_gone_wrong(tmp_path, alert, old, new):
    doc = yaml.safe_load(ALERTS.read_text())
    [rule] = [r for group in doc["groups"] for r in group["rules"] if r["alert"] == alert]
    assert old in rule["expr"]
    rule["expr"] = rule["expr"].replace(old, new)
    mutated = tmp_path / "mutated.yml"
    mutated.write_text(yaml.safe_dump(doc))
    # The cases where the alert fires, each made for one of its failures: a
    # run of every case costs each mutation seconds of promtool.
    result = run_promtool(tmp_path, mutated, [
        case for case in CASES if any(alert in firing for firing in case.expect.values())])
    assert result.returncode != 0
    assert alert in result.stdout + result.stderr


# A queue of each shape and a physical queue of it: a stripe's name (s#1)
# is refused by every command (22023), a partition's (p__p1) is not.
SHAPES = {"plain": {"queue": "a", "logical_queue": "a"},
          "striped": {"queue": "s#1", "logical_queue": "s"},
          "partitioned": {"queue": "p__p1", "logical_queue": "p"}}


def alert_commands(alert: str, labels: dict[str, str]) -> list[list[str]]:
    """The awa commands of the alert's description, rendered for ``labels``,
    as argument lists."""
    text = render(rules()[alert]["annotations"]["description"], labels, "")
    return [shlex.split(command)[1:] for command in re.findall(r"`(awa [^`]*)`", text)]


def queue_argument(args: list[str]) -> str:
    return args[args.index("--queue") + 1] if "--queue" in args else args[-1]


def test_a_stripes_alerts_name_commands_that_take_its_logical_queue():
    """The striped case above checks that promtool renders the text so."""
    for alert in ("AwaQueuePausedWithBacklog", "AwaJobsFailing"):
        commands = alert_commands(alert, SHAPES["striped"])
        assert commands, alert
        assert [queue_argument(args) for args in commands] == ["s"] * len(commands), commands


@pytest.mark.one_version
def test_the_alerts_commands_run_for_a_plain_a_striped_and_a_partitioned_queue(db, logins):
    """Each command the two alerts name runs, exit 0, on a real queue of
    each shape, where the physical queue's own name is refused for a
    stripe; the resume resumes the physical queue the alert is about."""
    with db.connect(logins.producer) as p, db.connect(logins.operator) as op:
        for queue in ("a", "s", "p"):
            p.execute("select awa.enqueue(%s, 'k')", [queue])
        op.execute("select awa.set_queue_stripes('s', 2)")
        op.execute("select awa.set_queue_partitions('p', 2)")
    for shape, labels in SHAPES.items():
        with db.connect(logins.operator) as op:
            op.execute("select awa.pause_queue(%s)", [labels["logical_queue"]])
        commands = [*alert_commands("AwaQueuePausedWithBacklog", labels),
                    *alert_commands("AwaJobsFailing", labels)]
        assert len(commands) == 3, commands
        for args in commands:
            ran = db.awa(*args, user=logins.operator)
            assert ran.returncode == 0, (shape, args, ran.stdout, ran.stderr)
        with db.connect(logins.reader) as r:
            paused = r.execute("select paused from awa.queue_overview where queue = %s",
                               [labels["queue"]]).fetchone()[0]
        assert paused is False, shape
        for args in commands:
            own_name = [labels["queue"] if a == queue_argument(args) else a for a in args]
            ran = db.awa(*own_name, user=logins.operator)
            assert ran.returncode == (2 if shape == "striped" else 0), (shape, own_name)
            assert ("[22023]" in ran.stderr) == (shape == "striped"), ran.stderr
