"""`awa maintain` (issue 29): the real process, on PostgreSQL 17 and 18, as
logins that hold only awa_maintenance (and, for the jobs, the other roles)."""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from awa_sql import migrate
from awa_sql.demo import embedded
from awa_sql.maintain import TASKS
from awa_sql.roles import Roles
from awa_sql.worker import Worker
from tests.support import scratch
from tests.support.cluster import TEST_SETTINGS
from tests.support.maintain import AWA, MaintainProcess
from tests.support.pgbouncer import Pooled, log_problems, mark
from tests.support.ports import assert_cannot_listen, needs_ipv6, taken_port
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


def claim(conn, queue: str, lease: str = "5 minutes") -> list[tuple]:
    return conn.execute(
        "select job_id, run_lease, attempt from awa.claim(%s::text[], 10, 'w', %s::interval)",
        [[queue], lease]).fetchall()


def count(conn, table: str, queue: str | None = None) -> int:
    query = sql.SQL("select count(*) from {}").format(sql.Identifier("awa", table))
    if queue is not None:
        query += sql.SQL(" where queue_id = (select queue_id from awa.queue_meta"
                         " where queue = {})").format(sql.Literal(queue))
    return conn.execute(query).fetchone()[0]


def schedule(conn, queue: str, jobs: int = 1, ahead: str = "2 seconds",
             key: bytes | None = None) -> None:
    conn.execute("select awa.enqueue(%s, 'k', ordering_key => %s,"
                 " run_at => now() + %s::interval) from generate_series(1, %s)",
                 [queue, key, ahead, jobs])


# -- the three maintenance calls ------------------------------------------------------


def test_a_job_for_later_is_claimable_within_two_promote_cadences(db, logins):
    with MaintainProcess(db.dsn(logins.maintenance)) as m:  # the default cadence: 1 s
        m.wait_for_pass("promote")
        with db.connect(logins.producer) as p:
            schedule(p, "later", ahead="2 seconds")
        with db.connect(logins.worker) as w:
            assert claim(w, "later") == []
            # Nothing but awa maintain promotes: due in 2 s, then at most two
            # passes (and a second for a loaded machine to run the process).
            (job,) = m.wait(lambda: claim(w, "later"), "the job to be claimable", 2 + 2 * 1 + 1)
        assert job[2] == 1
        m.wait_for_handled("promote", 1)
        m.wait_for_log("promote: moved 1 due job(s) into their lanes")


def test_a_job_whose_worker_vanished_is_claimable_again_with_its_attempt_counted(db, logins):
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('vanish', 'k')")
    with db.connect(logins.worker) as w:
        ((job_id, lease, attempt),) = claim(w, "vanish", lease="300 milliseconds")
        assert attempt == 1  # and the worker is gone: no heartbeat, no completion
        with MaintainProcess(db.dsn(logins.maintenance), "--rescue-every", "200ms",
                             "--promote-every", "200ms") as m:
            # Rescued to a retry 2 s later (2^attempt), then promoted.
            again = m.wait(lambda: claim(w, "vanish"), "the job to be claimable again", 20)
            m.wait_for_handled("rescue", 1)
            m.wait_for_log("rescue: sent 1 job(s) whose lease expired back to retry")
        assert [(j, a) for j, _, a in again] == [(job_id, 2)]
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0] is False


def test_a_copy_left_without_enqueue_copied_is_moved(db, logins):
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('leftover', 'k')")
    with db.connect() as admin:
        # Rows as a transaction committed them before migration 0010: the
        # commit-time move is a trigger, switched off here.
        # Two such transactions: a call moves one, and a pass that moved
        # rows runs again at once (the next pass would be an hour later).
        # No commit-time move: its trigger fires in every replication role.
        admin.execute("alter table awa.copy_staging disable trigger copy_staging_note")
        for first in (1, 151):
            admin.execute("insert into awa.copy_staging (queue, kind, args)"
                          " select 'leftover', 'k', jsonb_build_object('i', i)"
                          " from generate_series(%s, %s + 149) as i", [first, first])
            admin.commit()
        assert count(admin, "copy_staging") == 300
        with MaintainProcess(db.dsn(logins.maintenance), "--move-staged-every", "1h") as m:
            m.wait(lambda: count(admin, "copy_staging") == 0, "the staged rows to move")
            m.wait_for_handled("move_staged", 300)
            m.wait(lambda: m.log().count("move_staged: enqueued 150 staged COPY row(s)") == 2,
                   "two move_staged lines in the log")
        assert count(admin, "ready", "leftover") == 301


# -- many hosts at once ---------------------------------------------------------------


