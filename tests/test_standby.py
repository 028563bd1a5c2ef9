"""awa against a hot standby: a real streaming replica of the suite's cluster
(tests/support/standby.py), one per module and PostgreSQL version.

Dashboards, exporters and read-only tools are pointed at replicas, and after
a failover a maintenance runner or a worker sometimes is too. Reads work
there as on the primary, once the standby has replayed what they read;
writes fail with SQLSTATE 25006, which awa turns into a message that says
what is wrong: the database is a standby, and the primary is where to point.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from awa_sql import worker as worker_module
from awa_sql.client import Producer
from awa_sql.metrics import database_registry, render
from awa_sql.worker import Worker
from tests.support import scratch
from tests.support.admin import client_for, operator_login
from tests.support.jobs import claim
from tests.support.maintain import MaintainProcess
from tests.support.standby import Standby, start_standby
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def standby(cluster) -> Iterator[Standby]:
    if cluster.server is None:
        pytest.skip("a standby of the suite's own servers only; this one came from a DSN or "
                    "a container")
    workdir = scratch.mkdtemp(f"awa-sql-standby{cluster.major}-")
    s = start_standby(cluster, workdir)
    yield s
    s.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _last_runs(conn) -> dict[str, object]:
    return dict(conn.execute("select name, last_at from awa.maintenance_runs").fetchall())


def _age_runs(admin) -> None:
    admin.execute("update awa.maintenance_runs set last_at = '2000-01-01'")


# -- maintenance ----------------------------------------------------------------------

# The maintenance calls that write nothing when they find nothing to do (0
# or no rows): a read-only transaction, and a standby, may make them. The
# others take a lock or write whatever they find, and fail 25006 there.
IDLE_READS_ONLY = ("awa.move_staged()", "awa.compact_lane_hints()", "awa.compact_ready()",
                   "awa.compact_scheduled()", "awa.retire_lanes()", "awa.finish_drops()")


def test_an_idle_maintenance_call_in_a_read_only_transaction_records_no_run(db, logins):
    """A read-only transaction can write no record of a run, and its call did
    no maintenance: awa._note_run leaves awa.maintenance_runs alone there,
    where its update failed the call with 25006."""
    with db.connect() as admin, db.connect(logins.maintenance) as m:
        _age_runs(admin)
        for call in IDLE_READS_ONLY:
            with m.transaction():
                m.execute("set transaction read only")
                assert m.execute(f"select * from {call}").fetchall() in ([(0,)], []), call
        assert {at.year for at in _last_runs(admin).values()} == {2000}


def test_an_idle_maintenance_call_on_a_standby_records_no_run(db, logins, standby):
    with db.connect() as admin:
        _age_runs(admin)
    standby.caught_up()
    with standby.connect(db.name, logins.maintenance) as m:
        for call in IDLE_READS_ONLY:
            assert m.execute(f"select * from {call}").fetchall() in ([(0,)], []), call
    with standby.connect(db.name) as admin:
        assert {at.year for at in _last_runs(admin).values()} == {2000}


def test_retirement_and_drops_with_work_pending_do_nothing_on_a_standby(db, logins, standby):
    """Lanes above a lowered S and a drop pending: awa.retire_lanes read the
    unlogged claim hints there (0A000) and awa.finish_drops locked rows
    (25006); both leave the work to the primary now."""
    with db.connect(logins.operator) as op, db.connect(logins.producer) as p:
        op.execute("select awa.set_enqueue_shards('narrowed', 8)")
        p.execute("select awa.enqueue('narrowed', 'k')")
        op.execute("select awa.set_enqueue_shards('narrowed', 1)")
        op.execute("select awa.set_enqueue_shards('gone', 1)")
        op.execute("select awa.drop_queue('gone')")
    standby.caught_up()
    with standby.connect(db.name, logins.maintenance) as m:
        assert m.execute("select awa.retire_lanes()").fetchall() == [(0,)]
        assert m.execute("select * from awa.finish_drops()").fetchall() == []
    with db.connect(logins.maintenance) as m:
        assert [r[0] for r in m.execute("select * from awa.finish_drops()").fetchall()] == [
            "gone"]


def workload(db, logins) -> None:
    """Jobs in every state, on the primary."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('wide', 4)")
    with db.connect(logins.producer) as p:
        for i in range(6):
            p.execute("select awa.enqueue('sb', 'k', ordering_key => %s)", [f"k{i}".encode()])
            p.execute("select awa.enqueue('wide', 'k', priority => %s::smallint)", [1 + i % 4])
        p.execute("select awa.enqueue('sb', 'later', run_at => now() + interval '1 day')")
        p.execute("select awa.enqueue('dead', 'k', max_attempts => 1)")
    with db.connect(logins.worker) as w:
        done, _held = claim(w, ["sb"], 2)
        w.execute("select awa.complete(%s, %s)", done[:2])
        (dead,) = claim(w, ["dead"], 1)
        w.execute("select awa.fail(%s, %s, 'boom')", dead[:2])
    with db.connect(logins.maintenance) as m:
        m.execute("select count(*) from awa.autoscale_tick()")


