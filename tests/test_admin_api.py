"""The admin HTTP API on PostgreSQL 17 and 18: every route, the write guard, errors."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from schemathesis.specs.openapi.checks import positive_data_acceptance

from awa_sql import sites
from awa_sql.admin.app import Settings, make_pool
from awa_sql.admin.serve import create_served_app
from awa_sql.hosts import host_check, url
from tests.support import scratch
from tests.support.admin import (
    ROOT,
    TOKEN,
    auth,
    client_for,
    enqueue_jobs,
    operator_login,
    primary_and_standby,
    reader_login,
    serve_cli,
    shared_pool_app,
)
from tests.support.jobs import claim
from tests.support.ports import assert_cannot_listen, needs_ipv6, refusing_port, taken_port
from tests.support.waiting import wait_until


@pytest.fixture
def operator_dsn(db) -> str:
    return db.dsn(operator_login(db))


@pytest.fixture
def api(operator_dsn):
    with client_for(operator_dsn, writable=True) as client:
        yield client


@pytest.fixture
def read_only_api(db):
    with client_for(db.dsn(reader_login(db)), writable=False) as client:
        yield client


def _shards(db, queue: str) -> int:
    with db.connect() as conn:
        return conn.execute("select awa.enqueue_shards(%s)", [queue]).fetchone()[0]


def _change_count(db, queue: str) -> int:
    with db.connect() as conn:
        return conn.execute("select count(*) from awa.shard_changes where queue = %s",
                            [queue]).fetchone()[0]


# -- reads -------------------------------------------------------------------------------


def test_list_queues_shows_s_mode_paused_and_counts(db, read_only_api):
    enqueue_jobs(db, "alpha", 3)
    enqueue_jobs(db, "beta", 2)
    with db.connect() as conn:
        conn.execute("select awa.set_enqueue_shards('beta', 4)")
        conn.execute("select awa.pause_queue('alpha')")
    got = read_only_api.get("/api/queues")
    assert got.status_code == 200
    by_name = {q["queue"]: q for q in got.json()}
    assert set(by_name) == {"alpha", "beta"}
    assert by_name["alpha"]["paused"] is True
    assert by_name["alpha"]["ready"] == 3
    assert by_name["alpha"]["oldest_ready_age_seconds"] >= 0
    assert by_name["beta"]["enqueue_shards"] == 4
    assert by_name["beta"]["shard_mode"] == "manual"
    assert by_name["beta"]["max_shards"] is None
    assert {"running", "failed", "completed", "scheduled"} <= set(by_name["beta"])


def test_queue_detail_has_lanes_draining_contention_and_changes(db, read_only_api):
    with db.connect() as conn:
        conn.execute("select awa.set_enqueue_shards('q', 4)")
    enqueue_jobs(db, "q", 40)
    with db.connect() as conn:
        conn.execute("select awa.set_enqueue_shards('q', 1)")
        conn.execute("select awa.sample_lane_contention()")
        conn.execute("select awa.sample_lane_contention()")
    got = read_only_api.get("/api/queues/q")
    assert got.status_code == 200
    q = got.json()
    assert q["queue"] == "q" and q["enqueue_shards"] == 1 and q["ready"] == 40
    assert len(q["lanes"]) == 16  # 4 priorities x the 4 shards ever provisioned
    shard_ready = {}
    for lane in q["lanes"]:
        shard_ready[lane["shard"]] = shard_ready.get(lane["shard"], 0) + lane["ready"]
        assert lane["above_s"] == (lane["shard"] >= 1)
        assert lane["draining"] == (lane["shard"] >= 1 and lane["ready"] > 0)
        assert lane["walked"]  # jobs left above S: no lane is retired (ADR 041)
    assert sum(shard_ready.values()) == 40
    assert all(shard_ready[s] > 0 for s in range(4))  # 40 keys spread over 4 shards
    assert [c["queue"] for c in q["contention"]] == ["q"]
    assert q["contention"][0]["samples"] == 2
    assert [(c["old_shards"], c["new_shards"]) for c in q["shard_changes"]] == [(4, 1), (1, 4)]
    assert q["shard_changes"][0]["source"] == "manual"


def test_the_summary_of_a_name_with_partitions_or_stripes_counts_them_all(db, read_only_api):
    with db.connect() as conn:
        conn.execute("select awa.set_queue_partitions('parts', 3)")
        conn.execute("select awa.set_queue_stripes('striped', 2)")
        for queue in ("parts", "striped"):
            conn.execute("select awa.enqueue(%s, 'k', ordering_key => ('k' || i)::bytea)"
                         " from generate_series(1, 30) as i", [queue])
    for queue in ("parts", "striped"):
        q = read_only_api.get(f"/api/queues/{queue}").json()
        assert len(q["physical_queues"]) > 1
        assert all(p["ready"] < 30 for p in q["physical_queues"]), q["physical_queues"]
        assert q["ready"] == sum(p["ready"] for p in q["physical_queues"]) == 30
        assert q["oldest_ready_age_seconds"] == max(
            p["oldest_ready_age_seconds"] for p in q["physical_queues"]
            if p["oldest_ready_age_seconds"] is not None)


@pytest.mark.parametrize("read", ["detail", "storage show", "shard plan"])
def test_a_read_of_one_queue_works_out_that_queue_alone(db, read):
    """Not the overview of every queue, joined to the one asked for: 156 ms
    at 3,000 queues, and on PostgreSQL 17 a lock a lane sequence."""
    from awa_sql import shards
    from awa_sql.admin import queries

    for i in range(30):
        enqueue_jobs(db, f"other-{i}", 1)
    enqueue_jobs(db, "mine", 1)
    calls = {
        "detail": lambda c: queries.queue_detail(c, "mine"),
        "storage show": lambda c: shards.show(c, "mine"),
        "shard plan": lambda c: shards.plan_enqueue_shards(c, "mine", 2),
    }
    with db.connect(autocommit=False) as conn:
        conn.execute("set track_functions = 'all'")
        calls[read](conn)
        worked_out = conn.execute(
            "select pg_stat_get_xact_function_calls('awa._lane_starts(integer)'::regprocedure)"
        ).fetchone()[0]
    assert worked_out is not None and 1 <= worked_out <= 2


@pytest.mark.one_version
def test_a_scheduled_count_at_its_cap_is_shown_as_a_floor(db, read_only_api):
    """awa._scheduled_capped stops at SCHEDULED_CAP: 500,000 scheduled jobs
    read 10,000, which the page and `awa storage show` showed as exact."""
    from awa_sql.defaults import SCHEDULED_CAP

    with db.connect() as conn:
        for queue, n in (("many-later", SCHEDULED_CAP + 1), ("few-later", 3)):
            conn.execute("select count(*) from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                         " array_fill('k'::text, array[%s]), run_ats => array_fill("
                         "now() + interval '1 day', array[%s]))", [queue, n, n, n])
    many = read_only_api.get("/api/queues/many-later").json()
    few = read_only_api.get("/api/queues/few-later").json()
    assert (many["scheduled"], many["scheduled_at_cap"]) == (SCHEDULED_CAP, True)
    assert (few["scheduled"], few["scheduled_at_cap"]) == (3, False)
    listed = {q["queue"]: q for q in read_only_api.get("/api/queues").json()}
    assert listed["many-later"]["scheduled_at_cap"] is True
    shown = db.awa("storage", "show", "--queue", "many-later", check=True).stdout
    assert f" {SCHEDULED_CAP}+ " in shown, shown


def test_unknown_queue_is_404_on_every_route(api):
    assert api.get("/api/queues/nope").status_code == 404
    assert api.get("/api/queues/nope/enqueue-shards/plan?shards=2").status_code == 404
    for method, path, body in [
        ("PUT", "/api/queues/nope/enqueue-shards", {"shards": 2}),
        ("PUT", "/api/queues/nope/shard-mode", {"mode": "auto", "max_shards": 8}),
        ("POST", "/api/queues/nope/pause", None),
        ("POST", "/api/queues/nope/resume", None),
        ("GET", "/api/queues/nope/jobs", None),
        ("GET", "/api/queues/nope/jobs/retry/plan", None),
        ("GET", "/api/queues/nope/jobs/cancel/plan", None),
        ("POST", "/api/queues/nope/jobs/retry", {}),
        ("POST", "/api/queues/nope/jobs/cancel", None),
        ("GET", "/api/queues/nope/drop/plan", None),
        ("POST", "/api/queues/nope/drop", None),
    ]:
        got = api.request(method, path, json=body, headers=auth())
        assert got.status_code == 404, (method, path, got.text)
        assert "nope" in got.json()["error"]
        assert got.json()["sqlstate"] == "42704"


def test_plan_states_the_ordering_consequence_and_changes_nothing(db, api):
    enqueue_jobs(db, "p", 1)
    got = api.get("/api/queues/p/enqueue-shards/plan", params={"shards": 4})
    assert got.status_code == 200
    plan = got.json()
    assert (plan["old_shards"], plan["new_shards"], plan["lanes_created"]) == (1, 4, 12)
    assert "partitioned FIFO" in plan["consequence"]
    assert _shards(db, "p") == 1


def test_plan_for_a_partition_page_states_its_real_s(db):
    with db.connect() as conn:
        conn.execute("select awa.set_queue_partitions('orders', 2)")
        conn.execute("select awa.set_enqueue_shards('orders', 4)")
        s = conn.execute("select enqueue_shards from awa.queue_overview"
                         " where queue = 'orders__p1'").fetchone()[0]
    assert s == 4
    with client_for(db.dsn(operator_login(db)), writable=True, token=TOKEN) as api:
        assert api.get("/api/queues/orders__p1").status_code == 200
        plan = api.get("/api/queues/orders__p1/enqueue-shards/plan",
                       params={"shards": 8}).json()
        done = api.put("/api/queues/orders__p1/enqueue-shards", json={"shards": 8},
                       headers=auth()).json()
    assert [(c["physical_queue"], c["old_shards"], c["lanes_created"])
            for c in done["changes"]] == [("orders__p1", 4, 16)]
    assert (plan["old_shards"], plan["lanes_created"]) == (4, 16), plan


def test_plan_of_a_stripe_is_refused_as_the_change_is(db, api):
    with db.connect() as conn:
        conn.execute("select awa.set_queue_stripes('st', 2)")
    plan = api.get("/api/queues/st%230/enqueue-shards/plan", params={"shards": 2})
    put = api.put("/api/queues/st%230/enqueue-shards", json={"shards": 2}, headers=auth())
    assert (plan.status_code, put.status_code) == (400, 400), (plan.text, put.text)
    assert plan.json() == put.json()
    assert plan.json()["sqlstate"] == "22023" and "'#'" in plan.json()["error"]


@pytest.mark.parametrize("name", ["billing/eu", "a/b/c", "x/enqueue-shards", "sp ace?&%",
                                  "ünï/çødé"])
def test_queue_names_with_slashes_and_escapes_work_on_every_route(db, api, name):
    enqueue_jobs(db, name, 2)
    path = "/api/queues/" + quote(name, safe="")
    detail = api.get(path)
    assert (detail.status_code, detail.json()["queue"], detail.json()["ready"]) == (200, name, 2)
    plan = api.get(path + "/enqueue-shards/plan", params={"shards": 2})
    assert (plan.status_code, plan.json()["queue"]) == (200, name)
    put = api.put(path + "/enqueue-shards", json={"shards": 2}, headers=auth())
    assert (put.status_code, put.json()["queue"]) == (200, name)
    assert _shards(db, name) == 2
    mode = api.put(path + "/shard-mode", json={"mode": "shadow", "max_shards": 8},
                   headers=auth())
    assert (mode.status_code, mode.json()["queue"]) == (200, name)
    assert api.post(path + "/pause", headers=auth()).json()["paused"] is True
    assert api.post(path + "/resume", headers=auth()).json()["paused"] is False
    jobs = api.get(path + "/jobs", params={"state": "ready"})
    assert (jobs.status_code, len(jobs.json()["jobs"])) == (200, 2)
    assert {j["logical_queue"] for j in jobs.json()["jobs"]} == {name}
    plan = api.get(path + "/jobs/cancel/plan")
    assert (plan.status_code, plan.json()["counts"]["ready"]) == (200, 2)
    cancelled = api.post(path + "/jobs/cancel", json={}, headers=auth())
    assert (cancelled.status_code, cancelled.json()["jobs"]) == (200, 2)
    page = api.get("/queues/" + quote(name, safe=""))
    assert page.status_code == 200
    assert html.escape(name, quote=True) in page.text


def test_nul_in_a_queue_name_or_kind_is_400_not_500(db):
    enqueue_jobs(db, "q", 1)
    with client_for(db.dsn(reader_login(db)), writable=False) as api:
        for path in ("/api/queues/a%00b", "/api/queues/a%00b/jobs",
                     "/api/queues/a%00b/history", "/api/queues/q/jobs?kind=a%00b",
                     "/api/queues/q/jobs/retry/plan?kind=a%00b",
                     "/api/queues/a%00b/enqueue-shards/plan?shards=2"):
            got = api.get(path)
            assert got.status_code == 400, (path, got.status_code, got.text)
            assert got.json()["sqlstate"] == "22021", got.text
            assert "must not contain a NUL byte" in got.json()["error"], got.text


def test_nul_in_a_write_is_4xx_and_changes_nothing(db, api):
    enqueue_jobs(db, "q", 1)
    for method, path, body, status in [
        ("PUT", "/api/queues/a%00b/enqueue-shards", {"shards": 2}, 400),
        ("POST", "/api/queues/a%00b/pause", None, 400),
        ("POST", "/api/queues/q/jobs/cancel", {"kind": "a\x00b"}, 422),
    ]:
        got = api.request(method, path, json=body, headers=auth())
        assert got.status_code == status, (method, path, got.text)
        assert "NUL" in got.json()["error"], got.text
        assert got.json().get("fields", ["kind"]) == ["kind"], got.text
    assert api.get("/api/queues/q").json()["ready"] == 1


def test_runtimes_panel_sees_the_last_change_of_a_queue_with_many_partitions(db):
    with db.connect() as conn:
        conn.execute("select awa.set_queue_partitions('big', 24)")
        conn.execute("select awa.set_enqueue_shards('big', 2)")
    with client_for(db.dsn(reader_login(db)), writable=False) as api:
        q = api.get("/api/queues/big").json()
    assert q["enqueue_shards"] == 2
    assert q["runtimes"]["producers"]["since"] is not None, q["runtimes"]
    assert q["runtimes"]["lane_evidence"] is not None
    assert q["runtimes"]["lane_evidence"]["shards"] == 2


# -- writes ------------------------------------------------------------------------------


def test_put_enqueue_shards_raises_s_and_records_who(db, api, operator_dsn):
    enqueue_jobs(db, "w", 1)
    got = api.put("/api/queues/w/enqueue-shards", json={"shards": 4}, headers=auth())
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["changes"] == [
        {"physical_queue": "w", "old_shards": 1, "new_shards": 4, "lanes_created": 12}]
    assert "partitioned FIFO" in body["consequence"]
    assert _shards(db, "w") == 4
    detail = api.get("/api/queues/w").json()
    assert len(detail["lanes"]) == 16
    login = operator_dsn.split("user=")[1].split()[0]
    assert detail["shard_changes"][0]["changed_by"] == login


@pytest.mark.parametrize("shards", [0, 65, -1, 2**31 - 1])
def test_out_of_range_s_is_400_with_the_database_message(db, api, shards):
    """The plan refuses it as the change does (ADR 007: the range is the database's)."""
    enqueue_jobs(db, "r", 1)
    got = api.put("/api/queues/r/enqueue-shards", json={"shards": shards}, headers=auth())
    plan = api.get("/api/queues/r/enqueue-shards/plan", params={"shards": shards})
    assert (got.status_code, plan.status_code) == (400, 400), (got.text, plan.text)
    assert got.json() == plan.json() == {
        "error": f"enqueue shards must be between 1 and 64, got {shards}", "sqlstate": "22023"}
    assert _shards(db, "r") == 1
    assert _change_count(db, "r") == 0


@pytest.mark.one_version
@pytest.mark.parametrize(("body", "field"), [
    ({}, "shards"),
    ({"shards": "4"}, "shards"),
    ({"shards": 4.5}, "shards"),
    ({"shards": True}, "shards"),
    ({"shards": None}, "shards"),
    ({"shards": 2**40}, "shards"),
    ({"shards": 4, "extra": 1}, "extra"),
])
def test_bad_shards_body_is_422_naming_the_field(db, api, body, field):
    enqueue_jobs(db, "b", 1)
    got = api.put("/api/queues/b/enqueue-shards", json=body, headers=auth())
    assert got.status_code == 422, got.text
    assert got.json()["fields"] == [field]
    assert got.json()["error"].startswith(f"{field}: ")
    assert _change_count(db, "b") == 0


def test_body_that_is_not_json_is_422(db, api):
    enqueue_jobs(db, "b", 1)
    got = api.put("/api/queues/b/enqueue-shards", content=b"shards=4",
                  headers={**auth(), "Content-Type": "application/json"})
    assert got.status_code == 422
    assert got.json()["fields"] == ["body"]
    assert "JSON" in got.json()["error"]
    empty = api.put("/api/queues/b/enqueue-shards", headers=auth())
    assert (empty.status_code, empty.json()["fields"]) == (422, ["body"])


@pytest.mark.parametrize("sized", [True, False], ids=["content-length", "chunked"])
def test_a_body_larger_than_any_write_takes_is_413_before_the_token_is_asked(db, api, sized):
    """A write's body is a few bytes ({"shards": 4}); the server read any body
    whole, and parsed it, before the guard: anyone who could reach it sent
    hundreds of megabytes to be held in memory, with or without a token."""
    big = b'{"shards": 4, "pad": [' + b"0," * 1_000_000 + b'0]}'

    def pieces():
        for start in range(0, len(big), 65_536):
            yield big[start:start + 65_536]

    for token in ({}, auth()):
        got = api.put("/api/queues/b/enqueue-shards", content=big if sized else pieces(),
                      headers={**token, "Content-Type": "application/json"})
        assert got.status_code == 413, got.text
        assert got.json() == {"error": "the request body is over 65536 bytes; no write "
                                       "here takes more than a few"}


def test_pause_and_resume(db, api):
    enqueue_jobs(db, "pr", 1)
    first = api.post("/api/queues/pr/pause", headers=auth())
    assert first.json() == {"queue": "pr", "paused": True, "changed": True}
    assert api.post("/api/queues/pr/pause", headers=auth()).json()["changed"] is False
    assert api.get("/api/queues/pr").json()["paused"] is True
    assert api.post("/api/queues/pr/resume", headers=auth()).json() == {
        "queue": "pr", "paused": False, "changed": True}
    assert api.get("/api/queues/pr").json()["paused"] is False


def test_put_shard_mode(db, api):
    enqueue_jobs(db, "m", 1)
    got = api.put("/api/queues/m/shard-mode", json={"mode": "auto", "max_shards": 8},
                  headers=auth())
    assert got.status_code == 200, got.text
    assert got.json()["queues"] == [{"queue": "m", "shard_mode": "auto", "max_shards": 8}]
    listed = {q["queue"]: q for q in api.get("/api/queues").json()}
    assert (listed["m"]["shard_mode"], listed["m"]["max_shards"]) == ("auto", 8)
    bad = api.put("/api/queues/m/shard-mode", json={"mode": "auto", "max_shards": 65},
                  headers=auth())
    assert bad.status_code == 400
    assert bad.json()["sqlstate"] == "22023" and "65" in bad.json()["error"]
    unknown = api.put("/api/queues/m/shard-mode", json={"mode": "turbo"}, headers=auth())
    assert unknown.status_code == 422 and unknown.json()["fields"] == ["mode"]
    assert api.get("/api/queues/m").json()["shard_mode"] == "auto"


def test_detail_shows_autoscaler_decisions_with_reasons(db, read_only_api):
    enqueue_jobs(db, "d", 1)
    with db.connect() as conn:
        conn.execute(
            "insert into awa.autoscale_decisions (queue, mode, samples, mean_waiters,"
            " wait_share, enqueue_rate, current_shards, proposed_shards, action, reason)"
            " values ('d', 'shadow', 12, 1.5, 0.4, 900, 1, 2, 'would_raise',"
            " 'waiters per held lane 1.5 >= 1.0')")
    decisions = read_only_api.get("/api/queues/d").json()["decisions"]
    assert [(d["action"], d["proposed_shards"], d["reason"]) for d in decisions] == [
        ("would_raise", 2, "waiters per held lane 1.5 >= 1.0")]


# -- jobs ----------------------------------------------------------------------------------


def _failed_jobs(db, queue: str, n: int, kind: str = "t") -> list[int]:
    with db.connect() as conn:
        ids = [r[0] for r in conn.execute(
            "select (awa.enqueue(%s, %s, jsonb_build_object('i', i), 2::smallint,"
            " convert_to('key-' || i, 'UTF8'), null, 1)).job_id"
            " from generate_series(1, %s) as i", [queue, kind, n]).fetchall()]
        conn.execute("select count(awa.fail(c.job_id, c.run_lease, 'failed ' || c.job_id))"
                     " from awa.claim(array[%s], %s, 'w') as c", [queue, n])
    return ids


def test_job_pages_list_a_queues_failed_jobs_and_show_one(db, read_only_api):
    ids = _failed_jobs(db, "fj", 5)
    first = read_only_api.get("/api/queues/fj/jobs", params={"state": "failed", "limit": 3})
    assert first.status_code == 200
    body = first.json()
    assert [j["job_id"] for j in body["jobs"]] == ids[:3]
    assert body["next_after_job_id"] == ids[2]
    job = body["jobs"][0]
    assert (job["state"], job["args"], job["ordering_key"], job["ordering_key_hex"]) == (
        "failed", {"i": 1}, "key-1", b"key-1".hex())
    assert (job["attempt"], job["max_attempts"], job["last_error"]) == (1, 1, f"failed {ids[0]}")
    rest = read_only_api.get("/api/queues/fj/jobs", params={
        "state": "failed", "limit": 3, "after_job_id": ids[2]}).json()
    assert [j["job_id"] for j in rest["jobs"]] == ids[3:] and rest["next_after_job_id"] is None
    one = read_only_api.get(f"/api/jobs/{ids[4]}")
    assert (one.status_code, one.json()["job_id"], one.json()["args"]) == (200, ids[4], {"i": 5})
    assert read_only_api.get("/api/jobs/999999999").status_code == 404
    assert read_only_api.get("/api/queues/fj/jobs", params={"state": "done"}).status_code == 422
    page = read_only_api.get(f"/jobs/{ids[0]}")
    assert page.status_code == 200 and f'data-job="{ids[0]}"' in page.text
    assert read_only_api.get("/jobs/0").status_code == 422


BIG_ERROR = "card declined\n" + "at frame()\n" * 100_000  # 1 MB: a stack trace
KEPT_ERROR = BIG_ERROR[:65536]  # what awa.fail keeps of it


def _big_failed_jobs(db, queue: str, n: int) -> list[int]:
    """``n`` failed jobs, each with 1 MB of args and a 1 MB last error (64 kB kept)."""
    with db.connect() as conn:
        ids = [r[0] for r in conn.execute(
            "select (awa.enqueue(%s, 'big', jsonb_build_object('blob', repeat(md5(i::text),"
            " 32768)), 2::smallint, null, null, 1)).job_id from generate_series(1, %s) as i",
            [queue, n]).fetchall()]
        conn.execute("select count(awa.fail(c.job_id, c.run_lease, %s))"
                     " from awa.claim(array[%s], %s, 'w') as c", [BIG_ERROR, queue, n])
    return ids


def test_a_brief_page_of_jobs_leaves_out_args_and_cuts_the_error(db, read_only_api):
    """The page's failed list refreshes every 3 s: brief rows carry no args
    and 200 characters of the error, whatever a producer or a worker wrote."""
    ids = _big_failed_jobs(db, "heavy", 5)
    brief = read_only_api.get("/api/queues/heavy/jobs",
                              params={"state": "failed", "limit": 20, "brief": "true"})
    assert brief.status_code == 200, brief.text
    assert len(brief.content) < 10_000, len(brief.content)
    body = brief.json()
    assert body["brief"] is True
    assert [j["job_id"] for j in body["jobs"]] == ids
    for job in body["jobs"]:
        assert (job["kind"], job["state"], job["attempt"], job["max_attempts"]) == (
            "big", "failed", 1, 1)
        assert job["args"] is None and job["last_error"] == BIG_ERROR[:200]
    full = read_only_api.get("/api/queues/heavy/jobs", params={"state": "failed", "limit": 1})
    job = full.json()["jobs"][0]
    assert full.json()["brief"] is False
    assert len(job["args"]["blob"]) == 32 * 32768 and job["last_error"] == KEPT_ERROR


def test_a_brief_page_of_jobs_cuts_a_huge_kind_and_worker_name(db, read_only_api):
    """Nothing caps a kind (the producer's) in the database: one job with a
    2 MB kind made every refresh of the queue page's list ship 2 MB. A
    worker's name is capped at 255 bytes by awa.claim (it was not: 4 MB
    names shipped whole). Brief rows cut both to 200 characters; the whole
    job still has them whole."""
    kind = "kind-" + "k" * 2_000_000
    worker = "host-3:4121:" + "w" * 243
    (failed,) = _failed_jobs(db, "named", 1, kind=kind)
    with db.connect() as conn:
        running = conn.execute("select (awa.enqueue('named', %s)).job_id", [kind]).fetchone()[0]
        assert [r[0] for r in claim(conn, ["named"], 1, worker=worker)] == [running]
    for params in ({"state": "failed"}, {"state": "running"}, {}):
        brief = read_only_api.get("/api/queues/named/jobs", params={**params, "brief": "true"})
        assert brief.status_code == 200, brief.text
        assert len(brief.content) < 10_000, (params, len(brief.content))
        for job in brief.json()["jobs"]:
            assert job["kind"] == kind[:200], params
            assert job["worker"] == (worker[:200] if job["job_id"] == running else None)
    whole = read_only_api.get("/api/queues/named/jobs", params={"state": "running"}).json()
    assert [(j["kind"], j["worker"]) for j in whole["jobs"]] == [(kind, worker)]
    assert read_only_api.get(f"/api/jobs/{running}").json()["worker"] == worker
    assert read_only_api.get(f"/api/jobs/{failed}").json()["kind"] == kind


def test_a_job_without_its_args_is_the_same_job(db, read_only_api):
    (job_id,) = _big_failed_jobs(db, "heavy", 1)
    whole = read_only_api.get(f"/api/jobs/{job_id}").json()
    bare = read_only_api.get(f"/api/jobs/{job_id}", params={"args": "false"})
    assert bare.status_code == 200 and len(bare.content) < 100_000  # the error, escaped
    assert len(whole["args"]["blob"]) == 32 * 32768
    assert bare.json() == {**whole, "args": None}
    assert read_only_api.get("/api/jobs/999999", params={"args": "false"}).status_code == 404


def test_a_database_error_the_api_does_not_map_says_its_sqlstate_not_its_sql(db):
    """A statement timeout in awa.jobs: the 500 said what psycopg prints, the
    CONTEXT too, with the statements of the awa function it stopped in. The
    answer is the SQLSTATE and the message; the server's log has the rest."""
    _failed_jobs(db, "locked", 1)
    login = reader_login(db)
    with db.connect() as conn:
        conn.execute(f'alter role "{login}" set statement_timeout = 200')
    with (db.connect() as locker, client_for(db.dsn(login), writable=False) as api,
          locker.transaction(force_rollback=True)):
        locker.execute("lock table awa.finished in access exclusive mode")
        got = api.get("/api/queues/locked/jobs", params={"state": "failed"})
    assert got.status_code == 500, got.text
    assert got.json() == {"error": "database error 57014: canceling statement due to "
                                   "statement timeout", "sqlstate": "57014"}


def test_job_page_of_one_worker_lists_its_running_jobs(db, read_only_api):
    with db.connect() as conn:
        ids = [r[0] for r in conn.execute(
            "select (awa.enqueue('wj', 't')).job_id from generate_series(1, 5)").fetchall()]
        for worker in ("a", "b", "a", "b"):
            conn.execute("select * from awa.claim(array['wj'], 1, %s)", [worker])
    first = read_only_api.get("/api/queues/wj/jobs", params={"worker": "a", "limit": 1})
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["worker"], [(j["job_id"], j["state"], j["worker"]) for j in body["jobs"]]) == (
        "a", [(ids[0], "running", "a")])
    rest = read_only_api.get("/api/queues/wj/jobs", params={
        "worker": "a", "state": "running", "after_job_id": body["next_after_job_id"]}).json()
    assert [j["job_id"] for j in rest["jobs"]] == [ids[2]] and rest["next_after_job_id"] is None
    every = read_only_api.get("/api/queues/wj/jobs").json()
    assert every["worker"] is None and len(every["jobs"]) == 5
    bad = read_only_api.get("/api/queues/wj/jobs", params={"worker": "a", "state": "ready"})
    assert bad.status_code == 400
    assert bad.json() == {"error": "worker 'a' holds running jobs only: state must be running "
                                   "or null, got 'ready'", "sqlstate": "22023"}