def test_two_processes_at_once_move_each_job_once_and_skip_while_the_lock_is_taken(
        db, logins):
    fast = ("--promote-every", "100ms")
    with MaintainProcess(db.dsn(logins.maintenance), *fast) as a, \
            MaintainProcess(db.dsn(db.login_role("awa_maintenance")), *fast) as b, \
            db.connect() as admin:
        a.wait_for_pass("promote")
        b.wait_for_pass("promote")
        with db.connect(autocommit=False) as holder:
            # The promote pass's lock, held elsewhere: both processes skip, nothing moves.
            # Taken between their passes (each holds it for its own).
            wait_until(lambda: holder.execute(
                "select awa.try_pass_lock('promote')").fetchone()[0],
                what="the promote pass lock between two passes")
            schedule(admin, "pair", jobs=200, ahead="100 milliseconds")
            wait_until(lambda: admin.execute(
                "select count(*) from awa.scheduled where run_at <= now()").fetchone()[0] == 200,
                what="the jobs to be due")
            skipped = a.passes("promote", "skipped"), b.passes("promote", "skipped")
            a.wait_for_pass("promote", "skipped", more_than=skipped[0] + 2)
            b.wait_for_pass("promote", "skipped", more_than=skipped[1] + 2)
            assert count(admin, "scheduled") == 200 and count(admin, "ready", "pair") == 0
            holder.rollback()
        a.wait(lambda: count(admin, "ready", "pair") == 200, "the 200 jobs to be promoted")
        for _ in range(5):  # more rounds, the two competing for each
            schedule(admin, "pair", jobs=100, ahead="50 milliseconds")
        a.wait(lambda: count(admin, "ready", "pair") == 700, "700 jobs promoted")
        assert count(admin, "scheduled") == 0
        assert admin.execute("select count(distinct job_id) from awa.ready").fetchone()[0] == 700
        a.wait(lambda: a.handled("promote") + b.handled("promote") >= 700,
               "both processes to count the 700 they promoted")
        assert a.handled("promote") + b.handled("promote") == 700
        assert a.passes("promote") >= 1 and b.passes("promote") >= 1


def test_a_runtime_role_can_neither_take_nor_block_a_pass_lock(db, logins):
    """A pass's lock is a row of awa.leader_locks, which only the owner can
    lock: an advisory lock, any role could hold at session level to switch
    the pass off. A producer holding every advisory key of the classes the
    passes used to take, and the leader rows' neighbours, stops nothing."""
    old_classes = [int.from_bytes(b"awa" + c, "big") for c in
                   (b"D", b"R", b"S", b"T", b"F", b"N", b"H", b"W", b"K", b"J", b"A", b"P")]
    with db.connect(logins.producer) as hostile, db.connect() as admin:
        for cls in old_classes:
            assert hostile.execute("select pg_try_advisory_lock(%s, 0)", [cls]).fetchone()[0]
        for attempt in ("select awa.try_pass_lock('promote')",
                        "select from awa.leader_locks for update",
                        "lock table awa.leader_locks"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), hostile.transaction():
                hostile.execute(attempt)
        schedule(admin, "held", jobs=5, ahead="0 seconds")
        with MaintainProcess(db.dsn(logins.maintenance), "--promote-every", "100ms") as m:
            m.wait(lambda: count(admin, "ready", "held") == 5, "the due jobs to be promoted")


def _last_runs(admin) -> dict[str, object]:
    return dict(admin.execute("select name, last_at from awa.maintenance_runs").fetchall())


def _age_runs(admin) -> None:
    admin.execute("update awa.maintenance_runs set last_at = '2000-01-01'")


def test_every_maintenance_function_records_its_run_whoever_calls_it(db, logins):
    """awa.maintenance_runs has a row per task awa maintain runs, and each
    task's function, called by the maintenance login as pg_cron would, moves
    its own row's time and no other's: AwaMaintenanceNotRunning reads the
    database, not awa maintain's own metrics."""
    with db.connect() as admin, db.connect(logins.maintenance) as m:
        assert set(_last_runs(admin)) == {t.name for t in TASKS}
        for task in TASKS:
            _age_runs(admin)
            function = task.function.split("(", 1)[0]
            m.execute(f"select count(*) from {function}()")
            moved = {name for name, at in _last_runs(admin).items() if at.year > 2000}
            assert moved == {task.name}, (task.name, moved)


@pytest.mark.parametrize("call, task, leader", [
    ("awa.rotate_running()", "running_slots", "running"),
    ("awa.prune_finished()", "prune", "prune"), ("awa.carry_finished()", "carry", "prune"),
    ("awa.promote_due()", "promote", "pass.promote"),
    ("awa.autoscale_tick()", "autoscale", "autoscale"),
])
def test_a_call_that_cannot_take_its_leader_lock_records_no_run(
        db, logins, call, task, leader):
    """A session that keeps a task's leader lock (idle in a transaction)
    stops every call of it: the task must show as one that does not run
    (AwaMaintenanceNotRunning), not as run by each call that returned 0."""
    with (db.connect() as admin, db.connect(autocommit=False) as holder,
          db.connect(logins.maintenance) as m):
        assert holder.execute("select awa._try_leader(%s)", [leader]).fetchone()[0]
        _age_runs(admin)
        m.execute(f"select count(*) from {call}")
        assert _last_runs(admin)[task].year == 2000
        holder.rollback()