def samples(text: bytes) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}


# What a standby's scrape says of itself, not of the primary: its own
# statistics and snapshots, and times that move between two scrapes.
OWN_OR_MOVING = ("awa_table_dead_tuples", "awa_xmin_horizon_age_transactions",
                 "awa_queue_lag_seconds", "awa_lane_lag_seconds",
                 "awa_lane_contention_last_sample_age_seconds", "awa_scrape_duration_seconds")
# A sequence on a standby reads as the primary last logged it: up to 32
# (PostgreSQL's SEQ_LOG_VALS) past the value the primary handed out.
SEQUENCE_LOGGED_AHEAD = 32


def test_the_exporter_on_a_standby_scrapes_what_the_primary_does(db, logins, standby):
    """awa_up is 1, and once the standby has replayed, every number the
    primary's scrape gives is the same there, the terminal counters aside
    (read from sequences: at most 32 ahead). The depths were read from
    the lanes' sequences too: 31 ready for a lane of 4."""
    workload(db, logins)
    standby.caught_up()
    with db.connect(logins.reader) as on_primary:
        primary = samples(render(on_primary)[0])
    replica = samples(generate_latest(database_registry(standby.dsn(db.name, logins.reader))))
    assert replica.pop(("awa_up", ())) == 1
    assert primary.pop(("awa_up", ())) == 1
    assert primary[("awa_queue_depth", (("logical_queue", "sb"), ("queue", "sb")))] == 4
    assert primary[("awa_queue_depth", (("logical_queue", "wide"), ("queue", "wide")))] == 6
    for key in set(primary) | set(replica):
        if key[0] in OWN_OR_MOVING:
            continue
        if key[0] == "awa_queue_finished_total":
            assert 0 <= replica[key] - primary[key] <= SEQUENCE_LOGGED_AHEAD, key
            continue
        assert replica.get(key) == primary.get(key), key


def test_the_admin_reads_answer_on_a_standby_as_on_the_primary(db, logins, standby):
    """Every read route and page answers there; what it reads from rows is
    the primary's, once replayed. Times move between the two reads (a bulk
    plan's bound is the clock's), and the terminal counters and next
    lane_seq come from sequences (up to 32 ahead)."""
    workload(db, logins)
    login = operator_login(db)
    standby.caught_up()
    with db.connect() as su:
        job = su.execute("select job_id from awa.jobs('dead', 'failed')").fetchone()[0]
    same = ["/api/queues/sb/jobs", "/api/queues/dead/jobs?state=failed",
            "/api/queues/dead/jobs/retry/plan", "/api/queues/sb/jobs/cancel/plan",
            "/api/queues/wide/enqueue-shards/plan?shards=2", "/api/failures",
            "/api/queues/sb/drop/plan?discard_finished=true", "/api/queue-limit",
            f"/api/jobs/{job}", "/", "/queues/sb", f"/jobs/{job}"]
    with client_for(db.dsn(login), writable=False) as primary, \
            client_for(standby.dsn(db.name, login), writable=False) as replica:
        for route in same:
            got = replica.get(route)
            assert got.status_code == 200, (route, got.text)
            want = primary.get(route)
            if "/jobs/" in route and route.endswith("/plan"):
                # A bulk plan's bound is the server's clock as it counts.
                assert got.json()["before"] and want.json()["before"]
                assert _without_before(got) == _without_before(want), route
                continue
            assert got.text == want.text, route
        assert replica.get("/api/server").json()["in_recovery"] is True
        assert replica.get("/api/queues/sb/history").status_code == 200
        for moving in ("/api/runtimes", "/api/maintenance-runs"):  # ages move
            assert replica.get(moving).status_code == 200, moving
        listed = {q["queue"]: q for q in replica.get("/api/queues").json()}
        assert {q: (v["ready"], v["running"], v["scheduled"]) for q, v in listed.items()} == {
            q["queue"]: (q["ready"], q["running"], q["scheduled"])
            for q in primary.get("/api/queues").json()}
        lanes = [(lane["priority"], lane["shard"], lane["ready"])
                 for lane in replica.get("/api/queues/wide").json()["lanes"]]
        assert lanes == [(lane["priority"], lane["shard"], lane["ready"])
                         for lane in primary.get("/api/queues/wide").json()["lanes"]]