def test_failures_sum_up_the_failed_jobs_kept_by_queue_kind_and_error(db, read_only_api):
    _failed_jobs(db, "fa", 3, kind="charge")
    _failed_jobs(db, "fb", 1, kind="mail")
    with db.connect() as conn:
        conn.execute("update awa.finished set last_error = 'timeout' || chr(10) || 'trace'"
                     " where state = 'failed'")
    got = read_only_api.get("/api/failures")
    assert got.status_code == 200, got.text
    body = got.json()
    assert (body["queue"], body["since_seconds"], body["more"]) == (None, None, False)
    assert [(g["logical_queue"], g["kind"], g["error"], g["failed"]) for g in body["groups"]
            if g["logical_queue"] in ("fa", "fb")] == [
        ("fa", "charge", "timeout", 3), ("fb", "mail", "timeout", 1)]
    one = read_only_api.get("/api/failures", params={"queue": "fb", "since_seconds": 3600})
    assert [(g["kind"], g["sample_error"]) for g in one.json()["groups"]] == [
        ("mail", "timeout\ntrace")]
    assert read_only_api.get("/api/failures", params={"queue": "fa", "limit": 1}).json()[
        "more"] is False
    assert read_only_api.get("/api/failures", params={"limit": 1}).json()["more"] is True
    assert read_only_api.get("/api/failures", params={"queue": "nosuch"}).status_code == 404
    old = read_only_api.get("/api/failures", params={"since_seconds": 400_000_000})
    assert (old.status_code, old.json()["sqlstate"]) == (400, "22023")
    assert read_only_api.get("/api/failures", params={"since_seconds": -1}).status_code == 422