def test_a_maintenance_call_that_rolls_back_records_nothing(db, logins):
    with db.connect() as admin, db.connect(logins.maintenance, autocommit=False) as m:
        _age_runs(admin)
        m.execute("select awa.promote_due()")
        m.rollback()
        assert _last_runs(admin)["promote"].year == 2000
        m.execute("select awa.promote_due()")
        m.commit()
        assert _last_runs(admin)["promote"].year > 2000


def test_a_run_another_transaction_is_recording_is_not_waited_for(db, logins):
    """Two calls of one task at once (pg_cron beside awa maintain): the
    second skips the row the first holds, and never waits for it here."""
    with db.connect() as admin, db.connect(logins.maintenance, autocommit=False) as first, \
            db.connect(logins.maintenance) as second:
        _age_runs(admin)
        first.execute("select awa.promote_due()")  # holds the row until it ends
        second.execute("set lock_timeout = '200ms'")
        assert second.execute("select awa.promote_due()").fetchone()[0] == 0
        assert _last_runs(admin)["promote"].year == 2000
        first.commit()
        assert _last_runs(admin)["promote"].year > 2000


def test_a_run_is_recorded_once_per_five_seconds(db, logins):
    """A task called every second writes its row every 5 s, not at every call."""
    with db.connect() as admin, db.connect(logins.maintenance) as m:
        _age_runs(admin)
        m.execute("select awa.promote_due()")
        recorded = _last_runs(admin)["promote"]
        assert recorded.year > 2000
        xmin = admin.execute("select xmin::text from awa.maintenance_runs"
                             " where name = 'promote'").fetchone()[0]
        m.execute("select awa.promote_due()")
        assert _last_runs(admin)["promote"] == recorded
        assert admin.execute("select xmin::text from awa.maintenance_runs"
                             " where name = 'promote'").fetchone()[0] == xmin


@pytest.mark.one_version
def test_awa_maintain_show_says_when_each_task_last_ran(db, logins):
    """The runbook's "how long each task has not run" without SQL, as a
    reader: every task of TASKS in order, whoever ran it (here a call as
    pg_cron makes it), for people and for scripts as GET
    /api/maintenance-runs answers."""
    with db.connect() as admin, db.connect(logins.maintenance) as m:
        admin.execute("update awa.maintenance_runs set last_at = now() - interval '2 hours'")
        m.execute("select awa.promote_due()")
    shown = db.awa("maintain", "--show", user=logins.reader, check=True)
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["task", "function", "last", "run", "ago", "default", "every"]
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1]) for r in rows] == [(t.name, t.function.split("(")[0]) for t in TASKS]
    ago = {r[0]: r[-2] for r in rows}
    assert re.fullmatch(r"\d+\.\ds", ago.pop("promote")), shown.stdout
    assert set(ago.values()) == {"2h0m"}, shown.stdout
    assert [r[-1] for r in rows] == [f"{t.every:g}s" for t in TASKS]
    as_json = json.loads(db.awa("maintain", "--show", "--json", user=logins.reader,
                                check=True).stdout)
    assert [(t["name"], t["default_every_seconds"]) for t in as_json["tasks"]] == [
        (t.name, t.every) for t in TASKS]
    assert as_json["tasks"][0]["age_seconds"] < 60
    assert all(7200 <= t["age_seconds"] < 7260 for t in as_json["tasks"][1:])


@pytest.mark.one_version
def test_awa_maintain_show_needs_a_reader_and_its_json_needs_show(db, logins):
    refused = db.awa("maintain", "--show", user=logins.maintenance)
    assert refused.returncode == 7, refused.stderr
    assert "needs a login that holds awa_reader or awa_operator" in refused.stderr
    alone = db.awa("maintain", "--json", user=logins.reader)
    assert (alone.returncode, alone.stderr) == (2, "awa: --json goes with --show\n")


@pytest.mark.one_version
def test_awa_maintain_show_on_a_database_without_the_record_says_to_migrate(db, logins):
    with db.connect() as admin:
        admin.execute("drop table awa.maintenance_runs cascade")
    result = db.awa("maintain", "--show", user=logins.reader)
    assert result.returncode == 7, result.stderr
    assert result.stderr == ("awa: this database records no maintenance runs "
                             "(awa.maintenance_runs, migration 0034): run awa migrate\n")


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_a_run_recorded_since_the_snapshot_does_not_fail_a_call_outside_read_committed(
        db, logins, isolation):
    """promote_due, rescue_expired and the other calls that do not ask for
    read committed run under any isolation: a second call whose snapshot is
    older than the first's record skips the record, it does not fail 40001
    (a lock on a row updated since the snapshot)."""
    with db.connect() as admin, db.connect(logins.maintenance) as first, \
            db.connect(logins.maintenance, autocommit=False) as second:
        _age_runs(admin)
        second.execute(f"set transaction isolation level {isolation}")
        second.execute("select 1").fetchone()  # its snapshot
        first.execute("select awa.promote_due()")  # records, and commits
        recorded = _last_runs(admin)["promote"]
        assert recorded.year > 2000
        assert second.execute("select awa.promote_due()").fetchone()[0] == 0
        second.commit()
        assert _last_runs(admin)["promote"] == recorded


