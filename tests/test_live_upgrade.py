"""`awa migrate` on a live queue: the function layer applied again while
producers, workers and readers run."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg
import pytest

from awa_sql import client, migrate
from awa_sql.roles import Roles
from awa_sql.source import load_layer
from tests.support.jobs import COPY_SQL, claim
from tests.support.schema import dump as dump_schema

# Table locks that hold writers off (RowExclusiveLock conflicts with each).
WRITER_BLOCKING = ("ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock")
# What holds a view's readers off (AccessShareLock conflicts with it alone).
READER_BLOCKING = ("AccessExclusiveLock",)


def _layer_changed(db) -> None:
    """What a new package version does: the layer is applied again as a whole."""
    with db.connect() as conn:
        conn.execute("update awa.schema_functions set checksum = 'changed'"
                     " where file = 'private.sql'")


def _ready(conn: psycopg.Connection, queue: str) -> int:
    return conn.execute("select count(*) from awa.ready r join awa.queue_meta m using"
                        " (queue_id) where m.queue = %s", [queue]).fetchone()[0]


def test_the_layer_applied_again_takes_no_lock_that_holds_writers_off_a_table_or_readers_off_a_view(
        db):
    """A trigger is made again only when it differs: CREATE TRIGGER would wait
    for every COPY load in flight and hold every next one off until the
    layer commits (DROP TRIGGER, readers too). A view is replaced only when
    it differs: CREATE OR REPLACE VIEW would wait for every transaction that
    read it and hold every next reader off until the layer commits."""
    with db.connect() as conn, conn.transaction(force_rollback=True):
        conn.execute("select set_config('search_path', 'pg_catalog, pg_temp', true)")
        conn.execute(migrate._layer_sql(load_layer(), Roles(), "0.0.0-test"))
        held = conn.execute(
            "select l.relation::regclass::text, l.mode from pg_locks l"
            " join pg_class c on c.oid = l.relation"
            " where l.pid = pg_backend_pid() and l.locktype = 'relation'"
            " and (c.relkind in ('r', 'p') and l.mode = any(%s)"
            "      or c.relkind = 'v' and l.mode = any(%s)) order by 1, 2",
            [list(WRITER_BLOCKING), list(READER_BLOCKING)]).fetchall()
        views = conn.execute("select count(*) from pg_class where relkind = 'v'"
                             " and relnamespace = 'awa'::regnamespace").fetchone()[0]
    assert held == []
    assert views >= 7


def test_migrate_runs_while_a_transaction_that_read_every_view_is_open(db, logins):
    """A dashboard's transaction left open (a psql session) made the apply
    wait --lock-timeout and exit 5, and every reader after it queued."""
    reader = db.connect(logins.reader, autocommit=False)
    try:
        views = reader.execute("select c.oid::regclass::text from pg_class c"
                               " where c.relkind = 'v' and c.relnamespace = 'awa'::regnamespace"
                               " order by 1").fetchall()
        assert len(views) >= 7
        for (view,) in views:
            reader.execute(f"select * from {view} limit 1").fetchall()
        _layer_changed(db)
        result = db.awa("migrate", "--lock-timeout", "1s")
        assert result.returncode == 0, result.stderr
        assert "applied function layer" in result.stdout
        reader.execute("select * from awa.queue_overview").fetchall()
        reader.commit()
    finally:
        reader.close()


def _migrate_undoes(db, *changes: str) -> None:
    """Makes ``changes`` as the owner, then asserts the next layer apply puts
    the schema back as it was."""
    with db.connect() as conn:
        before = dump_schema(conn)
        conn.execute("set role awa_owner")
        for change in changes:
            conn.execute(change)
        conn.execute("reset role")
        assert dump_schema(conn) != before
    _layer_changed(db)
    db.awa("migrate", check=True)
    with db.connect() as conn:
        assert dump_schema(conn) == before


def test_a_view_that_differs_from_the_layer_is_replaced_keeping_its_grants(db, logins):
    """A changed definition, changed options and a missing view: the next
    layer puts each back as the files write it, with its grants and comment,
    and a view that depends on a replaced one stays."""
    _migrate_undoes(
        db,
        "create or replace view awa.runtime_overview as select r.instance_id,"
        " r.kind, r.hostname, r.pid, r.version, r.in_flight, r.owner_login,"
        " r.started_at, r.last_seen from awa.runtimes as r",
        "alter view awa.queue_history set (security_barrier = true)",
        "drop view awa.lane_overview")
    with db.connect(logins.reader) as conn:
        conn.execute("select * from awa.lane_overview").fetchall()
        conn.execute("select * from awa.runtime_queue_overview").fetchall()


def test_migrate_runs_while_a_copy_load_is_open_and_the_load_lands(db, logins):
    producer = db.connect(logins.producer, autocommit=False)
    try:
        with producer.cursor().copy(COPY_SQL) as cp:
            for _ in range(3):
                cp.write_row(("live-load", 2, None, "k", "{}", None, 5))
        _layer_changed(db)
        result = db.awa("migrate", "--lock-timeout", "1s")
        assert result.returncode == 0, result.stderr
        assert "applied function layer" in result.stdout
        producer.commit()  # the commit trigger moves the staged rows
    finally:
        producer.close()
    # A new load, through the triggers as the layer left them.
    with db.connect(logins.producer) as conn, conn.transaction(), \
            conn.cursor().copy(COPY_SQL) as cp:
        cp.write_row(("live-load", 2, None, "k", "{}", None, 5))
    with db.connect() as conn:
        assert _ready(conn, "live-load") == 4
        assert conn.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0


def test_a_trigger_that_differs_from_the_layer_is_made_again(db):
    _migrate_undoes(
        db,
        "drop trigger copy_pending_move on awa.copy_pending",
        "create or replace trigger copy_staging_note after insert on"
        " awa.copy_staging for each row execute function awa._note_copy()")


@pytest.mark.parametrize("how", ["disable trigger copy_pending_move",
                                 "enable replica trigger copy_pending_move",
                                 "enable trigger copy_pending_move"])
def test_a_trigger_left_disabled_is_enabled_again(db, logins, how):
    """pg_get_triggerdef does not print whether a trigger fires: one left
    disabled (an interrupted restore with --disable-triggers, an ALTER TABLE)
    printed as the layer writes it, and a COPY load's jobs stayed staged."""
    with db.connect() as conn:
        conn.execute("set role awa_owner")
        conn.execute(f"alter table awa.copy_pending {how}")
        conn.execute("reset role")
    _layer_changed(db)
    db.awa("migrate", check=True)
    with db.connect() as conn:
        assert conn.execute("select tgenabled from pg_trigger where tgname = 'copy_pending_move'"
                            ).fetchone()[0] == "A"  # fires in every replication role
    with db.connect(logins.producer) as conn, conn.transaction(), \
            conn.cursor().copy(COPY_SQL) as cp:
        cp.write_row(("disabled-trigger", 2, None, "k", "{}", None, 5))
    with db.connect() as conn:
        assert _ready(conn, "disabled-trigger") == 1