@pytest.mark.parametrize("since", ["1e13", "1e308", "1e400", "inf", "Infinity"])
def test_an_age_no_interval_holds_is_400_naming_since_seconds(db, read_only_api, since):
    """Past what an interval holds the age never reached awa.failure_summary's
    check: 400 "value out of range: overflow" or "interval out of range",
    naming neither the parameter nor its range."""
    got = read_only_api.get("/api/failures", params={"since_seconds": since})
    assert got.status_code == 400, got.text
    assert got.json()["sqlstate"] == "22023"
    assert got.json()["error"].startswith(
        "since_seconds must be between 0 and 10 years (315576000 seconds), got "), got.json()


@pytest.mark.parametrize("job_id", ["-1", "0", str(2**63), "99999999999999999999"])
def test_a_job_id_no_job_can_have_is_422_naming_it(db, api, job_id):
    """1..2^63-1 are the ids a job can have: another is a bad request (as
    `awa jobs show` exits 2 for it), not an unknown job (404)."""
    for method, path in (("GET", f"/api/jobs/{job_id}"), ("POST", f"/api/jobs/{job_id}/retry"),
                         ("POST", f"/api/jobs/{job_id}/cancel")):
        got = api.request(method, path, headers=auth())
        assert got.status_code == 422, (method, path, got.text)
        assert got.json()["fields"] == ["job_id"]
        assert got.json()["error"].endswith(f", got {job_id}"), got.text
    assert api.get("/api/queues/q/jobs", params={"limit": 1001}).json()["error"] == (
        "limit: Input should be less than or equal to 1000, got 1001")

def test_retry_and_cancel_one_job(db, api):
    (job_id,) = _failed_jobs(db, "one", 1)
    got = api.post(f"/api/jobs/{job_id}/retry", headers=auth())
    assert got.json() == {"job_id": job_id, "action": "retry", "state": "ready"}
    again = api.post(f"/api/jobs/{job_id}/retry", headers=auth())
    assert again.status_code == 409
    assert again.json()["error"] == (f"job {job_id} is ready: only failed or cancelled jobs can"
                                     " be retried; nothing changed")
    cancelled = api.post(f"/api/jobs/{job_id}/cancel", headers=auth())
    assert cancelled.json() == {"job_id": job_id, "action": "cancel", "state": "cancelled"}
    assert api.post(f"/api/jobs/{job_id}/cancel", headers=auth()).status_code == 409
    missing = api.post("/api/jobs/999999999/cancel", headers=auth())
    assert missing.status_code == 404 and "no job 999999999" in missing.json()["error"]



def test_a_retry_refused_for_a_held_unique_key_says_so(db, api):
    with db.connect() as conn:
        first = conn.execute("select job_id from awa.enqueue('ukq', 't', max_attempts => 1,"
                             " unique_key => 'k'::bytea)").fetchone()[0]
        conn.execute("select awa.fail(c.job_id, c.run_lease, 'boom')"
                     " from awa.claim(array['ukq'], 1, 'w') as c")
        conn.execute("select awa.enqueue('ukq', 't', unique_key => 'k'::bytea)")
    got = api.post(f"/api/jobs/{first}/retry", headers=auth())
    assert got.status_code == 409
    assert got.json()["error"].startswith(
        f"job {first} is failed but was not retried: another job of its queue holds its unique"
        " key"), got.text


def test_bulk_plan_says_how_many_and_the_bulk_call_takes_them(db, api):
    ids = _failed_jobs(db, "bulk", 4) + _failed_jobs(db, "bulk", 2, kind="other")
    plan = api.get("/api/queues/bulk/jobs/retry/plan").json()
    assert (plan["counts"], plan["jobs"], plan["more"]) == ({"failed": 6}, 6, False)
    assert plan["question"] == "Retry 6 failed jobs of bulk?"
    one = api.get("/api/queues/bulk/jobs/retry/plan", params={"kind": "other"}).json()
    assert one["question"] == "Retry 2 failed jobs of kind 'other' of bulk?"
    got = api.post("/api/queues/bulk/jobs/retry", json={"kind": "other"}, headers=auth())
    assert got.json() == {"queue": "bulk", "action": "retry", "kind": "other",
                          "state": "failed", "jobs": 2}
    assert api.post("/api/queues/bulk/jobs/retry", json={"max_jobs": 3},
                    headers=auth()).json()["jobs"] == 3
    bad = api.post("/api/queues/bulk/jobs/retry", json={"max_jobs": 0}, headers=auth())
    assert bad.status_code == 400 and "max_jobs must be between 1 and 100000" in bad.text
    cancel = api.get("/api/queues/bulk/jobs/cancel/plan").json()
    assert cancel["counts"] == {"ready": 5, "scheduled": 0}
    assert cancel["question"] == "Cancel 5 ready jobs of bulk?"
    assert api.post("/api/queues/bulk/jobs/cancel", headers=auth()).json()["jobs"] == 5
    states = [j["state"] for j in api.get("/api/queues/bulk/jobs").json()["jobs"]]
    assert states == ["cancelled"] * 3 + ["failed"] + ["cancelled"] * 2  # job 4 is left
    with db.connect() as conn:
        conn.execute("select awa.set_queue_partitions('bulk', 2)")
    assert api.get("/api/queues/bulk/jobs/cancel/plan").json()["jobs"] == 0
    assert len(ids) == 6


def test_a_bulk_retry_of_jobs_another_transaction_holds_is_409_not_a_wait(db, api):
    """Every failed job of the queue held by another transaction (a retry in
    psql not yet committed): the bulk retry waits for them at most the job
    tools' lock timeout and answers 409 (55P03), as a single job's retry
    does; with no timeout it held its pooled connection until they ended."""
    _failed_jobs(db, "heldq", 3)
    with db.connect(autocommit=False) as holder:
        holder.execute("select from awa.finished where state = 'failed' for update")
        answers: list = []
        post = threading.Thread(target=lambda: answers.append(
            api.post("/api/queues/heldq/jobs/retry", headers=auth())), daemon=True)
        post.start()
        post.join(timeout=60)
        assert not post.is_alive(), "the bulk retry still waits for the held rows"
        holder.rollback()
    [got] = answers
    assert (got.status_code, got.json()["sqlstate"]) == (409, "55P03"), got.text


