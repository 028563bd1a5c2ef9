"""``awa storage set-enqueue-shards`` with a mode on a queue that does not
exist yet (its dry run and its run agree), and ``awa storage autoscale run``
going on through a lost connection as awa maintain does."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from psycopg import sql

from tests.support.waiting import wait_until

AUTOSCALE_APPLICATION = "awa-sql autoscale"  # the loop's application_name


def queue_state(db, queue: str) -> tuple | None:
    """(mode, max, S, lanes) of ``queue``, or None while it does not exist."""
    with db.connect() as su:
        return su.execute(
            "select m.shard_mode, m.max_shards, m.enqueue_shards,"
            "       (select count(*) from awa.lane_overview as l where l.queue = m.queue)"
            "  from awa.queue_meta as m where m.queue = %s", [queue]).fetchone()


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.one_version
@pytest.mark.parametrize("mode", ["auto", "shadow"])
def test_auto_or_shadow_creates_a_new_queue_at_s_1_as_its_dry_run_says(db, logins, mode):
    flags = ("storage", "set-enqueue-shards", "--queue", "fresh", f"--{mode}", "--max", "8")
    planned = db.awa(*flags, "--dry-run", user=logins.operator, check=True)
    assert "There is no queue 'fresh' yet: this creates it with S = 1." in planned.stdout
    assert "dry run: nothing changed" in planned.stdout
    assert queue_state(db, "fresh") is None
    done = db.awa(*flags, "--yes", user=logins.operator)
    assert done.returncode == 0, done.stderr
    assert "There is no queue 'fresh' yet: this creates it with S = 1." in done.stdout
    assert f"fresh: mode {mode}, max 8" in done.stdout
    assert "fresh (new queue)      1      1              4" in done.stdout
    assert queue_state(db, "fresh") == (mode, 8, 1, 4)


@pytest.mark.one_version
def test_manual_with_shards_creates_a_new_queue_at_that_s_as_its_dry_run_says(db, logins):
    flags = ("storage", "set-enqueue-shards", "--queue", "fresh", "--manual", "--shards", "4")
    planned = db.awa(*flags, "--dry-run", user=logins.operator, check=True)
    assert "There is no queue 'fresh' yet: this creates it with S = 4." in planned.stdout
    assert "fresh (new queue)          1      4               16" in planned.stdout
    assert queue_state(db, "fresh") is None
    done = db.awa(*flags, "--yes", user=logins.operator)
    assert done.returncode == 0, done.stderr
    assert "fresh: mode manual, max -" in done.stdout
    assert "fresh (new queue)      1      4             16" in done.stdout
    assert queue_state(db, "fresh") == ("manual", None, 4, 16)


@pytest.mark.one_version
def test_manual_alone_on_a_new_queue_is_refused_alike_with_and_without_dry_run(db, logins):
    flags = ("storage", "set-enqueue-shards", "--queue", "fresh", "--manual")
    planned = db.awa(*flags, "--dry-run", user=logins.operator)
    done = db.awa(*flags, "--yes", user=logins.operator)
    for result in (planned, done):
        assert result.returncode == 2, result.stdout + result.stderr
        assert last_line(result) == ("awa: there is no queue 'fresh': a new queue is manual "
                                     "already (--manual --shards N creates it with S = N)")
    assert queue_state(db, "fresh") is None


@pytest.mark.one_version
def test_the_dry_run_fails_where_the_run_fails(db, logins):
    """At the queue limit, creating the queue for --auto fails 53400: the dry
    run makes the change and rolls it back, so it fails the same way."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('first', 1)")
        op.execute("select awa.set_max_queues(queues::integer) from awa.queue_limit")
    flags = ("storage", "set-enqueue-shards", "--queue", "fresh", "--auto", "--max", "8")
    planned = db.awa(*flags, "--dry-run", user=logins.operator)
    done = db.awa(*flags, "--yes", user=logins.operator)
    assert planned.returncode == done.returncode == 7, (planned.stderr, done.stderr)
    assert "[53400]" in done.stderr and planned.stderr == done.stderr
    assert "dry run: nothing changed" not in planned.stdout
    assert queue_state(db, "fresh") is None