def test_producers_and_workers_see_no_error_while_the_layer_is_applied_again(db, logins):
    """Enqueue, batch, COPY, claim, heartbeat and complete in loops, over
    prepared statements, while the layer is applied three times: no call
    fails, every producer, worker and view reader loop made calls while a
    layer was being applied (a reader of a view no longer waits for the
    apply's commit), and every job is ready or finished, none completed
    twice."""
    queue = "live-traffic"
    applying, stop = threading.Event(), threading.Event()
    errors: list[str] = []
    during: Counter[str] = Counter()
    enqueued: set[int] = set()
    copied = [0]
    completed: Counter[int] = Counter()
    lock = threading.Lock()

    def loop(login: str, name: str, work) -> None:
        with psycopg.connect(db.dsn(login), autocommit=True) as conn:
            conn.prepare_threshold = 0
            while not stop.is_set():
                was = applying.is_set()
                try:
                    work(conn)
                except psycopg.Error as err:
                    with lock:
                        errors.append(f"{name}: {err.sqlstate} {err}")
                    return
                if was and applying.is_set():
                    with lock:
                        during[name] += 1

    def single(conn):
        job = client.enqueue(conn, "k", queue=queue)
        with lock:
            enqueued.add(job.job_id)

    def batch(conn):
        jobs = client.enqueue_many(conn, [{"kind": "k", "queue": queue}] * 5)
        with lock:
            enqueued.update(j.job_id for j in jobs)

    def copy(conn):
        n = client.enqueue_many_copy(conn, [{"kind": "k"}] * 5, queue=queue)
        with lock:
            copied[0] += n

    def work(conn):
        for job_id, lease in [r[:2] for r in claim(conn, [queue], 5)]:
            conn.execute("select awa.heartbeat(%s, %s, '5 minutes')", [job_id, lease])
            assert conn.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
            with lock:
                completed[job_id] += 1

    def read(conn):
        conn.execute("select * from awa.queue_overview").fetchall()

    loops = [threading.Thread(target=loop, args=args, daemon=True) for args in [
        (logins.producer, "enqueue", single), (logins.producer, "batch", batch),
        (logins.producer, "copy", copy), (logins.worker, "work", work),
        (logins.reader, "read", read)]]
    for t in loops:
        t.start()
    try:
        with db.connect() as runner:
            for _ in range(3):
                _layer_changed(db)
                applying.set()
                migrate.migrate(runner, Roles(), log=lambda _line: None)
                applying.clear()
    finally:
        stop.set()
        for t in loops:
            t.join(timeout=30)
    assert not [t.name for t in loops if t.is_alive()], "a loop never ended"
    assert errors == []
    assert {"enqueue", "batch", "copy", "work", "read"} <= set(during), during
    assert max(completed.values(), default=1) == 1
    with db.connect() as conn:
        finished = conn.execute(
            "select count(*) from awa.finished f join awa.queue_meta m using (queue_id)"
            " where m.queue = %s", [queue]).fetchone()[0]
        assert finished == len(completed)
        assert _ready(conn, queue) + finished == len(enqueued) + copied[0]