def test_bulk_retry_of_cancelled_jobs_plans_and_takes_that_state_only(db, api):
    """The runbook's way back through the API: the plan and the call take
    state=cancelled; without it they stay failed-only, as before."""
    failed = _failed_jobs(db, "bc", 2)
    with db.connect() as conn:
        cancelled = [r[0] for r in conn.execute(
            "select (awa.enqueue('bc', 'bad', jsonb_build_object('i', i))).job_id"
            " from generate_series(1, 3) as i").fetchall()]
    assert api.post("/api/queues/bc/jobs/cancel", json={"kind": "bad"},
                    headers=auth()).json()["jobs"] == 3
    plan = api.get("/api/queues/bc/jobs/retry/plan", params={"state": "cancelled"}).json()
    assert (plan["counts"], plan["jobs"], plan["more"]) == ({"cancelled": 3}, 3, False)
    assert plan["question"] == "Retry 3 cancelled jobs of bc?"
    failed_plan = api.get("/api/queues/bc/jobs/retry/plan").json()
    assert (failed_plan["counts"], failed_plan["question"]) == (
        {"failed": 2}, "Retry 2 failed jobs of bc?")
    got = api.post("/api/queues/bc/jobs/retry", json={"state": "cancelled", "max_jobs": 2},
                   headers=auth())
    assert got.json() == {"queue": "bc", "action": "retry", "kind": None,
                          "state": "cancelled", "jobs": 2}
    assert api.post("/api/queues/bc/jobs/retry", json={"state": "cancelled", "kind": "bad"},
                    headers=auth()).json()["jobs"] == 1
    none = api.get("/api/queues/bc/jobs/retry/plan", params={"state": "cancelled"}).json()
    assert none["question"] == "No cancelled jobs in bc."
    states = {j["job_id"]: j["state"] for j in api.get("/api/queues/bc/jobs").json()["jobs"]}
    assert [states[j] for j in cancelled] == ["ready"] * 3
    assert [states[j] for j in failed] == ["failed"] * 2


def test_a_bulk_retry_and_its_plan_name_the_state_they_take(db, api):
    """A script that retried with {"state": "cancelled"} read back only a
    count: the plan and the result now say which state was taken (failed
    when none is given); a cancel, which takes no state, says null."""
    _failed_jobs(db, "bn", 1)
    with db.connect() as conn:
        conn.execute("select awa.enqueue('bn', 'k')")
    plans = {state: api.get("/api/queues/bn/jobs/retry/plan",
                            params={} if state is None else {"state": state}).json()
             for state in (None, "failed", "cancelled")}
    assert {s: p["state"] for s, p in plans.items()} == {
        None: "failed", "failed": "failed", "cancelled": "cancelled"}
    cancel_plan = api.get("/api/queues/bn/jobs/cancel/plan").json()
    assert cancel_plan["state"] is None
    cancelled = api.post("/api/queues/bn/jobs/cancel", headers=auth()).json()
    assert (cancelled["state"], cancelled["jobs"]) == (None, 1)
    by_state = {state: api.post("/api/queues/bn/jobs/retry", headers=auth(),
                                json={} if state is None else {"state": state}).json()
                for state in ("cancelled", None)}
    assert {s: (r["state"], r["jobs"]) for s, r in by_state.items()} == {
        "cancelled": ("cancelled", 1), None: ("failed", 1)}


@pytest.mark.parametrize("state", ["ready", "Cancelled", "x'y", ""])
def test_a_state_a_bulk_retry_does_not_take_is_400_in_the_plan_and_the_call_alike(
        db, api, state):
    """The plan refuses it as the call does, awa.retry_jobs's message naming
    the value and the states it takes; nothing changes."""
    ids = _failed_jobs(db, "bs", 2)
    got = api.post("/api/queues/bs/jobs/retry", json={"state": state}, headers=auth())
    plan = api.get("/api/queues/bs/jobs/retry/plan", params={"state": state})
    assert (got.status_code, plan.status_code) == (400, 400), (got.text, plan.text)
    quoted = "'" + state.replace("'", "''") + "'"
    assert got.json() == plan.json() == {
        "error": f"state must be failed or cancelled, got {quoted}", "sqlstate": "22023"}
    assert {j["state"] for j in api.get("/api/queues/bs/jobs").json()["jobs"]} == {"failed"}
    assert len(ids) == 2


def test_a_state_given_to_a_bulk_cancel_or_of_the_wrong_type_is_refused(db, api):
    _failed_jobs(db, "bt", 1)
    with db.connect() as conn:
        conn.execute("select awa.enqueue('bt', 'k')")
    for got in (api.post("/api/queues/bt/jobs/cancel", json={"state": "cancelled"},
                         headers=auth()),
                api.get("/api/queues/bt/jobs/cancel/plan", params={"state": "cancelled"})):
        assert got.status_code == 400, got.text
        assert got.json()["sqlstate"] == "22023" and "a retry only" in got.json()["error"]
    typed = api.post("/api/queues/bt/jobs/retry", json={"state": 1}, headers=auth())
    assert typed.status_code == 422 and typed.json()["fields"] == ["state"], typed.text
    missing = api.get("/api/queues/nope/jobs/retry/plan", params={"state": "ready"})
    assert missing.status_code == 404  # an unknown queue first, as in the call
    assert api.get("/api/queues/bt/jobs/cancel/plan").json()["counts"] == {
        "ready": 1, "scheduled": 0}


@pytest.fixture(params=["ISO, MDY", "SQL, DMY"])
def datestyle_api(request, db):
    """A writable API whose login has this DateStyle: one psycopg cannot parse
    ('SQL, DMY') once read a plan's bound as datetime.max."""
    login = operator_login(db)
    with db.cluster.admin() as conn:
        conn.execute(sql.SQL("alter role {} set datestyle = {}").format(
            sql.Identifier(login), sql.Literal(request.param)))
    with client_for(db.dsn(login), writable=True) as client:
        yield client


def _states(db, ids: list[int]) -> list[str]:
    with db.connect() as conn:
        return [conn.execute("select state from awa.job(%s)", [i]).fetchone()[0] for i in ids]


def test_a_bulk_cancel_with_its_plans_bound_takes_the_jobs_counted_not_later_ones(
        db, datestyle_api):
    """Three scheduled jobs counted; a producer enqueues three ready ones while
    the dialog is open. The click, with the plan's before, cancels the three
    counted; without it, it took the three new ready ones first."""
    api = datestyle_api
    with db.connect() as conn:
        counted = [r[0] for r in conn.execute(
            "select (awa.enqueue('bb', 'k', run_at => now() + interval '1 hour')).job_id"
            " from generate_series(1, 3)").fetchall()]
    plan = api.get("/api/queues/bb/jobs/cancel/plan").json()
    assert (plan["counts"], plan["jobs"]) == ({"ready": 0, "scheduled": 3}, 3)
    with db.connect() as conn:
        assert conn.execute("select %s::timestamptz <= clock_timestamp()",
                            [plan["before"]]).fetchone()[0], plan["before"]
        new = [r[0] for r in conn.execute(
            "select (awa.enqueue('bb', 'k')).job_id from generate_series(1, 3)").fetchall()]
    got = api.post("/api/queues/bb/jobs/cancel", headers=auth(),
                   json={"max_jobs": plan["jobs"], "before": plan["before"]})
    assert got.json()["jobs"] == 3, got.text
    assert _states(db, counted) == ["cancelled"] * 3
    assert _states(db, new) == ["ready"] * 3  # they wait for the next click
    # Without a bound, as before: whatever is first.
    assert api.post("/api/queues/bb/jobs/cancel", headers=auth()).json()["jobs"] == 3
    assert _states(db, new) == ["cancelled"] * 3


def test_a_bulk_retry_with_its_plans_bound_takes_the_failures_counted_not_later_ones(db, api):
    """Three failed jobs counted; three jobs of lower ids (a retry takes the
    lowest first) fail while the dialog is open. The click, with the plan's
    before, retries the three counted and leaves the new failures."""
    with db.connect() as conn:
        conn.execute("select awa.enqueue('br', 'k', '{}', 2::smallint, null, null, 1)"
                     " from generate_series(1, 3)")
        running = conn.execute("select c.job_id, c.run_lease"
                               " from awa.claim(array['br'], 3, 'w') as c").fetchall()
    counted = _failed_jobs(db, "br", 3)
    plan = api.get("/api/queues/br/jobs/retry/plan").json()
    assert (plan["counts"], plan["jobs"]) == ({"failed": 3}, 3)
    with db.connect() as conn:
        for job_id, lease in running:
            conn.execute("select awa.fail(%s, %s, 'later')", [job_id, lease])
    later = sorted(job_id for job_id, _lease in running)
    assert later < counted and _states(db, later) == ["failed"] * 3
    got = api.post("/api/queues/br/jobs/retry", headers=auth(),
                   json={"max_jobs": plan["jobs"], "before": plan["before"]})
    assert got.json()["jobs"] == 3, got.text
    assert _states(db, counted) == ["ready"] * 3
    assert _states(db, later) == ["failed"] * 3


@pytest.mark.parametrize("before", ["2025-01-31T12:00:00", "tomorrow", "", 1700000000,
                                    "2025-02-30T00:00:00Z", True])
def test_a_bulk_calls_bad_before_is_422_naming_it(db, api, before):
    """A time without an offset (read in the login's TimeZone, another instant),
    a number (lax pydantic's seconds since 1970) or no time at all: refused,
    nothing changed."""
    with db.connect() as conn:
        job = conn.execute("select (awa.enqueue('bz', 'k')).job_id").fetchone()[0]
    for action in ("cancel", "retry"):
        got = api.post(f"/api/queues/bz/jobs/{action}", json={"before": before},
                       headers=auth())
        assert got.status_code == 422, got.text
        assert got.json()["fields"] == ["before"] and "before: " in got.json()["error"]
    assert _states(db, [job]) == ["ready"]


# -- a dead worker's jobs (awa.release_worker) ------------------------------------------


def _leases(db, worker: str) -> list[tuple[int, bool]]:
    """(job id, lease still running) of each running job claimed under ``worker``."""
    with db.connect() as conn:
        return conn.execute("select job_id, lease_expires_at > now() from awa.running"
                            " where worker = %s order by job_id", [worker]).fetchall()


def _claimed(db, queue: str, worker: str, n: int) -> list[int]:
    with db.connect() as conn:
        conn.execute("select awa.enqueue(%s, 't') from generate_series(1, %s)", [queue, n])
        return [r[0] for r in claim(conn, [queue], n, worker=worker)]


def test_release_worker_ends_a_dead_workers_leases_and_the_rescue_retries_its_jobs(db, api):
    """The runbook's step for a worker known dead, from the API as from `awa
    jobs release-worker`: every running job it holds, in any queue, has its
    lease end now; another worker's are left; the rescue takes them back."""
    dead = "host-3/a:4121:ab12cd"  # a name may hold "/" and ":"
    mine = _claimed(db, "rw1", dead, 2) + _claimed(db, "rw2", dead, 1)
    other = _claimed(db, "rw1", "alive", 1)
    path = f"/api/workers/{quote(dead, safe='')}/release"
    assert api.post(path).status_code == 403  # no token: nothing changes
    assert _leases(db, dead) == [(j, True) for j in mine]
    got = api.post(path, headers=auth())
    assert got.status_code == 200, got.text
    assert got.json() == {"worker": dead, "released": 3}
    assert _leases(db, dead) == [(j, False) for j in mine]
    assert _leases(db, "alive") == [(other[0], True)]
    with db.connect() as conn:
        assert conn.execute("select awa.rescue_expired()").fetchone()[0] == 3
    assert {api.get(f"/api/jobs/{j}").json()["state"] for j in mine} <= {"scheduled", "ready"}
    assert api.get(f"/api/jobs/{other[0]}").json()["state"] == "running"
    again = api.post(path, headers=auth())
    assert again.json() == {"worker": dead, "released": 0}
    nobody = api.post("/api/workers/nobody/release", headers=auth())
    assert nobody.json() == {"worker": "nobody", "released": 0}


def test_release_worker_with_a_nul_byte_is_400_and_on_a_reader_login_403_naming_the_role(db):
    _claimed(db, "rw3", "w", 1)
    with client_for(db.dsn(reader_login(db)), writable=True) as client:
        got = client.post("/api/workers/w/release", headers=auth())
        nul = client.post("/api/workers/w%00x/release", headers=auth())
    assert got.status_code == 403, got.text
    assert got.json()["sqlstate"] == "42501"
    assert got.json()["error"] == "permission denied for function release_worker"
    assert got.json()["hint"] == ("the admin server's login needs awa_operator to make "
                                  "changes: grant awa_operator to it")
    assert (nul.status_code, nul.json()["sqlstate"]) == (400, "22021")
    assert _leases(db, "w") == [(_leases(db, "w")[0][0], True)]