def test_a_queue_another_session_creates_meanwhile_keeps_its_s(db, logins):
    """The plan saw no queue 'raced'; another session creates it with S = 4
    before the change runs (the change waits for its provisioning lock):
    creating it at S = 1 would lower its S. Nothing changes, exit 9."""
    env = {**os.environ, "AWA_DATABASE_URL": db.dsn(logins.operator)}
    env.pop("DATABASE_URL", None)
    with db.connect(autocommit=False) as creator, db.connect() as su:
        creator.execute("select awa.set_enqueue_shards('raced', 4)")
        cli = subprocess.Popen(
            [sys.executable, "-m", "awa_sql", "storage", "set-enqueue-shards", "--queue",
             "raced", "--auto", "--max", "8", "--yes"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            wait_until(lambda: cli.poll() is not None or su.execute(
                "select exists (select from pg_stat_activity as a join pg_locks as l using (pid)"
                " where a.datname = current_database() and a.usename = %s and not l.granted)",
                [logins.operator]).fetchone()[0], what="the change to wait for the creator")
            creator.commit()
            out, err = cli.communicate(timeout=60)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
    assert "There is no queue 'raced' yet: this creates it with S = 1." in out
    assert cli.returncode == 9, out + err
    assert err.strip() == ("awa: queue 'raced' was created by another session since the plan "
                           "above, with another S: nothing changed; run the command again")
    assert queue_state(db, "raced") == ("manual", None, 4, 16)


class AutoscaleRun:
    """``awa storage autoscale run`` as a subprocess, its stdout and stderr
    in files (nothing blocks on a full pipe)."""

    def __init__(self, dsn: str, *flags: str):
        self.dir = Path(tempfile.mkdtemp(prefix="awa-autoscale-run-"))
        env = {**os.environ, "AWA_DATABASE_URL": dsn}
        env.pop("DATABASE_URL", None)
        with open(self.dir / "out", "wb") as out, open(self.dir / "err", "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "awa_sql", "storage", "autoscale", "run", *flags],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def __enter__(self) -> AutoscaleRun:
        return self

    def __exit__(self, *_exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._kept = self.out(), self.err()
        shutil.rmtree(self.dir, ignore_errors=True)

    def out(self) -> str:
        kept = getattr(self, "_kept", None)
        return kept[0] if kept else (self.dir / "out").read_text(errors="replace")

    def err(self) -> str:
        kept = getattr(self, "_kept", None)
        return kept[1] if kept else (self.dir / "err").read_text(errors="replace")

    def running(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"autoscale run exited {self.proc.returncode}:\n"
                                 f"{self.out()}\n{self.err()}")
        return True

    def stop(self, sig: int = signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)


def ticks(su, queue: str) -> int:
    """The auto-scaler's decisions on ``queue`` so far, each tick one."""
    return su.execute("select coalesce(sum(decisions), 0) from awa.autoscale_decision_counts"
                      " where queue = %s", [queue]).fetchone()[0]


def backends(su) -> list[int]:
    return [pid for (pid,) in su.execute(
        "select pid from pg_stat_activity"
        " where application_name = %s and datname = current_database()",
        [AUTOSCALE_APPLICATION]).fetchall()]


def shadow_queue(db, logins, queue: str) -> None:
    db.awa("storage", "set-enqueue-shards", "--queue", queue, "--shadow", "--max", "4",
           "--yes", user=logins.operator, check=True)


def test_autoscale_run_ticks_again_after_its_backend_is_terminated(db, logins):
    shadow_queue(db, logins, "watched")
    with (db.connect() as su,
          AutoscaleRun(db.dsn(logins.maintenance), "--interval", "100ms", "--verbose") as run):
        wait_until(lambda: run.running() and ticks(su, "watched") > 0, what="a first tick")
        [first] = wait_until(lambda: run.running() and backends(su), what="its backend")
        assert su.execute("select pg_terminate_backend(%s)", [first]).fetchone()[0]
        again = wait_until(lambda: run.running() and [p for p in backends(su) if p != first],
                           what="a new connection")
        assert first not in backends(su) and len(again) == 1
        before = ticks(su, "watched")
        wait_until(lambda: run.running() and ticks(su, "watched") > before,
                   what="a tick on the new connection")
        code = run.stop(signal.SIGINT)
    assert code == 0, run.err()
    assert "awa: auto-scaler stopped" in run.out()
    assert "watched: held S 1 -> 1 (shadow)" in run.out()
    said = run.err()
    assert "awa: the tick failed: AdminShutdown [57P01]: terminating connection" in said, said
    assert "connecting again in 0.5 s" in said and "Traceback" not in said, said


def test_autoscale_run_connects_again_while_the_server_takes_no_writes(db, logins):
    """A login whose transactions are read-only is what a standby looks like
    (25006): the loop says so once per connection and connects again with
    back-off; once writes are taken it ticks."""
    shadow_queue(db, logins, "watched")
    with db.connect() as su:
        role = sql.Identifier(logins.maintenance)
        su.execute(sql.SQL("alter role {} set default_transaction_read_only = on").format(role))
        with AutoscaleRun(db.dsn(logins.maintenance), "--interval", "100ms") as run:
            wait_until(lambda: run.running() and "ReadOnlySqlTransaction [25006]" in run.err(),
                       what="a refused tick")
            assert ticks(su, "watched") == 0
            su.execute(sql.SQL("alter role {} reset default_transaction_read_only").format(role))
            wait_until(lambda: run.running() and ticks(su, "watched") > 0,
                       timeout=60, what="a tick once writes are taken")
            code = run.stop(signal.SIGTERM)
    assert code == 0, run.err()
    assert "connecting again in 0.5 s" in run.err() and "Traceback" not in run.err()


def test_autoscale_run_exits_on_an_error_every_tick_would_repeat(db, logins):
    """A login without awa_maintenance (42501): no retry mends it, so the
    loop exits 7 at its first tick, naming the role, as --once does."""
    with AutoscaleRun(db.dsn(logins.reader), "--interval", "100ms") as run:
        code = run.proc.wait(timeout=60)
    assert code == 7, run.out() + run.err()
    said = run.err()
    assert "InsufficientPrivilege [42501]" in said, said
    assert "this command needs a login that holds awa_maintenance" in said, said
    assert "Traceback" not in said and "auto-scaler stopped" not in run.out()