def _without_before(answer) -> dict:
    data = answer.json()
    data.pop("before")
    return data


def awa_on(standby: Standby, db, *args: str, user: str | None = None, check: bool = False):
    return db.awa(*args, env={"AWA_DATABASE_URL": standby.dsn(db.name, user)}, check=check)


# Every command that writes, as an operator would point it at a standby.
CLI_WRITES = [
    ("jobs", "cancel", "{job}", "--yes"),
    ("jobs", "retry", "{dead}", "--yes"),
    ("jobs", "retry", "--queue", "dead", "--yes"),
    ("jobs", "release-worker", "w"),
    ("storage", "pause", "sb"),
    ("storage", "resume", "sb"),
    ("storage", "set-enqueue-shards", "--queue", "sb", "--shards", "4", "--yes"),
    ("storage", "drop", "sb", "--yes"),
    ("storage", "queue-limit", "20000"),
]


@pytest.mark.one_version
def test_the_cli_reads_on_a_standby_and_says_a_write_needs_the_primary(db, logins, standby):
    """The read commands answer as on the primary; each write exits 7 with
    one line naming the standby and what to do, not the PL/pgSQL context of
    the statement that failed."""
    workload(db, logins)
    login = operator_login(db)
    standby.caught_up()
    with db.connect() as su:
        job = su.execute("select job_id from awa.jobs('sb', 'ready') limit 1").fetchone()[0]
        dead = su.execute("select job_id from awa.jobs('dead', 'failed')").fetchone()[0]
    for args, user in ((["status"], None), (["storage", "show"], login),
                       (["storage", "queue-limit"], login), (["runtimes"], login),
                       (["maintain", "--show"], login)):
        got = awa_on(standby, db, *args, user=user)
        assert got.returncode == 0, got.stderr
    for args in (["jobs", "list", "--queue", "sb"], ["jobs", "show", str(dead)],
                 ["jobs", "failures"]):
        got = awa_on(standby, db, *args, user=login)
        assert got.returncode == 0, got.stderr
        assert got.stdout == db.awa(*args, user=login).stdout, args
    # Nothing to apply: awa migrate only reads, and says so.
    assert "up to date" in awa_on(standby, db, "migrate", check=True).stdout
    for args, user in [*((w, login) for w in CLI_WRITES),
                       (("storage", "autoscale", "run", "--once"), logins.maintenance)]:
        args = [a.format(job=job, dead=dead) for a in args]
        got = awa_on(standby, db, *args, user=user)
        assert got.returncode == 7, (args, got.stdout, got.stderr)
        said = got.stderr.strip().splitlines()[-1]
        assert said.startswith(f"awa: the server at 127.0.0.1:{standby.server.port} is a hot "
                               "standby"), (args, got.stderr)
        assert "[25006]" in said and "target_session_attrs=read-write" in said, said
        assert "CONTEXT" not in got.stderr and "Traceback" not in got.stderr, got.stderr
    with db.connect() as su:  # and nothing changed on the primary
        assert su.execute("select count(*) from awa.jobs('sb', 'ready')").fetchone()[0] == 4


