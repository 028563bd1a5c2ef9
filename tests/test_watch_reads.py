"""What runs every few seconds reads what the queues' shape costs, not their
history: the contention view (each scrape and admin refresh), the
auto-scaler's tick, the metrics scrape, the admin page's decisions and
`awa storage show`, with tens of thousands of rows of the auto-scaler's log
and samples that they must not read."""

from __future__ import annotations

import psycopg

from awa_sql import shards
from awa_sql.admin import queries
from awa_sql.admin.app import Settings, make_pool
from awa_sql.metrics import database
from tests.support.jobs import function_calls
from tests.support.reads import rows_read, rows_read_by

OLD_ROWS = 30_000


def _decisions(conn: psycopg.Connection, queue: str, rows: int, ago: str) -> None:
    """`rows` folded holds of `queue`, the newest `ago` old, one a second before."""
    conn.execute(
        "insert into awa.autoscale_decisions (queue, decided_at, last_decided_at, mode,"
        " samples, current_shards, proposed_shards, action, reason, reason_code)"
        " select %(q)s, t, t, 'shadow', 1, 1, 1, 'held', 'r' || i %% 2, 'c' || i %% 2"
        " from generate_series(1, %(n)s) as i,"
        " lateral (select now() - %(ago)s::interval - make_interval(secs => i)) as x (t)",
        {"q": queue, "n": rows, "ago": ago})


def _shadow_queue(conn: psycopg.Connection) -> None:
    """The queue 'watched', at S = 1, its auto-scaler in shadow mode up to 8."""
    conn.execute("select awa.set_enqueue_shards('watched', 1)")
    conn.execute("select awa.set_shard_mode('watched', 'shadow', 8)")


def test_lane_contention_reads_the_last_minute_not_the_hour(db):
    with db.connect() as admin:
        admin.execute("select awa.set_enqueue_shards('sampled', 2)")
        queue_id = admin.execute("select queue_id from awa.queue_meta"
                                 " where queue = 'sampled'").fetchone()[0]
        # Samples kept for the hour, all but three older than the minute.
        admin.execute(
            "insert into awa.contention_samples (sampled_at, queue_id, lanes, lanes_held,"
            " lanes_waited, waiters)"
            " select now() - interval '2 minutes' - make_interval(secs => i * 0.1), %s,"
            " 8, 1, 0, 0 from generate_series(1, %s) as i", [queue_id, OLD_ROWS])
        admin.execute(
            "insert into awa.contention_samples (sampled_at, queue_id, lanes, lanes_held,"
            " lanes_waited, waiters)"
            " select now() - make_interval(secs => i), %s, 8, 2, 1, 3"
            " from generate_series(1, 3) as i", [queue_id])
        admin.execute("analyze awa.contention_samples")
        assert admin.execute("select samples from awa.lane_contention"
                             " where queue = 'sampled'").fetchone()[0] == 3
        assert rows_read(admin, "awa.contention_samples",
                         "select * from awa.lane_contention") <= 20


def test_a_tick_finds_a_shadow_queues_last_step_without_reading_its_log(db, logins):
    with db.connect() as admin:
        _shadow_queue(admin)
        _decisions(admin, "watched", OLD_ROWS, "1 minute")
        admin.execute("analyze awa.autoscale_decisions")
    with db.connect(logins.maintenance) as m:
        read = rows_read(m, "awa.autoscale_decisions", "select * from awa.autoscale_tick()")
    # The last would-be step (none), the latest row to fold into, the prune's
    # probe; not the queue's 30,000 holds.
    assert read <= 20, read


def test_the_scrape_counts_decisions_without_reading_the_log(db, logins):
    with db.connect() as admin:
        _shadow_queue(admin)
        _decisions(admin, "watched", OLD_ROWS, "10 minutes")
        admin.execute("analyze awa.autoscale_decisions")
    with db.connect(logins.maintenance) as m:
        for _ in range(3):
            m.execute("select * from awa.autoscale_tick()")
    with db.connect(logins.reader) as reader:
        read = rows_read_by(reader, "awa.autoscale_decisions", lambda: database.scrape(reader))
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in database.scrape(reader) for s in family.samples}
    assert read <= 20, read
    held = (("action", "held"), ("queue", "watched"))
    # The three ticks, counted as they were made; the 30,000 rows loaded
    # behind the auto-scaler's back are in the log only.
    assert samples[("awa_autoscale_decisions_total", held)] == 3
    assert samples[("awa_autoscale_decisions_recent", held)] == 3