@pytest.mark.parametrize("task", ["", "Promote", "a-b", "x" * 41, None])
def test_a_pass_lock_of_a_bad_name_is_refused(db, logins, task):
    with db.connect(logins.maintenance) as m, pytest.raises(psycopg.Error) as err:
        m.execute("select awa.try_pass_lock(%s)", [task])
    assert err.value.sqlstate == ("22004" if task is None else "22023")
    with db.connect() as admin:
        # Only promote's, made by the install (migration 0041).
        assert admin.execute("select array_agg(name) from awa.leader_locks"
                             " where name like 'pass.%%'").fetchone()[0] == ["pass.promote"]


def test_operations_md_gives_each_task_its_flag_and_cadence():
    ops = (ROOT / "docs" / "operations.md").read_text()
    for t in TASKS:
        assert f"| {t.every:g} s | `{t.flag}` |" in ops, t.name


def test_help_names_every_task_and_the_pass_lock():
    """The description is made from TASKS, so it names each task, and says
    what the pass lock is since migration 0026: a row lock, not an advisory one."""
    result = subprocess.run([str(AWA), "maintain", "--help"], capture_output=True, text=True,
                            timeout=60, check=True)
    text = " ".join(result.stdout.split())
    for t in TASKS:
        assert f"{t.name} ({t.function.split('(')[0]})" in text, t.name
        assert t.flag in text, t.flag
    assert f"Run the {len(TASKS)} maintenance tasks" in text
    assert "awa.try_pass_lock(task), a row lock" in text
    assert "advisory" not in text
    assert "no two processes run the same pass at once" in text

# -- stopping, restarts, the prune task, flags ----------------------------------------


# Stopping takes well under a second (docs/operations.md), but a loaded
# machine can stall a process for seconds: a stop is timed against the waits
# it must not sit through (a cadence or a statement timeout of an hour, a
# heartbeat's 20 s), not against a second.
STOP_BOUND = 10.0
HOUR_CADENCES = [arg for task in TASKS for arg in (task.flag, "1h")]


def test_sigterm_exits_0_without_waiting_for_the_next_pass(db, logins):
    with MaintainProcess(db.dsn(logins.maintenance), *HOUR_CADENCES) as m:
        m.wait_for_pass("autoscale")  # every task has run once: the next passes are an hour away
        code, seconds = m.stop(signal.SIGTERM)
        assert code == 0, m.log()
        assert seconds < STOP_BOUND, m.log()
        assert "awa maintain: stopped" in m.log() and "Traceback" not in m.log()


def test_sigint_during_a_blocked_call_exits_0_and_cancels_it(db, logins):
    """The promote call waits for a lane a producer holds: stopping cancels it
    and its transaction rolls back."""
    with db.connect(logins.producer, autocommit=False) as holder, db.connect() as admin:
        admin.execute("select awa.enqueue('blocked', 'k')")  # the queue exists
        holder.execute("select awa.enqueue('blocked', 'k', ordering_key => 'x')")
        schedule(admin, "blocked", ahead="0.2 seconds", key=b"x")
        with MaintainProcess(db.dsn(logins.maintenance), "--promote-every", "100ms",
                             "--statement-timeout", "1h") as m:
            m.wait(lambda: admin.execute(
                "select exists (select from pg_stat_activity a join pg_locks l using (pid)"
                " where a.application_name = 'awa-sql maintain' and not l.granted)"
            ).fetchone()[0], "promote to wait for the held lane")
            code, seconds = m.stop(signal.SIGINT)
            assert code == 0, m.log()
            assert seconds < STOP_BOUND, m.log()
        # Cancelled, not left waiting behind the lane after the process ended
        # (uncancelled, it would wait for the holder, or the hour's timeout).
        wait_until(lambda: not admin.execute(
            "select exists (select from pg_stat_activity"
            " where application_name = 'awa-sql maintain' and datname = current_database())"
        ).fetchone()[0], 30, "the maintain backend to end")
        holder.rollback()
        assert count(admin, "scheduled") == 1