# -- dropping a queue (awa.drop_queue, ADR 044) ------------------------------------------


def _completed(db, queue: str, n: int) -> None:
    """``n`` jobs of ``queue`` run and completed: kept for the retention."""
    with db.connect() as conn:
        conn.execute("select awa.enqueue(%s, 't') from generate_series(1, %s)", [queue, n])
        for job in claim(conn, [queue], n):
            conn.execute("select awa.complete(%s, %s)", [job[0], job[1]])


def _kept(db, queue: str) -> int:
    with db.connect() as conn:
        return conn.execute("select count(*) from awa.finished f join awa.queue_meta m"
                            " using (queue_id) where m.queue = %s", [queue]).fetchone()[0]


def test_a_drop_plans_then_refuses_kept_jobs_without_discard_then_drops(db, api):
    """The runbook's drop from the API: the plan counts the queue's jobs and
    asks as `awa storage drop` asks; the drop of a queue that keeps finished
    jobs is 409 (55006) naming them, with the hint in the API's terms, and
    changes nothing; with discard_finished it drops the queue, jobs and all."""
    _completed(db, "dq", 2)
    plan = api.get("/api/queues/dq/drop/plan")
    assert plan.status_code == 200, plan.text
    assert plan.json() == {
        "queue": "dq", "discard_finished": False, "kept": 2,
        "counts": {"ready": 0, "running": 0, "scheduled": 0, "completed_kept": 2,
                   "failed_kept": 0, "cancelled_kept": 0},
        "question": "Drop queue 'dq'?"}
    discarding = api.get("/api/queues/dq/drop/plan?discard_finished=true").json()
    assert discarding["question"] == "Drop queue 'dq', deleting its 2 kept terminal job(s)?"

    refused = api.post("/api/queues/dq/drop", headers=auth())
    assert refused.status_code == 409, refused.text
    assert refused.json()["sqlstate"] == "55006"
    assert refused.json()["error"] == ("queue 'dq' is not empty: 0 ready, 0 scheduled, "
                                       "0 running, 0 unique keys held, 2 terminal jobs kept")
    assert '{"discard_finished": true}' in refused.json()["hint"]
    assert "discard_finished =>" not in refused.json()["hint"]  # not the SQL's spelling
    assert api.get("/api/queues/dq").status_code == 200
    assert _kept(db, "dq") == 2

    dropped = api.post("/api/queues/dq/drop", json={"discard_finished": True}, headers=auth())
    assert dropped.status_code == 200, dropped.text
    assert dropped.json() == {"queue": "dq", "dropped": True, "discard_finished": True}
    assert api.get("/api/queues/dq").status_code == 404  # the name is free at once
    with db.connect() as conn:
        assert conn.execute("select count(*) from awa.finished f join awa.queue_meta m"
                            " using (queue_id) where m.dropped_name = 'dq'").fetchone() == (0,)
    again = api.post("/api/queues/dq/drop", headers=auth())
    assert (again.status_code, again.json()["sqlstate"]) == (404, "42704")


def test_a_drop_of_a_queue_with_jobs_or_stripes_is_409_and_changes_nothing(db, api):
    enqueue_jobs(db, "busy", 1)
    busy = api.post("/api/queues/busy/drop", json={"discard_finished": True}, headers=auth())
    assert busy.status_code == 409, busy.text
    assert busy.json()["error"].startswith("queue 'busy' is not empty: 1 ready")
    assert "POST /api/queues/busy/jobs/cancel" in busy.json()["hint"]
    assert _ready(db, "busy") == 1
    with db.connect() as conn:
        conn.execute("select awa.set_queue_stripes('striped', 2)")
    striped = api.post("/api/queues/striped/drop", headers=auth())
    assert (striped.status_code, striped.json()["sqlstate"]) == (409, "0A000"), striped.text
    assert "not supported yet" in striped.json()["error"]
    assert api.get("/api/queues/striped").status_code == 200
    empty = api.post("/api/queues/busy/drop", json={"discard_finished": "yes"}, headers=auth())
    assert (empty.status_code, empty.json()["fields"]) == (422, ["discard_finished"])


def test_a_drop_on_a_reader_login_is_403_naming_the_role(db):
    enqueue_jobs(db, "rd", 1)
    with client_for(db.dsn(reader_login(db)), writable=True) as client:
        assert client.get("/api/queues/rd/drop/plan").status_code == 200
        got = client.post("/api/queues/rd/drop", headers=auth())
    assert (got.status_code, got.json()["sqlstate"]) == (403, "42501"), got.text
    assert "needs awa_operator" in got.json()["hint"]


# -- the queue limit (awa.set_max_queues, ADR 039) ---------------------------------------


def _queue_limit(db) -> int:
    with db.connect() as conn:
        return conn.execute("select max_queues from awa.queue_limit").fetchone()[0]


def test_the_queue_limit_is_read_and_set_with_the_database_s_own_range(db, api, read_only_api):
    enqueue_jobs(db, "ql", 1)
    assert read_only_api.get("/api/queue-limit").json() == {"max_queues": 10000, "queues": 1}
    raised = api.put("/api/queue-limit", json={"max_queues": 20000}, headers=auth())
    assert raised.status_code == 200, raised.text
    assert raised.json() == {"max_queues": 20000, "previous": 10000, "queues": 1}
    assert _queue_limit(db) == 20000
    with db.connect(operator_login(db)) as op:
        for value in (0, 1_000_001):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as sql:
                op.execute("select awa.set_max_queues(%s)", [value])
            got = api.put("/api/queue-limit", json={"max_queues": value}, headers=auth())
            assert got.status_code == 400, got.text
            assert got.json() == {"error": sql.value.diag.message_primary, "sqlstate": "22023"}
            assert f"got {value}" in got.json()["error"]
    for body, field in [({"max_queues": 2**31}, "max_queues"), ({"max_queues": "5"},
                        "max_queues"), ({}, "max_queues"), ({"max_queues": 5, "x": 1}, "x")]:
        got = api.put("/api/queue-limit", json=body, headers=auth())
        assert (got.status_code, got.json()["fields"]) == (422, [field]), (body, got.text)
    assert _queue_limit(db) == 20000
    with client_for(db.dsn(reader_login(db)), writable=True) as client:
        got = client.put("/api/queue-limit", json={"max_queues": 5}, headers=auth())
    assert (got.status_code, got.json()["sqlstate"]) == (403, "42501"), got.text
    assert _queue_limit(db) == 20000


# -- live runtimes and maintenance runs ----------------------------------------------------

PUBLISH = ("select awa.publish_runtime(%s::uuid, %s, %s, %s, '0.1.0', %s, %s::jsonb)")


def _publish(db, login: str, kind: str, host: str, pid: int, in_flight: int,
             activity: list[tuple]) -> str:
    """A snapshot of a new runtime; each activity (queue, what[, age in s, 1])."""
    instance = str(uuid.uuid4())
    with db.connect(login) as conn:
        conn.execute(PUBLISH, [instance, kind, host, pid, in_flight, json.dumps(
            [{"queue": q, "activity": a, "age_seconds": age[0] if age else 1}
             for q, a, *age in activity])])
    return instance


def test_runtimes_lists_every_live_runtime_with_its_queues(db, read_only_api):
    enqueue_jobs(db, "ra", 1)
    enqueue_jobs(db, "rb", 1)
    producer, worker = db.login_roles("awa_producer", "awa_worker")
    p = _publish(db, producer, "producer", "host-1", 11, 0, [("ra", "enqueue")])
    w = _publish(db, worker, "worker", "host-2", 22, 3, [("rb", "claim"), ("ra", "claim")])
    idle = _publish(db, worker, "worker", "host-3", 33, 0, [])
    stale = _publish(db, worker, "worker", "host-4", 44, 0, [("ra", "claim")])
    with db.connect() as conn:
        conn.execute("update awa.runtimes set last_seen = now() - interval '1 minute'"
                     " where instance_id = %s", [stale])
    everything = read_only_api.get("/api/runtimes")
    assert everything.status_code == 200, everything.text
    rows = everything.json()["runtimes"]
    assert [(r["instance_id"], r["kind"], r["hostname"], r["pid"], r["in_flight"],
             [(q["queue"], q["activity"], q["shards"]) for q in r["queues"]]) for r in rows] == [
        (p, "producer", "host-1", 11, 0, [("ra", "enqueue", 1)]),
        (w, "worker", "host-2", 22, 3, [("ra", "claim", 1), ("rb", "claim", 1)]),
        (idle, "worker", "host-3", 33, 0, []),
    ]
    of_ra = read_only_api.get("/api/runtimes?queue=ra").json()
    assert of_ra["queue"] == "ra"
    assert [(r["instance_id"], [q["queue"] for q in r["queues"]])
            for r in of_ra["runtimes"]] == [(p, ["ra"]), (w, ["ra"])]
    unknown = read_only_api.get("/api/runtimes?queue=nope")
    assert (unknown.status_code, unknown.json()["sqlstate"]) == (404, "42704")


def test_maintenance_runs_say_when_each_task_last_ran(db, read_only_api):
    from awa_sql.maintain import TASKS

    with db.connect() as conn:
        conn.execute("update awa.maintenance_runs set last_at = now() - interval '1 hour'")
    with db.connect(db.login_role("awa_maintenance")) as m:
        m.execute("select awa.promote_due()")
    got = read_only_api.get("/api/maintenance-runs")
    assert got.status_code == 200, got.text
    tasks = got.json()["tasks"]
    assert [(t["name"], t["function"], t["default_every_seconds"]) for t in tasks] == [
        (t.name, t.function, t.every) for t in TASKS]
    ages = {t["name"]: t["age_seconds"] for t in tasks}
    assert ages.pop("promote") < 60
    assert all(3600 <= age < 3700 for age in ages.values()), ages
    with db.connect() as conn:
        conn.execute("drop table awa.maintenance_runs cascade")
    older = read_only_api.get("/api/maintenance-runs")
    assert older.status_code == 501, older.text
    assert older.json()["error"] == ("this database records no maintenance runs "
                                     "(awa.maintenance_runs, migration 0034); run awa migrate")


# -- the guard ---------------------------------------------------------------------------

WRITES = [
    ("PUT", "/api/queues/g/enqueue-shards", {"shards": 2}),
    ("PUT", "/api/queues/g/shard-mode", {"mode": "shadow"}),
    ("POST", "/api/queues/g/pause", None),
    ("POST", "/api/queues/g/resume", None),
    ("POST", "/api/queues/g/jobs/retry", {}),
    ("POST", "/api/queues/g/jobs/cancel", {}),
    ("POST", "/api/jobs/1/retry", None),
    ("POST", "/api/jobs/1/cancel", None),
    ("POST", "/api/workers/w/release", None),
    ("POST", "/api/queues/g/drop", {"discard_finished": True}),
    ("PUT", "/api/queue-limit", {"max_queues": 1}),
]


def _ready(db, queue: str) -> int:
    with db.connect() as conn:
        return conn.execute("select count(*) from awa.ready r join awa.queue_meta m"
                            " using (queue_id) where m.queue = %s", [queue]).fetchone()[0]


@pytest.mark.one_version
@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_guard_refuses_without_the_right_token(db, api, method, path, body):
    enqueue_jobs(db, "g", 1)
    for headers in [{}, auth("wrong-token"), {"Authorization": TOKEN},
                    {"Authorization": f"Basic {TOKEN}"}]:
        got = api.request(method, path, json=body, headers=headers)
        assert got.status_code == 403, (headers, got.text)
        assert "token" in got.json()["error"] or "Bearer" in got.json()["error"]
    assert _shards(db, "g") == 1
    assert api.get("/api/queues/g").json()["paused"] is False
    assert _ready(db, "g") == 1  # job 1 is neither cancelled nor retried
    assert _queue_limit(db) == 10000


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_guard_refuses_on_a_read_only_server_even_with_the_token(db, read_only_api,
                                                                 method, path, body):
    enqueue_jobs(db, "g", 1)
    got = read_only_api.request(method, path, json=body, headers=auth())
    assert got.status_code == 403
    assert "read-only" in got.json()["error"]
    assert _shards(db, "g") == 1
    assert _ready(db, "g") == 1
    assert _queue_limit(db) == 10000