def test_a_run_of_holds_that_began_long_ago_counts_its_recent_ticks_only(db, logins):
    """Holds fold into one row whose repeats grow at every tick: a queue held
    for 50 minutes at a tick every 5 s has 600. The 5-minute gauge counts
    the share of them in its window (about 60), not all 600."""
    with db.connect() as admin:
        _shadow_queue(admin)
        admin.execute(
            "insert into awa.autoscale_decisions (queue, decided_at, last_decided_at, repeats,"
            " mode, samples, current_shards, proposed_shards, action, reason, reason_code)"
            " values ('watched', now() - interval '3000 seconds', now() - interval '1 second',"
            " 600, 'shadow', 1, 1, 1, 'held', 'r', 'c')")
    with db.connect(logins.reader) as reader:
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in database.scrape(reader) for s in family.samples}
    recent = samples[("awa_autoscale_decisions_recent", (("action", "held"), ("queue", "watched")))]
    assert 59 <= recent <= 61, recent


def test_the_decision_counter_keeps_what_the_log_prunes(db, logins):
    with db.connect() as admin:
        _shadow_queue(admin)
    with db.connect(logins.maintenance) as m:
        for _ in range(3):
            m.execute("select * from awa.autoscale_tick()")
    with db.connect() as admin:
        admin.execute("delete from awa.autoscale_decisions")  # as the 24-hour prune does
    with db.connect(logins.maintenance) as m:
        m.execute("select * from awa.autoscale_tick()")
    with db.connect() as admin:
        assert admin.execute("select sum(repeats) from awa.autoscale_decisions").fetchone()[0] == 1
        assert admin.execute("select decisions from awa.autoscale_decision_counts"
                             " where queue = 'watched' and action = 'held'").fetchone()[0] == 4