def test_it_carries_on_after_the_database_restarts(cluster):
    """A server of its own, stopped and started again under a running process."""
    if cluster.server is None:
        pytest.skip("needs the suite's own server binaries")
    workdir = scratch.mkdtemp(f"awa-sql-maintain{cluster.major}-")
    server = embedded.LocalServer(cluster.server.bindir, workdir / "pg", settings=TEST_SETTINGS)
    server.start()
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
            conn.execute("create role restart_maintenance login in role awa_maintenance")
        dsn = server.dsn(user="restart_maintenance")
        with MaintainProcess(dsn, "--promote-every", "200ms") as m:
            m.wait_for_pass("promote")
            server.stop("fast")
            m.wait_for_log("WARNING awa maintain: connection lost")
            m.wait_for_log("WARNING awa maintain: cannot connect")
            server.start()
            m.wait_for_log("INFO awa maintain: connected again")
            with psycopg.connect(server.dsn(), autocommit=True) as conn:
                schedule(conn, "after", ahead="0.1 seconds")
                m.wait(lambda: count(conn, "ready", "after") == 1,
                       "a job promoted after the restart")
            assert m.proc.poll() is None
            assert m.value("awa_maintain_connect_failures_total") >= 1
            code, _ = m.stop()
            assert code == 0, m.log()
        assert "retrying in 0.5 s" in m.log() or "reconnecting in 0.5 s" in m.log()
    finally:
        server.stop("immediate")
        shutil.rmtree(workdir, ignore_errors=True)


def test_prune_is_skipped_while_prune_finished_is_not_installed(db, logins):
    """Before and after awa.prune_finished() ships: missing, it is skipped with
    one info line; present, it is called."""
    with db.connect() as admin:
        admin.execute("drop function if exists awa.prune_finished()")
        with MaintainProcess(db.dsn(logins.maintenance), "--prune-every", "100ms") as m:
            m.wait_for_pass("prune", "absent", more_than=3)
            assert m.log().count("awa.prune_finished() is not installed") == 1
            assert m.passes("prune") == 0 and m.value(
                "awa_maintain_errors_total", task="prune") == 0
            admin.execute("create function awa.prune_finished() returns bigint"
                          " language sql as 'select 7::bigint'")
            admin.execute("grant execute on function awa.prune_finished() to awa_maintenance")
            m.wait(lambda: m.handled("prune") >= 7, "a prune pass counted")
            assert "prune: awa.prune_finished() is installed now" in m.log()
            m.wait_for_log("prune: pruned 7 finished job(s)")


def test_every_pass_waits_for_a_contract_with_the_pass_lock(db, logins):
    """A contract before migration 0026 has no awa.try_pass_lock: every pass
    is skipped, with one info line naming it, until awa migrate installs it
    (ADR 037)."""
    with db.connect() as admin:
        admin.execute("alter function awa.try_pass_lock(text) rename to try_pass_lock_later")
        schedule(admin, "waits", jobs=1, ahead="0.1 seconds")
        with MaintainProcess(db.dsn(logins.maintenance), "--promote-every", "100ms") as m:
            m.wait_for_pass("promote", "absent", more_than=3)
            assert m.log().count("promote: awa.try_pass_lock(text) is not installed") == 1
            assert count(admin, "ready", "waits") == 0
            admin.execute("alter function awa.try_pass_lock_later(text) rename to try_pass_lock")
            m.wait(lambda: count(admin, "ready", "waits") == 1, "the job to be promoted")
            m.wait_for_log("promote: awa.try_pass_lock(text) is installed now")


@pytest.mark.one_version
@pytest.mark.parametrize("grants", [["awa_worker"], []])
def test_a_login_without_awa_maintenance_exits_7_saying_what_to_grant(db, grants):
    """Every pass would fail with "permission denied for function
    try_pass_lock" (or "for schema awa"), logged with no hint."""
    login = db.login_role(*grants)
    result = db.awa("maintain", "--metrics-port", "0", user=login, timeout=60)
    assert result.returncode == 7, result.stderr
    assert result.stderr == (
        f"awa: the login {login} does not hold awa_maintenance (it may not call "
        f"awa.try_pass_lock): every pass would fail with permission denied; "
        f"grant awa_maintenance to {login}\n")