def test_awa_maintain_on_a_standby_says_so_once_and_waits_for_a_primary(db, logins, standby):
    """Every pass failed 25006 (the pass lock is a row), logged once per task
    under the name of the task's function, and the loop kept its connection
    to the standby for good. It says what is wrong once, makes no pass, and
    connects again with back-off: a primary it reaches then gets its passes."""
    standby.caught_up()
    with MaintainProcess(standby.dsn(db.name, logins.maintenance), "--promote-every",
                         "100ms") as m:
        m.wait_for_log("is a hot standby")
        m.wait_for_log("the server still takes no writes; connecting again in 1.0 s")
        assert m.passes("promote") == 0
        code, _ = m.stop()
        assert code == 0, m.log()
    said = [line for line in m.log().splitlines() if "WARNING" in line]
    assert len(said) == 1, m.log()
    assert (f"the server at 127.0.0.1:{standby.server.port} is a hot standby (in recovery):"
            " maintenance writes, and only the primary takes writes; point the DSN at the"
            " primary") in said[0]


def test_a_worker_on_a_standby_says_so_once_and_claims_nothing(db, logins, standby, caplog,
                                                               monkeypatch):
    """Each claim failed 25006, logged at every retry ("cannot execute
    INSERT in a read-only transaction"), on the same connection for good.
    Now one line names the standby; the claimer connects again with
    back-off, and nothing changes on the primary."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('onsb', 'k')")
    standby.caught_up()
    claimer_connects = []

    def connect(*args, **kwargs):
        if kwargs.get("application_name") == "awa-sql worker claimer":
            claimer_connects.append(time.monotonic())
        return real_connect(*args, **kwargs)

    real_connect = worker_module.connect
    monkeypatch.setattr(worker_module, "connect", connect)
    worker = Worker(standby.dsn(db.name, logins.worker), queues=["onsb"],
                    handlers={"k": lambda job: None}, poll_interval=0.05, snapshot_every=0.1)
    thread = threading.Thread(target=worker.run)
    with caplog.at_level(logging.WARNING):
        thread.start()
        try:
            wait_until(lambda: any(r.getMessage().startswith("queue onsb:")
                                   for r in list(caplog.records)), 20, "the claimer's line")
            # Three tries at least, each on a new connection (0.5 s, then 1 s apart).
            wait_until(lambda: len(claimer_connects) >= 3, 20, "the claimer to connect again")
        finally:
            worker.stop()
            thread.join(10)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    claims = [m for m in said if m.startswith("queue onsb:")]
    assert claims == [
        f"queue onsb: the server at 127.0.0.1:{standby.server.port} is a hot standby (in"
        " recovery): a worker writes, and only the primary takes writes; point the DSN at the"
        " primary (given several hosts, target_session_attrs=read-write picks it); no claim"
        " runs until it takes writes: connecting again in 0.5 s, then with back-off up to"
        " 30 s"], said
    assert [m for m in said if m.startswith("runtime snapshot failed")] == [
        f"runtime snapshot failed: the server at 127.0.0.1:{standby.server.port} is a hot"
        " standby (in recovery): a runtime snapshot writes, and only the primary takes writes;"
        " point the DSN at the primary (given several hosts, target_session_attrs=read-write"
        " picks it)"], said
    first, second, third = claimer_connects[:3]
    assert second - first >= 0.5 - 0.01 and third - second >= 1.0 - 0.01  # the back-off
    assert worker.completed == worker.failed == worker.claims == 0
    with db.connect() as su:
        assert su.execute("select count(*) from awa.jobs('onsb', 'ready')").fetchone()[0] == 1


def test_a_producer_on_a_standby_is_refused_at_once_and_starts_nothing(db, logins, standby):
    standby.caught_up()
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as refused:
        Producer(standby.dsn(db.name, logins.producer))
    assert str(refused.value) == (
        f"the server at 127.0.0.1:{standby.server.port} is a hot standby (in recovery): a"
        " Producer writes, and only the primary takes writes; point the DSN at the primary"
        " (given several hosts, target_session_attrs=read-write picks it)")
    assert refused.value.sqlstate == "25006"
    assert {t.name for t in threading.enumerate()} == before  # no runtime publisher
    # Given a connection, it is used as it is: each call fails 25006 and
    # leaves the connection usable, its transaction rolled back.
    with standby.connect(db.name, logins.producer) as conn:
        conn.autocommit = False
        producer = Producer(conn=conn, snapshot_every=None)
        for call in (lambda: producer.enqueue("k", queue="onsb"),
                     lambda: producer.enqueue_many([{"kind": "k"}], queue="onsb"),
                     lambda: producer.enqueue_many_copy([{"kind": "k"}], queue="onsb")):
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                call()
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