def test_writable_server_on_a_reader_login_is_403_from_the_database(db):
    enqueue_jobs(db, "g", 1)
    with client_for(db.dsn(reader_login(db)), writable=True) as client:
        got = client.put("/api/queues/g/enqueue-shards", json={"shards": 2}, headers=auth())
    assert got.status_code == 403
    assert got.json()["sqlstate"] == "42501"
    assert "needs awa_operator to make changes" in got.json()["hint"]


def test_a_login_without_awa_reader_is_403_naming_the_role_it_needs(db):
    """PostgreSQL's message names the schema it refused, not the role."""
    enqueue_jobs(db, "g", 1)
    with client_for(db.dsn(db.login_role(prefix="awa_adm_")), writable=False) as client:
        got = client.get("/api/queues")
        head = client.head("/api/queues/g")
    assert got.status_code == head.status_code == 403, got.text
    assert got.json() == {"error": "permission denied for schema awa", "sqlstate": "42501",
                          "hint": "the admin server's login needs awa_reader to read: "
                                  "grant awa_reader to it"}


def test_writable_server_needs_a_token():
    with pytest.raises(ValueError, match="AWA_ADMIN_TOKEN"):
        client_for("", writable=True, token=None).__enter__()


@pytest.mark.one_version
def test_writable_server_refuses_a_short_token(db):
    dsn = db.dsn(operator_login(db))
    with pytest.raises(ValueError, match="AWA_ADMIN_TOKEN is 15 characters long; a writable "
                       "admin server needs at least 16"):
        client_for(dsn, writable=True, token="x" * 15).__enter__()
    with client_for(dsn, writable=True, token="x" * 16) as api:
        assert api.post("/api/queues/t/pause", headers=auth("x" * 16)).status_code == 404
    result = db.awa("admin", "serve", "--writable", "--port", "0",
                    env={"AWA_ADMIN_TOKEN": "a"}, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "AWA_ADMIN_TOKEN is 1 character long" in result.stderr
    assert "at least 16" in result.stderr and "Traceback" not in result.stderr

def test_guard_is_503_on_a_streaming_standby(cluster):
    if cluster.server is None:
        pytest.skip("the standby is built from the embedded server binaries")
    workdir = scratch.mkdtemp(f"awa-admin-standby-{cluster.major}-")
    with (primary_and_standby(cluster.major, workdir) as (_primary, standby),
          client_for(standby, writable=True) as client):
        assert client.get("/api/server").json()["in_recovery"] is True
        assert client.get("/api/queues/standby-q").status_code == 200  # reads work
        for method, path, body in WRITES:
            got = client.request(method, path.replace("/g/", "/standby-q/"), json=body,
                                 headers=auth())
            assert got.status_code == 503, got.text
            assert "standby" in got.json()["error"]
        # The guard answers first: even a bad token on a standby is 403, not 503.
        assert client.post("/api/queues/standby-q/pause",
                           headers=auth("wrong")).status_code == 403
    shutil.rmtree(workdir, ignore_errors=True)


# -- the command -------------------------------------------------------------------------


@pytest.mark.one_version
def test_awa_admin_serve_binds_localhost_and_serves_the_pages(db):
    import httpx

    enqueue_jobs(db, "cli", 1)
    with serve_cli(db.dsn(reader_login(db))) as base:
        port = int(base.rsplit(":", 1)[1])
        listening = [line.split()[1] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
                     if line.split()[3] == "0A"]
        assert f"0100007F:{port:04X}" in listening  # 127.0.0.1, not 0.0.0.0
        assert httpx.get(f"{base}/api/queues").json()[0]["queue"] == "cli"
        page = httpx.get(f"{base}/queues/cli")
        assert page.status_code == 200 and 'data-writable="false"' in page.text
        assert httpx.get(f"{base}/static/admin.js").status_code == 200
        refused = httpx.post(f"{base}/api/queues/cli/pause", headers=auth())
        assert refused.status_code == 403


@pytest.mark.one_version
def test_awa_admin_serve_writable_without_token_exits_2(db):
    result = db.awa("admin", "serve", "--writable", env={"AWA_ADMIN_TOKEN": ""})
    assert result.returncode == 2
    assert "AWA_ADMIN_TOKEN" in result.stderr


@pytest.mark.one_version
@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_awa_admin_serve_with_an_impossible_port_is_a_clear_error(db, port):
    result = db.awa("admin", "serve", "--port", port, timeout=30)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "port must be" in result.stderr


@pytest.mark.one_version
def test_awa_admin_serve_on_a_taken_port_is_a_clear_error(db):
    with taken_port() as port:
        result = db.awa("admin", "serve", "--port", str(port), timeout=30)
    assert_cannot_listen(result, f"127.0.0.1:{port}")


def test_awa_admin_serve_that_cannot_reach_its_database_exits_7():
    """The exit code of every awa command that cannot connect (docs/migrations.md),
    once the pool has tried for --start-wait: not 3, which says drift."""
    env = {**os.environ}
    env.pop("DATABASE_URL", None)
    with refusing_port() as closed:
        env["AWA_DATABASE_URL"] = f"postgresql://nobody@127.0.0.1:{closed}/none"
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "awa_sql", "admin", "serve", "--port", "0",
             "--start-wait", "2s"],
            env=env, capture_output=True, text=True, timeout=90,
            stdin=subprocess.DEVNULL, check=False)
        waited = time.monotonic() - started
    assert result.returncode == 7, (result.returncode, result.stderr[-2000:])
    assert waited >= 2, waited  # it tried for the time it was given
    assert "Traceback" not in result.stderr, result.stderr
    assert "Connection refused" in result.stderr, result.stderr  # why, from the pool
    assert result.stderr.rstrip().endswith(
        "awa: cannot connect to the database in 2 s (--start-wait)"), result.stderr
    assert "awa admin" not in result.stdout  # no URL for a server that never answered


def test_ctrl_c_while_awa_admin_serve_waits_for_its_database_ends_it_without_a_traceback(
        tmp_path):
    env = {**os.environ}
    env.pop("DATABASE_URL", None)
    log = tmp_path / "stderr"
    with refusing_port() as closed, log.open("w") as stderr:
        env["AWA_DATABASE_URL"] = f"postgresql://nobody@127.0.0.1:{closed}/none"
        # As from a terminal: a process inherits an ignored SIGINT (a pytest-xdist
        # worker ignores it, as a shell does for a job started with &), and
        # Python then leaves it ignored.
        proc = subprocess.Popen(
            [sys.executable, "-c", "import runpy, signal;"
             " signal.signal(signal.SIGINT, signal.default_int_handler);"
             " runpy.run_module('awa_sql', run_name='__main__')",
             "admin", "serve", "--port", "0", "--start-wait", "5m"],
            env=env, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
        try:
            wait_until(lambda: "Connection refused" in log.read_text(), 60,
                       "the pool's first refused connect")
            proc.send_signal(signal.SIGINT)
            code = proc.wait(60)
        finally:
            proc.kill()
            proc.wait()
    said = log.read_text()
    assert code == -signal.SIGINT, said  # ended by the signal: a shell reads 130
    assert "Traceback" not in said, said


def test_awa_admin_serve_waits_30_s_for_its_database_unless_told_otherwise():
    from awa_sql.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["admin", "serve"]).start_wait == 30
    assert parser.parse_args(["admin", "serve", "--start-wait", "2m"]).start_wait == 120


# -- the Host check (DNS rebinding) ------------------------------------------------------

EVERY_ADDRESS = "0.0.0.0"  # noqa: S104 - the wildcard bind is what these tests start


def _personal_job(db) -> int:
    with db.connect() as conn:
        return conn.execute("select (awa.enqueue('rebound', 't', '{\"email\": \"p@example.org\"}'"
                            "::jsonb)).job_id").fetchone()[0]


def _reads(base: str, job_id: int, host: str) -> list:
    """The page, the API and /metrics, read with ``Host: host``."""
    import httpx

    return [httpx.get(f"{base}{path}", headers={"Host": host}, timeout=30)
            for path in ("/", "/queues/rebound", "/api/queues", "/api/queues/rebound",
                         f"/api/jobs/{job_id}", "/metrics")]


@pytest.mark.one_version
def test_awa_admin_serve_refuses_a_host_it_does_not_answer_to(db):
    """A page that rebinds its own name to 127.0.0.1 reads as that name: 400,
    no data; the loopback names read, whatever the port."""
    job_id = _personal_job(db)
    with serve_cli(db.dsn(reader_login(db))) as base:
        port = base.rsplit(":", 1)[1]
        for got in _reads(base, job_id, f"evil.example:{port}"):
            assert got.status_code == 400, got.text
            assert "p@example.org" not in got.text and "rebound" not in got.text
            error = got.json()["error"]
            assert "refused Host 'evil.example'" in error, error
            assert "--allowed-host evil.example" in error and "AWA_ADMIN_ALLOWED_HOSTS" in error
        for host in ("localhost", f"localhost:{port}", "127.0.0.1:1", f"[::1]:{port}", "[::1]"):
            assert [r.status_code for r in _reads(base, job_id, host)] == [200] * 6, host
        assert "p@example.org" in _reads(base, job_id, "LocalHost")[4].text


@pytest.mark.one_version
def test_the_host_check_covers_static_files_the_schema_errors_and_writes(db):
    """Not only the routes that read the database: the script, the schema,
    an unknown path, a method no route takes and a write are all refused
    for a Host the server does not answer to, before the token is asked."""
    import httpx

    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        for method, path in [("GET", "/static/admin.js"), ("GET", "/openapi.json"),
                             ("GET", "/nope"), ("OPTIONS", "/api/queues"),
                             ("POST", "/api/queues/q/pause"), ("GET", "/jobs/0")]:
            got = httpx.request(method, f"{base}{path}", timeout=30,
                                headers={"Host": "evil.example", **auth()})
            assert got.status_code == 400, (method, path, got.text)
            assert "refused Host 'evil.example'" in got.json()["error"]
            assert httpx.request(method, f"{base}{path}", timeout=30).status_code != 400


@pytest.mark.one_version
def test_awa_admin_serve_answers_each_allowed_host_and_no_other(db):
    job_id = _personal_job(db)
    with serve_cli(db.dsn(reader_login(db)), "--allowed-host", "admin.example",
                   "--allowed-host", "*.corp.example") as base:
        for host in ("admin.example", "Admin.Example:443", "a.corp.example", "localhost"):
            assert [r.status_code for r in _reads(base, job_id, host)] == [200] * 6, host
        for host in ("evil.example", "corp.example", "admin.example.evil.example"):
            assert {r.status_code for r in _reads(base, job_id, host)} == {400}, host


@pytest.mark.one_version
def test_awa_admin_serve_on_every_address_answers_any_host_and_warns(db):
    """Bound to 0.0.0.0 with no allowed host (Prometheus scrapes by whatever
    name or address it is given): any Host, and one warning line saying so."""
    output: list[str] = []
    job_id = _personal_job(db)
    with serve_cli(db.dsn(reader_login(db)), "--host", EVERY_ADDRESS, output=output) as base:
        assert [r.status_code for r in _reads(base, job_id, "evil.example")] == [200] * 6
    warnings = [line for line in output if "warning" in line]
    assert len(warnings) == 1, output
    assert "listening on 0.0.0.0 with no allowed host" in warnings[0]
    assert "DNS rebinding" in warnings[0] and "--allowed-host NAME" in warnings[0]
    assert "AWA_ADMIN_ALLOWED_HOSTS" in warnings[0]


@pytest.mark.one_version
def test_awa_admin_serve_on_every_address_with_allowed_hosts_answers_those_only(db):
    output: list[str] = []
    job_id = _personal_job(db)
    with serve_cli(db.dsn(reader_login(db)), "--host", EVERY_ADDRESS, output=output,
                   env={"AWA_ADMIN_ALLOWED_HOSTS": "admin.example, 10.0.0.5"}) as base:
        for host in ("admin.example", "10.0.0.5:8700", "127.0.0.1", EVERY_ADDRESS):
            assert [r.status_code for r in _reads(base, job_id, host)] == [200] * 6, host
        assert {r.status_code for r in _reads(base, job_id, "evil.example")} == {400}
    assert not [line for line in output if "warning" in line], output


@pytest.mark.parametrize(("header", "allowed"), [
    ("localhost", True), ("LOCALHOST.:8700", True), ("127.0.0.1:1", True), ("[::1]", True),
    ("[0:0::1]:8700", True), ("admin.example", True), ("x.corp.example", True),
    ("corp.example", False), ("evil.example", False), ("localhost.evil.example", False),
    ("127.0.0.2", False), ("[::1", False), ("evil example", False), ("", False), (None, False),
])
def test_the_host_check_compares_names_not_ports(header, allowed):
    check = host_check("127.0.0.1", ["admin.example", "*.corp.example"])
    assert check.allows(header) is allowed