@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--promote-every", "10ms", "interval must be between 50ms and 1h, got '10ms'"),
    ("--prune-every", "90m", "interval must be between 50ms and 1h, got '90m'"),
    ("--carry-every", "2h", "interval must be between 50ms and 1h, got '2h'"),
    ("--rescue-every", "soon", "interval must look like 5s, 500ms, 1m or 1h, got 'soon'"),
    ("--statement-timeout", "0s", "interval must be between 50ms and 1h, got '0s'"),
    # A value starting with a minus is the flag's value, not another option.
    ("--promote-every", "-1s", "interval must be between 50ms and 1h, got '-1s'"),
    ("--statement-timeout", "-.5s", "interval must be between 50ms and 1h, got '-.5s'"),
    ("--metrics-port", "70000", "port must be between 0 and 65535, got 70000"),
])
def test_a_bad_flag_exits_2_naming_the_value_and_the_range(flag, value, says):
    result = subprocess.run([str(AWA), "maintain", flag, value], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert f"argument {flag}: {says}" in result.stderr


# -- through PgBouncer, and in a Worker -----------------------------------------------


@pytest.mark.pgbouncer
def test_through_pgbouncer_in_transaction_mode(db, logins, pgbouncer):
    pooled = Pooled(db, pgbouncer)
    since = mark(pooled)
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('pooled-rescue', 'k')")
    with db.connect(logins.worker) as w:
        assert len(claim(w, "pooled-rescue", lease="200 milliseconds")) == 1
    with MaintainProcess(pooled.dsn(logins.maintenance), "--promote-every", "100ms",
                         "--rescue-every", "100ms", "--autoscale-every", "100ms") as m, \
            db.connect() as admin:
        schedule(admin, "pooled", jobs=5, ahead="1 second")
        m.wait(lambda: count(admin, "ready", "pooled") == 5, "promotion through the pooler")
        m.wait(lambda: m.handled("rescue") == 1, "the rescue through the pooler")
        m.wait_for_pass("autoscale", more_than=10)  # past psycopg's prepare threshold of 5
        # Before stopping, which may cancel a call (an ERROR in the server's log).
        problems = log_problems(pooled, since)
        assert sum(m.value("awa_maintain_errors_total", task=t.name) for t in TASKS) == 0
        code, _ = m.stop()
        assert code == 0, m.log()
        assert "WARNING" not in m.log()
    assert problems == []


def test_passes_run_read_committed_whatever_the_logins_default(db):
    """Most tasks refuse another isolation level (25000): under a login whose
    default_transaction_isolation is another, each pass still begins read
    committed, so none fails."""
    login = db.login_role("awa_maintenance")
    with db.cluster.admin() as admin:
        admin.execute(sql.SQL("alter role {} set default_transaction_isolation"
                              " = 'repeatable read'").format(sql.Identifier(login)))
    with MaintainProcess(db.dsn(login), "--prune-every", "200ms", "--retire-lanes-every",
                         "200ms", "--running-slots-every", "200ms") as m:
        for task in ("prune", "retire_lanes", "running_slots"):
            m.wait_for_pass(task, more_than=1)
        assert m.passes("prune", "failed") == 0, m.log()
        assert m.passes("retire_lanes", "failed") == 0, m.log()
        assert m.passes("running_slots", "failed") == 0, m.log()


def test_a_worker_runs_the_same_loop_in_process(db, logins):
    both = db.login_role("awa_worker", "awa_maintenance")
    with db.connect(logins.producer) as p:
        schedule(p, "inproc", ahead="1 second")
        p.execute("select awa.enqueue('inproc', 'flaky', '{\"flaky\": true}')")
    attempts: list[tuple[str, int]] = []

    def handle(job):
        attempts.append((job.kind, job.attempt))
        if job.kind == "flaky" and job.attempt == 1:
            raise RuntimeError("first attempt fails")

    worker = Worker(db.dsn(both), queues=["inproc"], handlers={"k": handle, "flaky": handle},
                    poll_interval=0.05, snapshot_every=None, lease=timedelta(minutes=1),
                    maintain={"promote": 0.2, "prune": None})
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: worker.completed == 2, 20, "the job for later and the retry")
    finally:
        worker.stop()
        started = time.monotonic()
        thread.join(30)
    assert not thread.is_alive(), "run() did not return after stop()"
    assert time.monotonic() - started < STOP_BOUND  # not a heartbeat's 20 s
    assert sorted(attempts) == [("flaky", 1), ("flaky", 2), ("k", 1)]
    assert not any(t.name == "awa-maintain" for t in threading.enumerate())


