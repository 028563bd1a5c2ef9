"""A database moved with pg_dump and pg_restore, on real PostgreSQL 17 and 18.

pg_dump keeps the rows, not the cluster's transaction counter: the
transaction ids awa keeps (the last change of S of each queue, a drop, a
removal; ADR 041, ADR 044) may name transactions the new cluster has not
reached. They count as before every snapshot there (awa._before_every_snapshot),
so lanes retire and drops finish after a restore as before it, while the
sessions of a live application hold snapshots. The first test builds that
state by hand; the second makes it with the real tools, restoring a live
database (jobs in every state) into a new PostgreSQL 18 server, and checks
what producers, workers, maintenance and readers do there.

The tools: pg_dump, pg_restore, pg_dumpall and psql of PostgreSQL 18, which
read from 17 and 18 (tests/support/pgtools.py finds them; Debian 12 has only
15's, which refuse a newer server).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from awa_sql.demo import embedded
from tests.support import pgtools, scratch
from tests.support.cluster import TEST_SETTINGS
from tests.support.jobs import Logins, claim
from tests.support.live import fifo, populate

AHEAD = 1_000_000  # transactions between the dumped cluster's counter and the new one's


def held_snapshot(dsn: str) -> psycopg.Connection:
    """A session holding a snapshot, as the sessions of a live application do."""
    conn = psycopg.connect(dsn)
    conn.execute("set transaction isolation level repeatable read")
    conn.execute("select count(*) from awa.queue_meta")
    return conn


def test_ids_of_transactions_this_cluster_has_not_reached_are_before_every_snapshot(
        db, logins):
    su = db.connect()
    with db.connect(logins.operator) as op, db.connect(logins.producer) as p:
        op.execute("select awa.set_enqueue_shards('moved', 8)")
        p.execute("select awa.enqueue('moved', 'k')")
        p.execute("select awa.enqueue('gone', 'k')")
        op.execute("select awa.set_enqueue_shards('moved', 1)")
        with db.connect(logins.worker) as w:
            for job_id, lease, *_ in claim(w, ["moved", "gone"]):
                w.execute("select awa.complete(%s, %s)", [job_id, lease])
        op.execute("select awa.drop_queue('gone', true)")
    # As a restore leaves them: ids of a cluster further on than this one.
    su.execute("update awa.queue_meta set"
               " shards_changed_xact = (pg_current_xact_id()::text::bigint + %s)::text::xid8,"
               " dropped_xact = case when dropped_xact is not null then"
               "  (pg_current_xact_id()::text::bigint + %s)::text::xid8 end",
               [AHEAD, AHEAD])
    holder = held_snapshot(db.dsn())  # taken after them, as every snapshot here is
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.retire_lanes()").fetchone()[0] == 1
        (outcome,) = m.execute("select queue, outcome from awa.finish_drops()").fetchall()
        assert outcome == ("gone", "removed")
        seqs = su.execute("select seq::text from awa.dropped_sequences").fetchall()
        assert len(seqs) == 8  # four lanes, four counters
        su.execute("update awa.dropped_sequences set removed_xact ="
                   " (pg_current_xact_id()::text::bigint + %s)::text::xid8", [AHEAD])
        assert m.execute("select * from awa.finish_drops()").fetchall() == []
        assert su.execute("select count(*) from awa.dropped_sequences").fetchone()[0] == 0
        assert su.execute("select count(*) from pg_class where oid::regclass::text = any(%s)",
                          [[s for (s,) in seqs]]).fetchone()[0] == 0
    holder.close()
    su.close()


# -- the real tools --------------------------------------------------------------------


@pytest.fixture
def target(cluster):
    """A new PostgreSQL 18 server: the next major for a 17 database, the same for 18."""
    workdir = scratch.mkdtemp("awa-sql-restore-")
    server = embedded.LocalServer(embedded.ensure_binaries(18), workdir / "pg18",
                                  settings=TEST_SETTINGS)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def run(*args: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 0, f"{Path(str(args[0])).name}: {result.stderr}"
    return result


@pytest.mark.parametrize("form", ["custom", "plain"])
def test_a_live_database_dumped_and_restored_into_a_new_server_works_on(
        db, logins: Logins, target, form, tmp_path):
    tools = pgtools.client_bin(18)
    with db.connect() as conn:
        facts = populate(conn)
    dump = tmp_path / "awa.dump"
    run(tools / "pg_dump", "--format", form, "--file", dump, "--dbname", db.dsn())
    roles = tmp_path / "roles.sql"
    run(tools / "pg_dumpall", "--roles-only", "--file", roles, "--dbname", db.cluster.dsn())
    # "role postgres already exists" is the one error: no ON_ERROR_STOP.
    run(tools / "psql", "-X", "-q", "-f", roles, "-d", target.dsn())
    with psycopg.connect(target.dsn(), autocommit=True) as conn:
        conn.execute("create database app")
    if form == "custom":
        run(tools / "pg_restore", "--exit-on-error", "--dbname", target.dsn(dbname="app"), dump)
    else:
        run(tools / "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", dump,
            "-d", target.dsn(dbname="app"))

    def connect(user=None):
        return psycopg.connect(target.dsn(user=user, dbname="app"), autocommit=True)

    with connect() as su:
        assert su.execute("select awa._assert_security()").fetchone() is not None
        ahead = su.execute("select min(dropped_xact) > pg_current_xact_id() from awa.queue_meta"
                           " where dropped_xact is not null").fetchone()[0]
        assert ahead  # the state this test is about: ids the new cluster has not reached
    holder = held_snapshot(target.dsn(dbname="app"))
    with connect(logins.producer) as p:
        new = p.execute("select (awa.enqueue('ready', 'new')).job_id").fetchone()[0]
        assert new > facts["max_id"]
        dup = p.execute("select (awa.enqueue('uniq', 'k', unique_key => 'u1'::bytea)).job_id"
                        ).fetchone()[0]
        assert dup <= facts["max_id"]  # the key is still held: the old job comes back
    with connect(logins.worker) as w:
        claimed = w.execute("select job_id, run_lease, queue, priority, enqueue_shard, lane_seq"
                            " from awa.claim(array['ready'], 100, 'after', interval '1 minute')"
                            " order by run_lease").fetchall()
        assert {c[0] for c in claimed} == facts["ready"] | {new}
        assert fifo(claimed)
        # Claimed by populate's login, the superuser, which the roles' dump
        # restores by name: a run is its claimer's login's (ADR 050).
        with connect() as su:
            assert [su.execute("select awa.complete(%s, %s)", r).fetchone()[0]
                    for r in facts["long"]] == [True, True]
        assert claim(w, ["paused"]) == []
        assert len(claim(w, ["parts"])) == 2
    with connect(logins.operator) as op:
        assert op.execute("select awa.release_worker('w-lost')").fetchone()[0] == 2
    with connect(logins.maintenance) as m:
        assert m.execute("select awa.rescue_expired()").fetchone()[0] == 2
        assert m.execute("select awa.retire_lanes()").fetchone()[0] == 1
        assert m.execute("select queue, outcome from awa.finish_drops()").fetchall() == [
            ("gone", "removed")]
        for call in ("awa.autoscale_tick()", "awa.prune_finished()", "awa.promote_due()",
                     "awa.move_staged()", "awa.prune_unique_keys()"):
            m.execute(f"select {call}")
    with connect(logins.reader) as r:
        shown = {row[0] for row in r.execute("select queue from awa.queue_overview")}
        assert {"ready", "sched", "run", "done", "uniq", "paused", "auto"} <= shown
    holder.close()
    status = subprocess.run(
        [sys.executable, "-m", "awa_sql", "status", "--check", "--dsn",
         target.dsn(dbname="app")],
        capture_output=True, text=True, check=False, timeout=60, stdin=subprocess.DEVNULL)
    assert status.returncode == 0, status.stdout + status.stderr


def awa_cli(*args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "awa_sql", *args, "--dsn", dsn],
                          capture_output=True, text=True, check=False, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_a_restore_without_grants_or_owners_fails_the_gate_and_migrate_repairs_the_grants(
        db, logins: Logins, target, tmp_path):
    """pg_restore --no-acl (-x) and --no-owner (-O): nothing is pending, so
    `awa status --check` said 0 and `awa migrate` "up to date", while the
    runtime roles could not reach schema awa and PUBLIC could execute every
    routine, or the restoring superuser owned every SECURITY DEFINER function."""
    tools = pgtools.client_bin(18)
    with db.connect() as conn:
        conn.execute("select awa.enqueue('kept', 'k')")
    dump = tmp_path / "awa.dump"
    run(tools / "pg_dump", "--format", "custom", "--file", dump, "--dbname", db.dsn())
    roles = tmp_path / "roles.sql"
    run(tools / "pg_dumpall", "--roles-only", "--file", roles, "--dbname", db.cluster.dsn())
    run(tools / "psql", "-X", "-q", "-f", roles, "-d", target.dsn())
    for name, flag in (("noacl", "--no-acl"), ("noowner", "--no-owner")):
        with psycopg.connect(target.dsn(), autocommit=True) as conn:
            conn.execute(f"create database {name}")
        run(tools / "pg_restore", "--exit-on-error", flag, "--dbname",
            target.dsn(dbname=name), dump)

    noacl = target.dsn(dbname="noacl")
    def connect(user: str) -> psycopg.Connection:
        return psycopg.connect(target.dsn(user=user, dbname="noacl"), autocommit=True)

    with connect(logins.producer) as p, pytest.raises(psycopg.errors.InsufficientPrivilege,
                                                      match="schema awa"):
        p.execute("select awa.enqueue('kept', 'k')")
    gate = awa_cli("status", "--check", dsn=noacl)
    assert gate.returncode == 10, gate.stdout + gate.stderr
    assert "routines executable by PUBLIC" in gate.stdout
    assert "awa_producer has no USAGE" in gate.stdout
    assert "run 'awa migrate'" in gate.stdout
    repaired = awa_cli("migrate", dsn=noacl)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "applied function layer" in repaired.stdout
    assert awa_cli("status", "--check", dsn=noacl).returncode == 0
    with connect(logins.producer) as p:
        p.execute("select awa.enqueue('kept', 'k')")
    with connect(logins.worker) as w:
        assert len(claim(w, ["kept"], 10)) == 2  # the restored job and the new one
    with connect(logins.reader) as r, pytest.raises(psycopg.errors.InsufficientPrivilege):
        r.execute("select awa._sticky(4)")

    noowner = target.dsn(dbname="noowner")
    gate = awa_cli("status", "--check", dsn=noowner)
    assert gate.returncode == 6, gate.stdout + gate.stderr
    assert "owned by 'postgres', not 'awa_owner'" in gate.stdout
    assert "without --no-owner" in gate.stdout
    refused = awa_cli("migrate", dsn=noowner)
    assert refused.returncode == 6 and "without --no-owner" in refused.stderr, refused.stderr