@pytest.mark.parametrize(("args", "env"), [
    (["--allowed-host", "admin.example:8700"], {}),
    (["--allowed-host", "evil example"], {}),
    ([], {"AWA_ADMIN_ALLOWED_HOSTS": "ok.example,*bad.example"}),
])
@pytest.mark.one_version
def test_awa_admin_serve_with_a_bad_allowed_host_exits_2(db, args, env):
    result = db.awa("admin", "serve", "--port", "0", *args, env=env, timeout=30)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "is not a host name or address without a port" in result.stderr


@pytest.mark.parametrize(("host", "expected"), [
    ("127.0.0.1", "http://127.0.0.1:8700/"), ("localhost", "http://localhost:8700/"),
    (EVERY_ADDRESS, "http://0.0.0.0:8700/"), ("::1", "http://[::1]:8700/"),
    ("::", "http://[::]:8700/"),
])
def test_the_url_a_server_prints_brackets_an_ipv6_address(host, expected):
    assert url(host, 8700) == expected


def test_an_address_that_cannot_be_bound_is_named_with_ipv6_brackets():
    from awa_sql.listen import CannotListen

    error = CannotListen("::1", 8700, OSError(98, "Address already in use"))
    assert str(error).startswith("cannot listen on [::1]:8700: ")


@pytest.mark.one_version
@needs_ipv6
def test_awa_admin_serve_on_ipv6_prints_a_url_that_answers(db):
    import httpx

    enqueue_jobs(db, "v6", 1)
    with serve_cli(db.dsn(reader_login(db)), "--host", "::1") as base:
        assert re.fullmatch(r"http://\[::1\]:\d+", base), base
        assert httpx.get(f"{base}/api/queues", timeout=30).json()[0]["queue"] == "v6"


# -- the check against cross-site reads ----------------------------------------------------


class _CountingPool:
    """The app's pool, counting the connections its routes take: none taken,
    no query run."""

    def __init__(self, pool) -> None:
        self.pool = pool
        self.taken = 0

    def connection(self, *args, **kwargs):
        self.taken += 1
        return self.pool.connection(*args, **kwargs)


@contextmanager
def _counting_app(dsn: str, scrape_port: int):
    """A TestClient on the app ``awa admin serve`` runs, on a counting pool,
    its /metrics scraping a 'database' at ``scrape_port`` (a socket that
    listens and never answers: a scrape shows as a connection it holds)."""
    settings = Settings(dsn=f"postgresql://awa@127.0.0.1:{scrape_port}/awa?connect_timeout=1",
                        writable=True, token=TOKEN)
    pool = make_pool(Settings(dsn=dsn, writable=True, token=TOKEN), open_now=True)
    counting = _CountingPool(pool)
    try:
        with TestClient(create_served_app(settings, counting)) as client:
            yield client, counting
    finally:
        pool.close()


def _connected(listener: socket.socket) -> bool:
    """Whether anything connected to ``listener`` (its backlog holds it, unaccepted)."""
    listener.settimeout(0.5)
    try:
        listener.accept()[0].close()
    except TimeoutError:
        return False
    return True


# The reads a page could embed to keep the database busy, /metrics, a write.
GUARDED = [("GET", "/api/queues/big/drop/plan?discard_finished=true"),
           ("GET", "/api/failures?limit=1000"),
           ("GET", "/api/queues/big/jobs/retry/plan"),
           ("GET", "/api/queues/big/jobs?limit=1000"),
           ("GET", "/api/queues/big/jobs?state=failed&brief=true"),
           ("HEAD", "/api/queues"), ("GET", "/api/server"), ("GET", "/metrics"),
           ("POST", "/api/queues/big/pause")]


@pytest.mark.one_version
@pytest.mark.parametrize("headers", [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # another port of the same address: not the admin page
    {"Sec-Fetch-Site": "Cross-Site", "Origin": "http://testserver"},
    {"Sec-Fetch-Site": "no-such-value"},
    {"Origin": "http://evil.example"},
    {"Origin": "null"},  # a sandboxed frame, a file: page
    {"Origin": "http://testserver:8700"},  # another port
    {"Origin": "http://testserver.evil.example"},
])
def test_a_read_another_page_made_the_browser_send_is_403_and_runs_no_query(db, headers):
    """An <img src=".../drop/plan"> on any page the operator opens made the
    database read every job of a queue on each load; the page could not read
    the answer, but could keep the database busy. Refused before any route:
    no connection taken from the pool, no scrape started."""
    enqueue_jobs(db, "big", 3)
    with (socket.socket() as listener,
          _counting_app(db.dsn(operator_login(db)), _listen(listener)) as (api, pool)):
        for method, path in GUARDED:
            got = api.request(method, path, headers={**headers, **auth()})
            assert got.status_code == 403, (method, path, got.text)
            if method != "HEAD":
                assert set(got.json()) == {"error"}, got.text
                assert "(the check against cross-site reads)" in got.json()["error"]
                assert "clients that are not browsers (curl" in got.json()["error"]
        assert pool.taken == 0
        assert not _connected(listener)
        assert not _paused(db, "big")
        # The pages read nothing: a link from another site opens them.
        for path in ("/", "/queues/big", "/jobs/1", "/static/admin.js"):
            assert api.get(path, headers=headers).status_code == 200, path
        assert pool.taken == 0


@pytest.mark.parametrize("headers", [
    {},  # curl, scripts, Prometheus
    {"Sec-Fetch-Site": "same-origin"},  # the admin page's own fetches
    {"Sec-Fetch-Site": "none"},  # a URL typed or bookmarked
    {"Origin": "http://testserver"},  # a browser that sends no Sec-Fetch-Site
    {"Origin": "http://TestServer.:80"},
    # Behind a TLS proxy that sends its upstream's address as Host, the
    # page's own Origin names the public host: Sec-Fetch-Site decides.
    {"Sec-Fetch-Site": "same-origin", "Origin": "https://admin.example"},
])
@pytest.mark.one_version
def test_same_origin_and_header_less_requests_are_answered(db, headers):
    enqueue_jobs(db, "big", 3)
    with (socket.socket() as listener,
          _counting_app(db.dsn(operator_login(db)), _listen(listener)) as (api, pool)):
        plan = api.get("/api/queues/big/drop/plan", headers=headers)
        assert plan.status_code == 200, plan.text
        assert plan.json()["counts"]["ready"] == 3, plan.json()
        assert api.get("/api/queues/big/jobs", headers=headers).json()["jobs"]
        assert api.post("/api/queues/big/pause", headers={**headers, **auth()}).json()[
            "changed"] is True
        assert pool.taken >= 3
        scrape = api.get("/metrics", headers=headers)
        assert scrape.status_code == 200 and "awa_up 0.0" in scrape.text
        assert _connected(listener)


def _listen(listener: socket.socket) -> int:
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener.getsockname()[1]


def _paused(db, queue: str) -> bool:
    with db.connect() as conn:
        return conn.execute("select paused from awa.queue_overview where queue = %s",
                            [queue]).fetchone()[0]


@pytest.mark.parametrize(("origin", "host", "same"), [
    ("http://127.0.0.1:8700", "127.0.0.1:8700", True),
    ("http://localhost:8700", "127.0.0.1:8700", False),
    ("http://127.0.0.1:3000", "127.0.0.1:8700", False),
    ("http://[::1]:8700", "[0:0::1]:8700", True),
    ("https://admin.example", "admin.example", True),
    ("https://admin.example", "admin.example:443", True),
    ("http://admin.example", "admin.example:443", False),
    ("HTTP://Admin.Example.", "admin.example", True),
    ("http://admin.example:8080", "admin.example", False),
    ("http://admin.example/", "admin.example", False),  # an origin has no path
    ("http://u@admin.example", "admin.example", False),
    ("ftp://admin.example", "admin.example", False),
    ("null", "admin.example", False),
    ("http://admin.example:99999", "admin.example", False),
    ("http://admin.example", None, False),
    ("http://admin.example", "", False),
])
def test_an_origin_is_the_servers_own_when_it_names_its_host_and_port(origin, host, same):
    assert sites.same_origin(origin, host) is same