def test_a_worker_without_awa_maintenance_says_what_to_grant_and_runs_no_passes(
        db, logins, caplog):
    """As `awa maintain` exits 7: a Worker(maintain=True) whose login lacks
    awa_maintenance says once what to grant and starts no maintenance loop,
    where each pass failed with permission denied; it still works its jobs."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('nomaint', 'k')")
    worker = Worker(db.dsn(logins.worker), queues=["nomaint"], handlers={"k": lambda job: None},
                    poll_interval=0.05, snapshot_every=None, maintain=True)
    thread = threading.Thread(target=worker.run)
    with caplog.at_level(logging.WARNING, logger="awa_sql.worker"):
        thread.start()
        try:
            wait_until(lambda: worker.completed == 1, 20, "the job")
            assert not any(t.name == "awa-maintain" for t in threading.enumerate())
        finally:
            worker.stop()
            thread.join(10)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"maintain: the login {logins.worker} does not hold awa_maintenance (it may not call"
        f" awa.try_pass_lock): every pass would fail with permission denied; grant"
        f" awa_maintenance to {logins.worker}; this worker runs no maintenance"], warnings


@pytest.mark.one_version
def test_a_taken_metrics_port_is_a_clear_error(db, logins):
    with taken_port() as port:
        result = db.awa("maintain", "--metrics-port", str(port), user=logins.maintenance,
                        timeout=30)
    assert_cannot_listen(result, f"127.0.0.1:{port}")


# -- its /metrics: the Host check (DNS rebinding), its URL ----------------------------

EVERY_ADDRESS = "0.0.0.0"  # noqa: S104 - the wildcard bind is what these tests start


def _scrape_as(url: str, host: str):
    import httpx

    return httpx.get(url, headers={"Host": host}, timeout=30)


def _warnings(m: MaintainProcess) -> list[str]:
    return [line for line in m.log().splitlines() if "with no allowed host" in line]


def test_its_metrics_refuse_a_host_they_do_not_answer_to(db, logins):
    """A page that rebinds its own name to 127.0.0.1 scrapes as that name:
    400 and no metric; the loopback names scrape, whatever the port."""
    with MaintainProcess(db.dsn(logins.maintenance)) as m:
        url = m.url()
        port = url.rsplit(":", 1)[1].split("/")[0]
        refused = _scrape_as(url, f"evil.example:{port}")
        assert refused.status_code == 400
        assert "awa_maintain_passes_total" not in refused.text
        assert "refused Host 'evil.example'" in refused.text, refused.text
        assert "start awa maintain with --allowed-host evil.example" in refused.text
        assert "AWA_MAINTAIN_ALLOWED_HOSTS" in refused.text
        for host in ("localhost", f"127.0.0.1:{port}", "[::1]:9", "LOCALHOST."):
            got = _scrape_as(url, host)
            assert got.status_code == 200, (host, got.text)
            assert "awa_maintain_passes_total" in got.text, host


def test_its_metrics_answer_each_allowed_host_and_no_other(db, logins):
    with MaintainProcess(db.dsn(logins.maintenance), "--allowed-host", "maintain.example",
                         "--allowed-host", "*.corp.example",
                         env={"AWA_MAINTAIN_ALLOWED_HOSTS": "ignored.example"}) as m:
        url = m.url()
        for host in ("maintain.example:9189", "a.corp.example", "localhost"):
            assert _scrape_as(url, host).status_code == 200, host
        # --allowed-host replaces the variable, as --dsn replaces AWA_DATABASE_URL.
        for host in ("ignored.example", "corp.example", "evil.example"):
            assert _scrape_as(url, host).status_code == 400, host
    with MaintainProcess(db.dsn(logins.maintenance),
                         env={"AWA_MAINTAIN_ALLOWED_HOSTS": "a.example, b.example"}) as m:
        assert _scrape_as(m.url(), "b.example").status_code == 200
        assert _scrape_as(m.url(), "evil.example").status_code == 400


def test_its_metrics_on_every_address_answer_any_host_and_warn(db, logins):
    """Prometheus scrapes by the name or address of its target: bound to
    0.0.0.0 with no allowed host, any Host is scraped, with one warning."""
    with MaintainProcess(db.dsn(logins.maintenance), "--metrics-host", EVERY_ADDRESS) as m:
        got = _scrape_as(m.url(), "evil.example")
        assert got.status_code == 200 and "awa_maintain_passes_total" in got.text
        code, _ = m.stop()
        assert code == 0, m.log()
        warnings = _warnings(m)
    assert len(warnings) == 1, m.log()
    assert "WARNING awa maintain: listening on 0.0.0.0 with no allowed host" in warnings[0]
    assert "DNS rebinding" in warnings[0] and "AWA_MAINTAIN_ALLOWED_HOSTS" in warnings[0]
    with MaintainProcess(db.dsn(logins.maintenance), "--metrics-host", EVERY_ADDRESS,
                         "--allowed-host", "10.0.0.5") as m:
        assert _scrape_as(m.url(), "10.0.0.5:9189").status_code == 200
        assert _scrape_as(m.url(), "evil.example").status_code == 400
        code, _ = m.stop()
        assert code == 0, m.log()
        assert _warnings(m) == []


@pytest.mark.one_version
@pytest.mark.parametrize(("args", "env"), [
    (["--allowed-host", "maintain.example:9189"], {}),
    ([], {"AWA_MAINTAIN_ALLOWED_HOSTS": "ok.example,*bad.example"}),
])
def test_a_bad_allowed_host_exits_2(db, logins, args, env):
    result = db.awa("maintain", "--metrics-port", "0", *args, user=logins.maintenance,
                    env=env, timeout=30)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "is not a host name or address without a port" in result.stderr


@needs_ipv6
def test_bound_to_ipv6_it_logs_a_url_with_brackets_that_answers(db, logins):
    with MaintainProcess(db.dsn(logins.maintenance), "--metrics-host", "::1") as m:
        assert re.fullmatch(r"http://\[::1\]:\d+/metrics", m.url()), m.log()
        m.wait_for_pass("promote")


def test_drops_and_retirements_past_a_calls_lanes_are_done_in_one_pass(db, logins):
    """awa.finish_drops and awa.retire_lanes stop at 1,024 lane locks a call:
    40 queues of 32 lanes each took a second pass a minute later (1,000
    such queues, half an hour). A pass that did any goes again at once."""
    from prometheus_client import CollectorRegistry

    from awa_sql.maintain import TASK_NAMES, Maintainer

    with db.connect(logins.operator) as op:
        for i in range(40):
            op.execute("select awa.set_enqueue_shards(%s, 8)", [f"gone-{i}"])
            op.execute("select awa.set_enqueue_shards(%s, 8)", [f"lowered-{i}"])
        for i in range(40):
            op.execute("select awa.drop_queue(%s)", [f"gone-{i}"])
            op.execute("select awa.set_enqueue_shards(%s, 1)", [f"lowered-{i}"])

    def left(admin) -> tuple[int, int]:
        return admin.execute(
            "select (select count(*) from awa.queue_meta where dropped_xact is not null),"
            " (select count(*) from awa.queue_meta where lane_shards > enqueue_shards)"
        ).fetchone()

    every = dict.fromkeys(TASK_NAMES) | {"drops": 600.0, "retire_lanes": 600.0}
    maintainer = Maintainer(db.dsn(logins.maintenance), every=every,
                            registry=CollectorRegistry())
    with db.connect() as admin:
        assert left(admin) == (40, 40)
        thread = maintainer.start()
        try:
            wait_until(lambda: left(admin) == (0, 0), timeout=60,
                       what="every dropped queue removed and every lowered S retired")
        finally:
            maintainer.stop()
            thread.join(30)


def _with_calls(maintainer, calls):
    """The maintainer's tasks with the calls of ``calls`` (task name ->
    call(conn) -> (count, said)) in place of theirs."""
    from dataclasses import replace

    maintainer.tasks = [replace(t, call=calls.get(t.name, t.call)) for t in maintainer.tasks]
    return maintainer


def test_a_task_due_during_a_pass_that_goes_again_runs_before_it(db, logins):
    """A carry pass that moved rows runs again at once, but a promote that
    fell due during it comes first: the carry was due again from its
    start, before every task that fell due during it, and a promote waited
    two carry passes instead of one (every 4 s at a 1 s cadence while 2-s
    carry passes kept finding rows)."""
    from prometheus_client import CollectorRegistry

    from awa_sql.maintain import TASK_NAMES, Maintainer

    passes: list[str] = []
    enough = threading.Event()

    def carry(conn):
        passes.append("carry")
        # Longer than promote's cadence: promote is due when it ends.
        conn.execute("select pg_sleep(0.3)")
        return 1, "carried 1"

    def promote(conn):
        passes.append("promote")
        if passes.count("promote") >= 4:
            enough.set()
        return 0, ""

    every = dict.fromkeys(TASK_NAMES) | {"promote": 0.2, "carry": 60.0}
    maintainer = _with_calls(Maintainer(db.dsn(logins.maintenance), every=every,
                                        registry=CollectorRegistry()),
                             {"carry": carry, "promote": promote})
    thread = maintainer.start()
    try:
        assert enough.wait(30)
    finally:
        maintainer.stop()
        thread.join(30)
    first = passes.index("carry")
    pairs = passes[first:first + 6]
    assert pairs == ["carry", "promote"] * 3, passes


def test_a_pass_ends_its_session_if_its_client_goes_silent_in_the_transaction(db, logins):
    """A pass is several round trips: a client gone between two (a network
    cut) left its backend idle in the transaction, holding the pass lock and
    what the call took, until the server's TCP keepalive gave up (up to two
    hours). Each pass's transaction sets an idle timeout, the statement
    timeout's or a minute, the longer (a round trip of a slow link counts
    as idle: a short statement timeout would end every pass)."""
    from prometheus_client import CollectorRegistry

    from awa_sql.maintain import TASK_NAMES, Maintainer

    seen: dict[str, str] = {}
    done = threading.Event()

    def promote(conn):
        seen["in the pass"] = conn.execute(
            "select current_setting('idle_in_transaction_session_timeout')").fetchone()[0]
        done.set()
        return 0, ""

    every = dict.fromkeys(TASK_NAMES) | {"promote": 0.2}
    maintainer = _with_calls(Maintainer(db.dsn(logins.maintenance), every=every,
                                        statement_timeout=3.0, registry=CollectorRegistry()),
                             {"promote": promote})
    thread = maintainer.start()
    try:
        assert done.wait(30)
    finally:
        maintainer.stop()
        thread.join(30)
    assert seen["in the pass"] == "1min"