def test_a_trigger_definition_not_as_postgresql_prints_it_is_refused(db):
    """Otherwise every apply would find it different and make it again,
    taking the table's lock each time."""
    with db.connect() as conn, conn.transaction(force_rollback=True):
        conn.execute("set local role awa_owner")
        conn.execute("create table awa.trigger_probe (x integer)")
        made = ("CREATE TRIGGER probe AFTER INSERT ON awa.trigger_probe"
                " FOR EACH ROW EXECUTE FUNCTION awa._note_copy()")
        with pytest.raises(psycopg.errors.InvalidObjectDefinition, match="prints as"), \
                conn.transaction():
            conn.execute("select awa._ensure_trigger('awa.trigger_probe', 'probe', %s)",
                         [made.lower()])
        conn.execute("select awa._ensure_trigger('awa.trigger_probe', 'probe', %s)", [made])
        oid = conn.execute("select oid from pg_trigger where tgname = 'probe'").fetchone()
        conn.execute("select awa._ensure_trigger('awa.trigger_probe', 'probe', %s)", [made])
        assert conn.execute("select oid from pg_trigger where tgname = 'probe'").fetchone() == oid


def test_a_view_is_made_from_its_scratch_options_included_and_only_when_it_differs(db):
    """The scratch is dropped whatever happens; a view of the same shape
    keeps its rule row (it was not replaced), one of other options or
    columns is replaced, its comment kept."""
    with db.connect() as conn, conn.transaction(force_rollback=True):
        conn.execute("set local role awa_owner")

        def ensure(query: str, options: str = "") -> str:
            conn.execute(f"create view awa._new_probe {options} as {query}")
            conn.execute("select awa._ensure_view('awa.probe', 'awa._new_probe')")
            assert conn.execute("select to_regclass('awa._new_probe')").fetchone()[0] is None
            return conn.execute("select ctid::text from pg_rewrite"
                                " where ev_class = 'awa.probe'::regclass").fetchone()[0]

        def shape() -> str:
            return conn.execute("select awa._view_shape('awa.probe')").fetchone()[0]

        made = ensure("select q.queue from awa.queue_meta as q", "with (security_barrier)")
        conn.execute("comment on view awa.probe is 'kept'")
        before = shape()
        assert ensure("select q.queue from awa.queue_meta as q",
                      "with (security_barrier)") == made
        assert shape() == before
        assert ensure("select q.queue from awa.queue_meta as q") != made
        assert "security_barrier" not in shape()
        made = ensure("select q.queue, 1 as one from awa.queue_meta as q")
        assert "one integer" in shape()
        assert ensure("select q.queue, 1 as one from awa.queue_meta as q") == made
        conn.execute("create view awa._new_probe as select 1")
        with pytest.raises(psycopg.errors.InvalidParameterValue), conn.transaction():
            conn.execute("select awa._ensure_view('probe', 'awa._new_probe')")
        assert conn.execute("select obj_description('awa.probe'::regclass)").fetchone()[0] \
            == "kept"