@pytest.mark.one_version
def test_awa_admin_serve_refuses_a_cross_site_read_and_answers_curl(db):
    """As served: the Host check first, then the cross-site check, on the API
    and /metrics; the page itself opens from a link on another site."""
    import httpx

    job_id = _personal_job(db)
    with serve_cli(db.dsn(reader_login(db))) as base:
        for path in ("/api/queues/rebound", f"/api/jobs/{job_id}", "/metrics"):
            got = httpx.get(f"{base}{path}", headers={"Sec-Fetch-Site": "cross-site"},
                            timeout=30)
            assert got.status_code == 403, (path, got.text)
            assert "p@example.org" not in got.text and "awa_up" not in got.text
            assert got.json()["error"].startswith(
                "refused a request with Sec-Fetch-Site: cross-site: a page other than this "
                "server's own made the browser send it"), got.text
            rebound = httpx.get(f"{base}{path}", timeout=30, headers={
                "Sec-Fetch-Site": "cross-site", "Host": "evil.example"})
            assert rebound.status_code == 400  # the Host check comes first
        assert httpx.get(f"{base}/queues/rebound", timeout=30,
                         headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200
        assert [r.status_code for r in _reads(base, job_id, "localhost")] == [200] * 6


# -- schemathesis: the OpenAPI schema against the app ------------------------------------


@pytest.mark.one_version
def test_openapi_schema_finds_no_server_error(db):
    """Every operation, bounded examples, derandomized: statuses, bodies and
    content types match the schema, and nothing answers 5xx. Half the cases
    name the one queue that exists, so writes with the token reach the database.
    Against one version: what it fuzzes is the app's (ADR 051); the functions
    behind it take bad input on both versions in tests/test_fuzz_inputs.py."""
    enqueue_jobs(db, "fuzz", 1)
    with shared_pool_app(db.dsn(operator_login(db)), writable=True) as app:
        api_schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [result.ok() for result in api_schema.get_all_operations()]
        assert len(operations) == 23
        for operation in operations:

            @given(case=operation.as_strategy(), existing=st.booleans())
            @settings(max_examples=15, derandomize=True, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case, existing):
                if existing and case.path_parameters and "queue" in case.path_parameters:
                    case.path_parameters["queue"] = "fuzz"
                if existing and case.path_parameters and "job_id" in case.path_parameters:
                    case.path_parameters["job_id"] = 1
                # S outside 1..64 is schema-valid (the database owns the range) and
                # answered 400, which this one check would call a rejection.
                case.call_and_validate(headers=auth(),
                                       excluded_checks=[positive_data_acceptance])

            check()


# -- the runbook ---------------------------------------------------------------------------

RUNBOOK = ROOT / "docs" / "operations.md"
CODE = re.compile(r"`([^`]+)`")
API_CALL = re.compile(r"^(GET|POST|PUT) (/api/\S+)$")


def _runbook_steps() -> list[tuple[str, str, str]]:
    """(step, CLI cell, API cell) of the table in "When an alert fires"."""
    section = RUNBOOK.read_text().split("## When an alert fires", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| step", "|---"))]
    return [(step.strip("| "), cli, api_cell.strip("| ")) for step, cli, api_cell in rows]


def _route_for(schema: dict, method: str, target: str) -> str | None:
    """The path of the OpenAPI ``schema`` that answers ``method target``: the
    first that matches, in the router's order, as the router picks it; its
    query parameters must be the route's."""
    from urllib.parse import parse_qsl, unquote, urlsplit

    parts = urlsplit(target)
    for path, operations in schema["paths"].items():
        pattern = re.sub(r"\\\{\w+\\\}", ".+", re.escape(path))
        if re.fullmatch(pattern, unquote(parts.path)):
            if method.lower() not in operations:
                continue
            taken = {p["name"] for p in operations[method.lower()].get("parameters", ())
                     if p["in"] == "query"}
            unknown = {k for k, _ in parse_qsl(parts.query)} - taken
            assert not unknown, f"{method} {target}: {path} takes no {unknown}"
            return path
    return None


def _body_type(method: str, path: str):
    """The type the API's route ``method path`` (an OpenAPI path) reads its
    body as (its model, or the model or None for an optional body); None for
    a route that takes none."""
    from awa_sql.admin.routes import router

    (route,) = [r for r in router.routes if r.path_format == path and method in r.methods]
    params = route.dependant.body_params
    return params[0].field_info.annotation if params else None


def test_every_runbook_step_names_a_command_and_an_api_call_that_exist():
    """The table of "When an alert fires" (docs/operations.md): every step
    has a CLI command and an API call; each command parses as `awa` parses
    it, each call is a route of the admin app with the query parameters it
    takes, and each body given after a call is one the route accepts."""
    from pydantic import TypeAdapter

    from awa_sql.admin.app import Settings, create_app
    from awa_sql.cli import build_parser

    steps = _runbook_steps()
    assert len(steps) >= 15, steps
    schema = create_app(Settings(dsn="", writable=False)).openapi()
    parser = build_parser()
    for step, cli, api_cell in steps:
        commands = [c for c in CODE.findall(cli) if c.startswith("awa ")]
        assert commands, f"{step}: no CLI command"
        assert not cli.startswith("—") and not api_cell.startswith("—"), step
        for command in commands:
            try:
                parser.parse_args(command.split()[1:])
            except SystemExit as exit_:
                raise AssertionError(f"{step}: `{command}` does not parse") from exit_
        route = None
        calls = 0
        for code in CODE.findall(api_cell):
            if (match := API_CALL.match(code)) is not None:
                method, target = match.groups()
                path = _route_for(schema, method, target)
                assert path is not None, f"{step}: no route {code}"
                route, calls = (method, path), calls + 1
            elif code.startswith("{"):
                assert route is not None, f"{step}: a body {code} before any call"
                body_type = _body_type(*route)
                assert body_type is not None, f"{step}: {route} takes no body, got {code}"
                TypeAdapter(body_type).validate_python(json.loads(code))
        assert calls, f"{step}: no API call"


# -- the last hour -----------------------------------------------------------------------


def test_history_from_the_samples_with_the_changes_of_s(db, read_only_api):
    enqueue_jobs(db, "h", 3)
    enqueue_jobs(db, "plain", 1)
    with db.connect() as conn:
        conn.execute("select awa.set_shard_mode('h', 'shadow', 8)")
        conn.execute("select awa.autoscale_tick()")
        enqueue_jobs(db, "h", 10)
        conn.execute("select awa.autoscale_tick()")
        conn.execute("select awa.set_enqueue_shards('h', 4)")
        enqueue_jobs(db, "h", 10)
        conn.execute("select awa.autoscale_tick()")
        # A sample taken alone counts nothing; the next tick's rate runs from
        # the tick before it, over all 7 enqueues.
        conn.execute("select awa.sample_lane_contention()")
        enqueue_jobs(db, "h", 7)
        conn.execute("select awa.autoscale_tick()")
        ticks = [r[0] for r in conn.execute(
            "select sampled_at from awa.queue_history where queue = 'h'"
            " and enqueued is not null order by sampled_at")]
    got = read_only_api.get("/api/queues/h/history")
    assert got.status_code == 200, got.text
    h = got.json()
    assert (h["queue"], h["shard_mode"], h["max_shards"]) == ("h", "shadow", 8)
    points = h["points"]
    assert [p["shards"] for p in points] == [1, 1, 4, 4, 4]
    assert [p["ready"] for p in points] == [3, 13, 23, None, 30]
    assert points[0]["enqueue_rate"] is None  # no sample before it
    assert points[3]["enqueue_rate"] is None  # taken alone
    assert all(points[i]["enqueue_rate"] > 0 for i in (1, 2, 4))
    assert points[4]["enqueue_rate"] == pytest.approx(
        7 / (ticks[3] - ticks[2]).total_seconds(), rel=1e-6)
    assert all(p["waiters_per_held_lane"] == 0 for p in points)
    assert all(points[i]["lag_seconds"] > 0 for i in (0, 1, 2, 4))
    assert [(c["old_shards"], c["new_shards"], c["source"]) for c in h["changes"]] == [
        (1, 4, "manual")]
    assert h["since"] < points[0]["at"] < h["changes"][0]["at"] < points[2]["at"] < h["until"]
    # A manual queue is sampled too, but its ready depth is not counted.
    plain = read_only_api.get("/api/queues/plain/history").json()
    assert [p["ready"] for p in plain["points"]] == [None] * 5
    assert [p["shards"] for p in plain["points"]] == [1] * 5 and plain["changes"] == []
    assert read_only_api.get("/api/queues/nope/history").status_code == 404
    assert read_only_api.get("/api/queues/h/history?minutes=61").status_code == 422


def test_detail_shows_folded_holds_once_with_their_count(db, read_only_api):
    enqueue_jobs(db, "f", 1)
    with db.connect() as conn:
        conn.execute("select awa.set_shard_mode('f', 'shadow', 8)")
        for _ in range(4):
            conn.execute("select awa.autoscale_tick()")
    decisions = read_only_api.get("/api/queues/f").json()["decisions"]
    # Two ticks short of the 3 samples needed, then two steady ones: newest first.
    assert [(d["action"], d["repeats"]) for d in decisions] == [("held", 2), ("held", 2)]
    assert decisions[0]["reason"].startswith("steady")
    assert "3 needed" in decisions[1]["reason"]
    assert all(d["last_decided_at"] > d["decided_at"] for d in decisions)


def test_a_pooled_connection_the_server_closed_is_replaced_before_a_request(db, read_only_api):
    """After a server restart (or a proxy's idle timeout) the first request
    answered 500 with the dead connection's error."""
    assert read_only_api.get("/api/queues").status_code == 200
    with db.connect() as admin:
        killed = admin.execute(
            "select count(pg_terminate_backend(pid, 10000)) from pg_stat_activity"
            " where application_name = 'awa-admin' and datname = current_database()"
        ).fetchone()[0]
    assert killed >= 1
    assert read_only_api.get("/api/queues").status_code == 200


def test_a_job_due_past_year_9999_does_not_fail_its_queue_s_pages(db, read_only_api):
    """Stored before enqueues refused such times (ADR 043): psycopg could
    not load it, and every list of its queue answered 500."""
    with db.connect() as su:
        job = su.execute("select (awa.enqueue('farq', 'k', run_at => '2999-01-01')).job_id"
                         ).fetchone()[0]
        su.execute("update awa.scheduled set run_at = 'infinity' where job_id = %s", [job])
    listed = read_only_api.get("/api/queues/farq/jobs")
    assert listed.status_code == 200, listed.text
    assert job in [j["job_id"] for j in listed.json()["jobs"]]
    shown = read_only_api.get(f"/api/jobs/{job}")
    assert shown.status_code == 200, shown.text
    assert shown.json()["run_at"].startswith("9999-12-31")


def test_an_unknown_route_or_method_answers_as_every_error_does(api):
    """Errors are {"error": ...} (docs/admin.md), those of routing too: a
    client reads one shape, not FastAPI's {"detail": ...} for these two."""
    missing = api.get("/api/no-such-thing")
    assert missing.status_code == 404
    assert missing.json() == {"error": "no such route: GET /api/no-such-thing"}
    wrong = api.delete("/api/queues")
    assert wrong.status_code == 405
    assert wrong.json()["error"] == "method DELETE not allowed on /api/queues"
    assert "GET" in wrong.headers["allow"]


def test_head_is_answered_as_get_without_the_body(db, api):
    """Uptime checks and proxies probe with HEAD: every page and read answers
    it with GET's status and headers (the page's CSP too), and no body."""
    enqueue_jobs(db, "headq", 1)
    for path in ("/", "/queues/headq", "/api/server", "/api/queues", "/openapi.json"):
        got, head = api.get(path), api.head(path)
        assert (head.status_code, head.content) == (200, b""), path
        assert got.status_code == 200 and got.content, path
        same = ("content-type", "content-security-policy", "x-frame-options")
        assert {k: head.headers.get(k) for k in same} == {k: got.headers.get(k) for k in same}
        if "content-length" in got.headers:
            assert "content-length" in head.headers, path
            if not path.startswith("/api/"):  # a read's numbers change between two calls
                assert head.headers["content-length"] == got.headers["content-length"], path
    missing = api.head("/api/no-such-thing")
    assert (missing.status_code, missing.content) == (404, b"")
    # A route that takes no GET answers HEAD as it answers GET.
    wrong = api.head("/api/jobs/1/retry")
    assert wrong.status_code == 405 and wrong.content == b""
    assert "POST" in wrong.headers["allow"]


def test_a_partitions_name_finds_its_stripes_in_every_read_by_name(db, logins, read_only_api):
    """A partition's stripes name the logical queue in the overviews
    (logical_queue), not the partition: a read by the partition's name
    found the partition's own row and none of its stripes. Every read by
    name goes by awa.covered_queues, what a claim or a pause covers."""
    from awa_sql import runtimes, shards

    with db.connect() as su:
        su.execute("select awa.set_queue_partitions('pw', 2)")
        su.execute("select awa.set_queue_stripes('pw__p1', 2)")
    part = ["pw__p1", "pw__p1#0", "pw__p1#1"]
    with db.connect(logins.reader) as r:
        covered = "select array(select awa.covered_queues(%s))"
        assert r.execute(covered, ["pw__p1"]).fetchone()[0] == part
        assert r.execute(covered, ["pw"]).fetchone()[0] == ["pw", *part]
        assert r.execute(covered, ["pw__p1#0"]).fetchone()[0] == ["pw__p1#0"]
        assert r.execute(covered, ["nope"]).fetchone()[0] == []
        assert r.execute(covered, [None]).fetchone()[0] == []
        assert [q.queue for q in shards.show(r, "pw__p1")] == part
        assert all(q.lanes for q in shards.show(r, "pw__p1"))
    with db.connect(logins.operator) as op:
        assert op.execute("select array(select awa.covered_queues('pw__p1'))").fetchone()[0] == part
    with db.connect(logins.producer) as p, pytest.raises(psycopg.errors.InsufficientPrivilege):
        p.execute("select awa.covered_queues('pw')")
    instance = _publish(db, logins.worker, "worker", "h", 42, 0, [("pw__p1#1", "claim")])
    with db.connect(logins.reader) as r:
        assert [rt["instance_id"] for rt in runtimes.live(r, "pw__p1")] == [instance]
    detail = read_only_api.get("/api/queues/pw__p1").json()
    assert [q["queue"] for q in detail["physical_queues"]] == part
    assert {ln["queue"] for ln in detail["lanes"]} == set(part)
    assert [(rt["instance_id"], rt["queue"], rt["activity"])
            for rt in detail["runtimes"]["live"]] == [(instance, "pw__p1#1", "claim")]
    listed = read_only_api.get("/api/runtimes", params={"queue": "pw__p1"}).json()
    assert [rt["instance_id"] for rt in listed["runtimes"]] == [instance]


def test_the_queue_pages_runtimes_are_a_line_per_runtime_and_activity_over_its_queues(
        db, logins, read_only_api):
    """A striped queue: its jobs and its runtimes' rows are on the stripes.
    The page lists each runtime once per activity (how many of the queue's
    physical queues, the latest one), counts the producers that enqueued to
    any of them with the new S since the change, and sums the lanes'
    evidence over every queue the change made."""
    with db.connect() as su:
        su.execute("select awa.set_queue_stripes('st', 2)")
        su.execute("select awa.set_enqueue_shards('st', 4)")
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('st', 'k', ordering_key => n::text::bytea)"
                  " from generate_series(1, 20) as n")
    on_s = _publish(db, logins.producer, "producer", "h1", 42, 0,
                    [("st#0", "enqueue", 1), ("st#1", "enqueue", 0)])
    before = _publish(db, logins.producer, "producer", "h2", 42, 0, [("st#1", "enqueue", 3600)])
    worker = _publish(db, logins.worker, "worker", "h3", 42, 0,
                      [("st#0", "claim", 0), ("st", "poll", 0)])
    detail = read_only_api.get("/api/queues/st").json()["runtimes"]
    assert [(r["instance_id"], r["activity"], r["queue"], r["queues"], r["shards"])
            for r in detail["live"]] == [
        (on_s, "enqueue", "st#1", 2, 4), (before, "enqueue", "st#1", 1, 1),
        (worker, "claim", "st#0", 1, 4), (worker, "poll", "st", 3, 4)]
    assert {k: detail["producers"][k] for k in ("live", "on_current_s", "shards")} == {
        "live": 2, "on_current_s": 1, "shards": 4}
    evidence = detail["lane_evidence"]
    assert (evidence["shards"], evidence["enqueues_since"]) == (4, 20), evidence
    assert evidence["below_s"] == 20
