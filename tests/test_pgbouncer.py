"""Through a real PgBouncer 1.18 in transaction mode (no prepared-statement
support), 4 server connections per database, on PostgreSQL 17 and 18.

Each test also reads PgBouncer's log and the server's log for the time it
ran: a prepared statement or session state that leaked across transactions
shows up there as an error.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

import awa_sql
from awa_sql import migrate
from awa_sql.connect import behind_pooler, connect
from awa_sql.roles import Roles
from awa_sql.source import Migration, checksum, load_migrations
from awa_sql.worker import Worker
from tests.support.pgbouncer import POOL_SIZE, Pooled, log_problems, mark
from tests.support.waiting import wait_until

pytestmark = pytest.mark.pgbouncer


@pytest.fixture
def pooled(db, pgbouncer) -> Pooled:
    return Pooled(db, pgbouncer)


def _run_threads(targets: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(fn):
        try:
            fn()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    wait_until(condition, timeout, what)


# -- the pooler itself ----------------------------------------------------------------


def test_awa_connections_turn_prepared_statements_off_behind_the_pooler(
        pooled, db, monkeypatch):
    with pooled.connect() as through, db.connect() as direct:
        assert behind_pooler(through) and not behind_pooler(direct)
    with pooled.connect() as conn:
        assert conn.prepare_threshold is None
    with connect(db.dsn()) as conn:
        assert conn.prepare_threshold == 5  # psycopg's default, kept on a direct connection
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with connect(pooled.dsn(), prepared_statements="on") as conn:
        assert conn.prepare_threshold == 5
    monkeypatch.setenv("AWA_PREPARED_STATEMENTS", "off")
    with connect(db.dsn()) as conn:
        assert conn.prepare_threshold is None
    monkeypatch.setenv("AWA_PREPARED_STATEMENTS", "sometimes")
    with pytest.raises(ValueError, match="AWA_PREPARED_STATEMENTS must be one of auto, on, off"
                       r".*'sometimes'"):
        connect(db.dsn())


def test_this_pgbouncer_loses_prepared_statements_and_the_logs_show_it(pooled):
    """The control: psycopg's prepared statements do break here, and the log
    check the other tests rely on sees it."""
    since = mark(pooled)
    with psycopg.connect(pooled.dsn(), autocommit=True, prepare_threshold=0) as eager, \
            psycopg.connect(pooled.dsn(), autocommit=True) as other:
        eager.execute("select 1 + %s", [1])  # prepared on the server connection it got
        other.execute("begin")  # takes that server connection (PgBouncer reuses the last one)
        other.execute("select 1")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName, match="_pg3_"):
            eager.execute("select 1 + %s", [1])
        other.execute("commit")
    assert any("prepared statement" in line for line in log_problems(pooled, since))


# -- producers, workers, operators ----------------------------------------------------


def test_single_batch_and_copy_enqueue(pooled, logins):
    since = mark(pooled)
    rounds = 12  # past psycopg's prepare threshold of 5 on every connection

    def producer(n: int) -> Callable[[], None]:
        def run():
            with awa_sql.Producer(pooled.dsn(logins.producer)) as p:
                for i in range(rounds):
                    p.enqueue("one", {"n": n, "i": i}, queue="pooled")
                    p.enqueue_many([{"kind": "many", "args": {"j": j}} for j in range(5)],
                                   queue="pooled", ordering_key=f"k{n}")
                    assert p.enqueue_many_copy([{"kind": "copy"}] * 7, queue="pooled") == 7
            # The module functions on the caller's connection: COPY and
            # enqueue_copied() share one transaction in both modes.
            with pooled.connect(logins.producer, autocommit=True) as conn:
                for _ in range(rounds):
                    assert awa_sql.enqueue_many_copy(conn, [{"kind": "auto"}] * 3,
                                                     queue="pooled") == 3
            with pooled.connect(logins.producer, autocommit=False) as conn:
                for _ in range(rounds):
                    awa_sql.enqueue(conn, "tx", queue="pooled")
                    assert awa_sql.enqueue_many_copy(conn, [{"kind": "tx"}] * 2,
                                                     queue="pooled") == 2
                    conn.commit()
        return run

    producers = 8  # twice the server connections, so calls do move between them
    assert _run_threads([producer(n) for n in range(producers)]) == []
    with pooled.db.connect() as admin:
        by_kind = dict(admin.execute("select kind, count(*) from awa.ready group by kind"))
        staged = admin.execute("select count(*) from awa.copy_staging").fetchone()[0]
    per = producers * rounds
    assert by_kind == {"one": per, "many": 5 * per, "copy": 7 * per, "auto": 3 * per,
                       "tx": 3 * per}
    assert staged == 0
    assert log_problems(pooled, since) == []


def test_claim_complete_and_fail(pooled, logins):
    since = mark(pooled)
    with awa_sql.Producer(pooled.dsn(logins.producer)) as p:
        p.enqueue_many([{"kind": "ok", "args": {"i": i}} for i in range(40)], queue="work")
        p.enqueue_many([{"kind": "bad", "max_attempts": 1}] * 10, queue="work")
        slow_job = p.enqueue("slow", queue="work")
    done: list[int] = []
    started, release = threading.Event(), threading.Event()

    def slow(_job):
        started.set()
        release.wait(60)

    def bad(_job):
        raise RuntimeError("broken on purpose")

    worker = Worker(pooled.dsn(logins.worker), queues=[{"queue": "work", "max_workers": 6}],
                    handlers={"ok": lambda job: done.append(job.args["i"]), "bad": bad,
                              "slow": slow},
                    lease=timedelta(minutes=1), heartbeat_every=timedelta(seconds=0.1),
                    poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert started.wait(30)
        with pooled.db.connect() as admin:
            # The claim set the lease to its time + 1 minute; each heartbeat
            # through the pooler sets it to the heartbeat's time + 1 minute:
            # past the claim's by 1 s once they went on for 1 s (10 beats).
            _wait_for(lambda: admin.execute(
                "select lease_expires_at > claimed_at + interval '61 s' from awa.running"
                " where job_id = %s", [slow_job.job_id]).fetchone()[0],
                "heartbeats through the pooler to extend the lease", timeout=30)
            release.set()
            _wait_for(lambda: admin.execute(
                "select count(*) from awa.finished").fetchone()[0] == 51, "51 finished jobs")
    finally:
        release.set()
        worker.stop()
        thread.join(timeout=60)
    assert sorted(done) == list(range(40))
    assert (worker.completed, worker.failed) == (41, 10)
    with pooled.db.connect() as admin:
        states = dict(admin.execute("select state, count(*) from awa.finished group by state"))
        errors = {e for (e,) in admin.execute(
            "select last_error from awa.finished where state = 'failed'")}
    assert states == {"completed": 41, "failed": 10}
    assert errors == {"RuntimeError: broken on purpose"}
    assert log_problems(pooled, since) == []


class Producers:
    """Single, batch and COPY producers through the pooler, each job tagged.

    ``backlog`` bounds committed-but-unhandled jobs, so workers keep up.
    """

    def __init__(self, dsn: str, queue: str, per_kind: int, backlog: int | None = None):
        self.dsn, self.queue, self.per_kind, self.backlog = dsn, queue, per_kind, backlog
        self.stop = threading.Event()
        self.committed: set[str] = set()
        self.handled: list[str] = []
        # A call that starts after the test bumps ``epoch`` reads what the test
        # committed before it; ``done`` counts committed calls by (kind, epoch),
        # ``by_name`` by (producer, epoch), ``jobs`` committed jobs by epoch.
        self.epoch = 0
        self.done: collections.Counter[tuple[str, int]] = collections.Counter()
        self.by_name: collections.Counter[tuple[str, int]] = collections.Counter()
        self.jobs: collections.Counter[int] = collections.Counter()
        self.cond = threading.Condition()

    def handle(self, job) -> None:
        with self.cond:
            self.handled.append(job.args["t"])
            self.cond.notify_all()

    def _room(self) -> None:
        if self.backlog is None:
            return
        with self.cond:
            self.cond.wait_for(lambda: self.stop.is_set()
                               or len(self.committed) - len(self.handled) < self.backlog)

    def _commit(self, name: str, epoch: int, tags: list[str]) -> None:
        with self.cond:
            self.committed.update(tags)
            self.done[name.split("-")[0], epoch] += 1
            self.by_name[name, epoch] += 1
            self.jobs[epoch] += len(tags)
            self.cond.notify_all()

    def calls_since(self, epoch: int, kind: str | None = None) -> int:
        with self.cond:
            return sum(n for (k, e), n in self.done.items()
                       if e >= epoch and kind in (None, k))

    def _loop(self, name: str, call: Callable[[awa_sql.Producer, list[str]], None]) -> None:
        with awa_sql.Producer(self.dsn) as p:
            i = 0
            kind = name.split("-")[0]
            size = {"one": 1, "batch": 10, "copy": 20}[kind]
            while not self.stop.is_set():
                self._room()
                epoch = self.epoch
                tags = [f"{name}-{i}-{j}" for j in range(size)]
                call(p, tags)
                self._commit(name, epoch, tags)
                i += 1

    def targets(self) -> list[Callable[[], None]]:
        q = self.queue

        def one(p, tags):
            p.enqueue("soak", {"t": tags[0]}, queue=q)

        def batch(p, tags):
            p.enqueue_many([{"kind": "soak", "args": {"t": t}, "ordering_key": t[-1]}
                            for t in tags], queue=q)

        def copy(p, tags):
            assert p.enqueue_many_copy([{"kind": "soak", "args": {"t": t}} for t in tags],
                                       queue=q) == len(tags)

        calls = {"one": one, "batch": batch, "copy": copy}
        return [
            (lambda name=f"{kind}-{n}", fn=fn: self._loop(name, fn))
            for kind, fn in calls.items() for n in range(self.per_kind)
        ]


def test_set_enqueue_shards_while_producers_run(pooled, logins):
    since = mark(pooled)
    producers = Producers(pooled.dsn(logins.producer), "reshard", per_kind=2)
    errors: list[BaseException] = []
    threads = [threading.Thread(target=lambda t=t: _guard(t, errors))
               for t in producers.targets()]
    with pooled.connect(logins.operator, autocommit=False) as op:
        awa_sql.set_enqueue_shards(op, "reshard", 1)
        op.commit()
        for t in threads:
            t.start()
        try:
            for shards in (4, 8, 2):
                # Calls of every kind, keyed batches among them, that began
                # after the previous change committed and so routed by it.
                epoch = producers.epoch
                _wait_for(lambda e=epoch: errors or (
                    producers.calls_since(e) >= 20
                    and producers.calls_since(e, "batch") >= 1), "producers to make progress")
                changes = awa_sql.set_enqueue_shards(op, "reshard", shards)
                op.commit()
                producers.epoch += 1
                assert [c.new_shards for c in changes] == [shards]
        finally:
            producers.stop.set()
            for t in threads:
                t.join()
    assert errors == []
    with pooled.db.connect() as admin:
        tags = {t for (t,) in admin.execute("select args->>'t' from awa.ready")}
        shards, lanes = admin.execute(
            "select m.enqueue_shards, (select count(*) from awa.lanes l"
            " where l.queue_id = m.queue_id) from awa.queue_meta m"
            " where m.queue = 'reshard'").fetchone()
        used = {s for (s,) in admin.execute(
            "select distinct l.shard from awa.ready r join awa.lanes l using (lane_id)")}
    assert tags == producers.committed
    assert (shards, lanes) == (2, 4 * 8)
    assert max(used) >= 4  # keyed jobs landed in lanes that S = 8 opened
    assert log_problems(pooled, since) == []


def _guard(fn: Callable[[], None], errors: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as err:
        errors.append(err)


def test_soak_32_clients_over_4_server_connections(pooled, logins):
    """Done-when of issue 9: producers (single, batch, COPY) and workers while S
    goes 1 -> 4 -> 8 -> 2, each S kept until 1,000 jobs were committed at it,
    every producer called at it and the workers handled 1,000 jobs more;
    every committed job completes exactly once and no call fails."""
    since = mark(pooled)
    producers = Producers(pooled.dsn(logins.producer), "soak", per_kind=5, backlog=3000)
    worker = Worker(pooled.dsn(logins.worker), queues=[{"queue": "soak", "max_workers": 16}],
                    handlers={"soak": producers.handle}, poll_interval=0.05)
    # 15 producers + 16 worker slots + 1 heartbeat + 1 operator = 33 clients
    errors: list[BaseException] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    peak = 0
    names = {f"{kind}-{n}" for kind in ("one", "batch", "copy") for n in range(5)}
    try:
        with pooled.connect(logins.operator, autocommit=False) as op, \
                pooled.bouncer.admin() as watcher:
            awa_sql.set_enqueue_shards(op, "soak", 1)
            op.commit()
            threads = [threading.Thread(target=lambda t=t: _guard(t, errors))
                       for t in producers.targets()]
            threads.append(threading.Thread(target=worker.run))
            for t in threads:
                t.start()

            def phase_done(epoch: int, handled_before: int) -> bool:
                nonlocal peak
                peak = max(peak, pooled.bouncer.server_connections(watcher, pooled.db.name))
                with producers.cond:
                    return bool(errors) or (
                        producers.jobs[epoch] >= 1000
                        and len(producers.handled) - handled_before >= 1000
                        and all(producers.by_name[n, epoch] for n in names))

            try:
                for shards in (4, 8, 2, None):
                    epoch, handled = producers.epoch, len(producers.handled)
                    _wait_for(lambda e=epoch, h=handled: phase_done(e, h),
                              f"1,000 jobs through the pooler at epoch {epoch}")
                    if shards is not None:
                        awa_sql.set_enqueue_shards(op, "soak", shards)
                        op.commit()
                        producers.epoch += 1
            finally:
                producers.stop.set()
                with producers.cond:
                    producers.cond.notify_all()
                for t in threads[:-1]:
                    t.join()
            _wait_for(lambda: len(producers.handled) >= len(producers.committed) or errors,
                      "workers to drain the queue", timeout=60)
            worker.stop()
            threads[-1].join(timeout=60)
    finally:
        threading.excepthook = hook
    assert errors == []
    assert worker.failed == 0
    counts = collections.Counter(producers.handled)
    assert set(counts) == producers.committed
    assert max(counts.values()) == 1, "a job ran twice"
    assert len(producers.committed) >= 4000
    # Each producer's connection past psycopg's prepare threshold (5 calls).
    assert all(sum(producers.by_name[n, e] for e in range(4)) > 5 for n in names)
    assert 1 <= peak <= POOL_SIZE
    with pooled.db.connect() as admin:
        left = admin.execute(
            "select (select count(*) from awa.ready) + (select count(*) from awa.running)"
            " + (select count(*) from awa.scheduled) + (select count(*) from awa.copy_staging)"
        ).fetchone()[0]
        completed = admin.execute(
            "select count(*) from awa.finished where state = 'completed'").fetchone()[0]
    assert (left, completed) == (0, len(producers.committed))
    assert log_problems(pooled, since) == []


# -- migrations -----------------------------------------------------------------------


def test_concurrent_migrate_runners_through_the_pooler(empty_db, pgbouncer, role_prefix):
    p = Pooled(empty_db, pgbouncer)
    since = mark(p)
    env = {"AWA_DATABASE_URL": p.dsn()}
    results: list = []
    # Six runners, two client connections each, over four server connections.
    assert _run_threads([
        lambda: results.append(empty_db.awa("migrate", "--create-roles", "--role-prefix",
                                            role_prefix, env=env))
        for _ in range(6)
    ]) == []
    assert [r.returncode for r in results] == [0] * 6, [r.stderr for r in results]
    assert sum("applied migration" in r.stdout for r in results) == 1
    status = empty_db.awa("status", "--check", "--role-prefix", role_prefix, env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    # Waiting runners wait for the run lock 100 ms at a time: those
    # timeouts are expected, nothing else is.
    assert [line for line in log_problems(p, since)
            if "canceling statement due to lock timeout" not in line] == []


def test_a_no_transaction_migration_needs_a_direct_connection(pooled):
    known = load_migrations()
    text = ("-- awa:no-transaction\n"
            "create index concurrently scheduled_kind_idx on awa.scheduled (kind);\n")
    extra = Migration(version=len(known) + 1, name="scheduled_kind", text=text,
                      checksum=checksum(text.encode()), transactional=False)

    def run(conn):
        return migrate.migrate(conn, Roles(), migrations=[*known, extra],
                               log=lambda _line: None)

    with pooled.connect() as conn, pytest.raises(migrate.MigrationError) as refused:
        run(conn)
    assert f"{extra.label} runs outside a transaction" in str(refused.value)
    assert "direct connection" in str(refused.value)

    def index_and_record(conn):
        return conn.execute(
            "select to_regclass('awa.scheduled_kind_idx') is not null,"
            " exists (select from awa.schema_migrations where version = %s)",
            [extra.version]).fetchone()

    with pooled.db.connect() as conn:
        assert index_and_record(conn) == (False, False)
        run(conn)
        assert index_and_record(conn) == (True, True)


# -- the auto-scaler, the admin API and the metrics exporter ---------------------------


def test_autoscale_tick_through_the_pooler(pooled, logins):
    """A real lane wait (a holder and a waiter, each on a server connection),
    then two controllers through the pooler: one raises S, the other gets no
    rows while the first holds the leader lock."""
    maintenance = pooled.db.login_role("awa_maintenance")
    since = mark(pooled)
    with pooled.connect(logins.producer) as p:
        awa_sql.enqueue(p, "job", queue="scaled")
    with pooled.connect(logins.operator) as op:
        awa_sql.set_shard_mode(op, "scaled", "auto", 4)
        op.execute("select awa.set_autoscale_policy('scaled', cooldown => '0'::interval,"
                   " min_samples => 1)")
    holder = pooled.connect(logins.producer, autocommit=False)
    awa_sql.enqueue(holder, "job", queue="scaled", ordering_key=b"k")
    waiter = threading.Thread(target=lambda: awa_sql.Producer(
        pooled.dsn(logins.producer), snapshot_every=None).enqueue(
            "job", queue="scaled", ordering_key=b"k"))
    waiter.start()
    try:
        with pooled.db.connect() as admin:
            _wait_for(lambda: admin.execute(
                "select count(*) from pg_locks where locktype = 'advisory'"
                " and classid = 1635213644 and not granted"
                " and database = (select oid from pg_database where datname = current_database())"
                ).fetchone()[0] == 1,
                "the waiter to queue on the lane lock")
        first = pooled.connect(maintenance, autocommit=False)
        try:
            decided = awa_sql.autoscale_tick(first)
            with pooled.connect(maintenance) as second:
                assert awa_sql.autoscale_tick(second) == []
            first.commit()
        finally:
            first.close()
    finally:
        holder.commit()
        holder.close()
        waiter.join(30)
    assert [(d.action, d.current_shards, d.proposed_shards) for d in decided] == [
        ("raised", 1, 2)]
    with pooled.connect(logins.producer) as p:
        assert p.execute("select awa.enqueue_shards('scaled')").fetchone()[0] == 2
    assert log_problems(pooled, since) == []


def test_admin_api_reads_and_writes_through_the_pooler(pooled):
    from tests.support.admin import auth, client_for, operator_login, reader_login

    since = mark(pooled)
    with pooled.db.connect() as conn:
        conn.execute("select awa.enqueue('web', 'job')")
    with client_for(pooled.dsn(operator_login(pooled.db)), writable=True) as client:
        for _ in range(8):  # enough repeats for psycopg to prepare, if it would
            assert client.get("/api/queues").status_code == 200
            assert client.get("/api/queues/web").json()["enqueue_shards"] >= 1
        put = client.put("/api/queues/web/enqueue-shards", json={"shards": 4}, headers=auth())
        assert put.status_code == 200, put.text
        mode = client.put("/api/queues/web/shard-mode",
                          json={"mode": "shadow", "max_shards": 8}, headers=auth())
        assert mode.status_code == 200, mode.text
        assert client.post("/api/queues/web/pause", headers=auth()).status_code == 200
        bad = client.put("/api/queues/web/enqueue-shards", json={"shards": 65}, headers=auth())
        assert bad.status_code == 400
        detail = client.get("/api/queues/web").json()
        assert (detail["enqueue_shards"], detail["shard_mode"], detail["paused"]) == (
            4, "shadow", True)
    with client_for(pooled.dsn(reader_login(pooled.db)), writable=False) as client:
        for _ in range(8):
            assert client.get("/api/queues/web").status_code == 200
    problems = [p for p in log_problems(pooled, since)
                if "enqueue shards must be between 1 and 64" not in p]
    assert problems == []


def test_metrics_exporter_through_the_pooler(pooled):
    from prometheus_client import generate_latest

    from awa_sql.metrics.apps import database_registry

    since = mark(pooled)
    with pooled.db.connect() as conn:
        conn.execute("select awa.enqueue('scraped', 'job')")
    # The exporter's own connection, as `awa metrics serve` opens it.
    registry = database_registry(pooled.dsn(pooled.db.login_role("awa_reader")))
    for _ in range(8):
        body = generate_latest(registry)
    assert b"awa_up 1.0" in body
    assert b'awa_queue_depth{logical_queue="scraped",queue="scraped"} 1.0' in body
    assert log_problems(pooled, since) == []