def test_the_admin_page_and_storage_show_read_a_queues_latest_decisions(db):
    """Half the log is the queue's, older than the other half: a read down the
    log from its newest row, or a sort of the queue's rows, reads 15,000."""
    with db.connect() as admin:
        for queue in ("older", "newer"):
            admin.execute("select awa.set_enqueue_shards(%s, 1)", [queue])
            admin.execute("select awa.set_shard_mode(%s, 'shadow', 8)", [queue])
        _decisions(admin, "older", OLD_ROWS // 2, "10 hours")
        _decisions(admin, "newer", OLD_ROWS // 2, "1 minute")
        admin.execute("analyze awa.autoscale_decisions")
        read = rows_read_by(admin, "awa.autoscale_decisions",
                            lambda: shards.show(admin, "older"))
        assert read <= 20, read
    pool = make_pool(Settings(db.dsn()), open_now=True)
    try:
        with pool.connection() as conn:
            for _ in range(12):  # past the runs before a statement is prepared
                detail = queries.queue_detail(conn, "older")
            assert {d["queue"] for d in detail["decisions"]} == {"older"}
            read = rows_read_by(conn, "awa.autoscale_decisions",
                                lambda: queries.queue_detail(conn, "older"))
            assert read <= 50, read
    finally:
        pool.close()


def test_a_removed_queues_decision_counts_go_with_it(db, logins):
    """The counter is its queue's: once the queue is dropped and removed, the
    next tick removes its rows and the scrape exports no series of it. Kept,
    every auto-scaled queue ever dropped left its rows, ten series and a
    probe of the log at every scrape, for good."""
    with db.connect() as admin:
        _shadow_queue(admin)
        admin.execute("select awa.set_enqueue_shards('gone', 1)")
        admin.execute("select awa.set_shard_mode('gone', 'shadow', 8)")
    with db.connect(logins.maintenance) as m:
        m.execute("select * from awa.autoscale_tick()")
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.drop_queue('gone')").fetchone()[0] is True
    with db.connect(logins.maintenance) as m:
        assert [r[2] for r in m.execute("select * from awa.finish_drops()")] == ["removed"]
        m.execute("select * from awa.autoscale_tick()")
    with db.connect() as admin:
        assert admin.execute("select queue, action, decisions"
                             " from awa.autoscale_decision_counts").fetchall() == [
            ("watched", "held", 2)]
    with db.connect(logins.reader) as reader:
        named = {s.labels.get("queue") for family in database.scrape(reader)
                 for s in family.samples}
    assert "watched" in named
    assert "gone" not in named


def test_the_admin_page_reads_one_changes_evidence_not_the_change_history(db):
    """The page sums the lanes' evidence of the queue's last change over
    its physical queues: by name and time through the view, not every
    change kept for 90 days (the other queues' and its own older ones)."""
    with db.connect() as admin:
        admin.execute("select awa.set_queue_stripes('hist', 2)")
        admin.execute("select awa.set_enqueue_shards('hist', 2)")
        admin.execute(
            "insert into awa.shard_changes (queue, old_shards, new_shards, lanes_created,"
            " changed_at) select case when n %% 2 = 0 then 'hist' else 'noise' end, 1, 2, 0,"
            " now() - interval '1 day' - n * interval '1 second'"
            " from generate_series(1, %s) as n", [OLD_ROWS])
        admin.execute("analyze awa.shard_changes")
    pool = make_pool(Settings(db.dsn()), open_now=True)
    try:
        with pool.connection() as conn:
            for _ in range(12):  # past the runs before a statement is prepared
                detail = queries.queue_detail(conn, "hist")
            assert detail["runtimes"]["lane_evidence"]["shards"] == 2
            read = rows_read_by(conn, "awa.shard_changes",
                                lambda: queries.queue_detail(conn, "hist"))
            assert read <= 100, read
    finally:
        pool.close()


def test_a_scrape_costs_each_queue_one_lane_read_and_an_empty_lane_no_sequence(db, logins):
    """Per queue, a scrape calls awa._lane_starts once (the lane rows'; the
    queue rows' depth and lag are their sums, not a second read), reads the
    queue's four counters and its capped count of scheduled jobs, and reads
    a lane's sequence only when the lane holds a ready job. Before, each
    queue cost five calls and each lane two sequence reads, in the queue
    rows and again in the lane rows. On PostgreSQL 18 the scrape keeps no
    lock on a sequence it read (pg_get_sequence_data); pg_sequence_last_value
    keeps one to the end of the statement, which on 17 still takes a slot
    of the lock table per sequence read: at 10,000 queues, before, 80,000,
    past a default lock table's 64 per connection."""
    queues = 30
    with db.connect() as su:
        for i in range(queues):
            su.execute("select awa.set_enqueue_shards(%s, 1)", [f"w{i:02d}"])
        su.execute("select awa.enqueue('w00', 'k')")
        su.execute("select awa.enqueue('w01', 'k', priority => 3::smallint)")
        su.execute("select awa.enqueue('w01', 'k', run_at => now() + interval '1 hour')")
    with db.connect(autocommit=False) as su:
        su.execute("set local track_functions = 'all'")
        su.execute(f"set local role {logins.reader}")
        su.execute(database.SCRAPE_SQL).fetchall()
        calls = {f: function_calls(su, f"awa.{f}") for f in (
            "_lane_starts", "_lane_last_seq", "_queue_counter", "_scheduled_capped",
            "_lane_states")}
        held = su.execute(
            "select count(*) from pg_catalog.pg_locks as l"
            " join pg_catalog.pg_class as c on c.oid = l.relation"
            " where l.pid = pg_catalog.pg_backend_pid() and c.relkind = 'S'").fetchone()[0]
        su.rollback()
    assert calls == {"_lane_starts": queues, "_lane_last_seq": 2,
                     "_queue_counter": 4 * queues, "_scheduled_capped": queues,
                     "_lane_states": 0}
    assert held == (0 if db.cluster.major >= 18 else 4 * queues + 2)

