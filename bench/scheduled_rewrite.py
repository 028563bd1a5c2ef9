"""What dead rows in awa.scheduled cost while a snapshot is held, and what one
awa.compact_scheduled() (ADR 047) gives back.

A queue holds `--live` jobs for later (default 10,000, due in a day). A
session holds a snapshot open (REPEATABLE READ, as a long report does);
then `--dead` rows (default 1,000,000) of that queue, due at random in the
last hour (so that their run_at order is not their order in the heap, as
for jobs enqueued with different delays), are inserted into awa.scheduled
and deleted, as the superuser: what promoting them leaves, dead rows no
vacuum can remove and their entries in every index. Each cell is
measured three times, before the dead rows, with them, and after one
awa.compact_scheduled() with the snapshot still held:

  promote_due   awa.promote_due() with nothing due, median ms of 21 calls,
                and the blocks of awa.scheduled and its indexes one call reads
  overview      select * from awa.queue_overview (what every /metrics scrape
                reads), median ms of 11
  backlog read  awa._scheduled_backlog(100001), the read that decides
                whether a rewrite may take the lock, median ms of 5

and the call of awa.compact_scheduled() itself, its time and what it
returned. Calls are made as the superuser on the bench server, one per
transaction.

    python bench/scheduled_rewrite.py [--dead 1000000] [--live 10000] [--write-docs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _docs
from bench._server import bench_server, machine

RELATIONS = ["awa.scheduled", "awa.scheduled_pkey", "awa.scheduled_run_at_idx",
             "awa.scheduled_queue_idx"]
BLOCKS = ("select coalesce(sum(pg_stat_get_xact_blocks_fetched(r::regclass)), 0)::bigint"
          " from unnest(%s::text[]) as r")


def median_ms(conn: psycopg.Connection, statement: str, calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        conn.execute(statement).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def blocks(conn: psycopg.Connection, statement: str) -> int:
    """Blocks of awa.scheduled and its indexes that one call reads."""
    with conn.transaction():
        before = conn.execute(BLOCKS, [RELATIONS]).fetchone()[0]
        conn.execute(statement).fetchall()
        return conn.execute(BLOCKS, [RELATIONS]).fetchone()[0] - before


def measure(conn: psycopg.Connection, label: str) -> dict:
    row = {
        "when": label,
        "dead": conn.execute("select pg_stat_get_dead_tuples('awa.scheduled'::regclass)"
                             ).fetchone()[0],
        "heap_mb": conn.execute("select pg_relation_size('awa.scheduled') / 1048576.0"
                                ).fetchone()[0],
        "promote_ms": median_ms(conn, "select awa.promote_due()", 21),
        "promote_blocks": blocks(conn, "select awa.promote_due()"),
        "overview_ms": median_ms(conn, "select * from awa.queue_overview", 11),
        "backlog_ms": median_ms(conn, "select * from awa._scheduled_backlog(100001)", 5),
    }
    print(f"  {label}: {row}", file=sys.stderr, flush=True)
    return row


def flush_stats(conn: psycopg.Connection) -> None:
    conn.execute("select pg_stat_force_next_flush()")
    conn.execute("select 1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dead", type=int, default=1_000_000)
    ap.add_argument("--live", type=int, default=10_000)
    _docs.add_argument(ap)
    args = ap.parse_args()
    block = _docs.Block(__file__, "Dead rows in awa.scheduled and their rewrite",
                        args.write_docs)
    rows = []
    with bench_server() as dsn, psycopg.connect(dsn, autocommit=True) as conn, \
            psycopg.connect(dsn) as horizon:
        server = conn.execute("show server_version").fetchone()[0]
        conn.execute("select count(*) from awa.enqueue_batch(array_fill('later'::text, array[%s]),"
                     " array_fill('bench.job'::text, array[%s]),"
                     " args => array(select jsonb_build_object('n', i)"
                     "               from generate_series(1, %s) as i),"
                     " run_ats => array_fill(now() + interval '1 day', array[%s]))",
                     [args.live] * 4)
        conn.execute("vacuum analyze awa.scheduled")
        flush_stats(conn)
        rows.append(measure(conn, "no dead rows"))
        horizon.execute("begin isolation level repeatable read")
        horizon.execute("select 1")  # the snapshot every dead row below outlives
        print(f"making {args.dead:,} dead rows ...", file=sys.stderr, flush=True)
        queue_id = conn.execute("select queue_id from awa.queue_meta where queue = 'later'"
                                ).fetchone()[0]
        conn.execute("insert into awa.scheduled (job_id, queue_id, priority, kind, args,"
                     " attempt, max_attempts, enqueued_at, run_at)"
                     " select -g, %s, 2, 'bench.job', jsonb_build_object('n', g), 0, 25,"
                     " now() - interval '2 hours', now() - interval '1 hour' * random()"
                     " from generate_series(1, %s) as g", [queue_id, args.dead])
        conn.execute("delete from awa.scheduled where job_id < 0")
        flush_stats(conn)
        conn.execute("vacuum awa.scheduled")  # removes none of them: the snapshot holds them
        flush_stats(conn)
        rows.append(measure(conn, f"{args.dead:,} dead rows, snapshot held"))
        started = time.perf_counter()
        rewrote = conn.execute("select awa.compact_scheduled()").fetchone()[0]
        rewrite_ms = (time.perf_counter() - started) * 1000
        flush_stats(conn)
        rows.append(measure(conn, "after one compact_scheduled(), snapshot still held"))
        live = conn.execute("select count(*) from awa.scheduled").fetchone()[0]
        horizon.rollback()
    print(f"# scheduled_rewrite: {machine()}; PostgreSQL {server}; {args.live:,} jobs for later"
          f" in one queue, {args.dead:,} dead rows of it made while a snapshot is held")
    print("| awa.scheduled | dead rows (statistics) | heap, MB | promote_due, ms |"
          " promote_due, blocks read | queue_overview, ms | backlog read, ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['when']} | {r['dead']:,} | {r['heap_mb']:.1f} | {r['promote_ms']:.2f} |"
              f" {r['promote_blocks']:,} | {r['overview_ms']:.2f} | {r['backlog_ms']:.2f} |")
    print(f"\nawa.compact_scheduled(): returned {rewrote} in {rewrite_ms:.0f} ms"
          f" (backlog read, copies and TRUNCATE); {live:,} jobs for later kept")
    before, after = rows[1]["promote_ms"], rows[2]["promote_ms"]
    baseline = rows[0]["promote_ms"]
    ok = rewrote == 1 and live == args.live and after <= max(2 * baseline, baseline + 1)
    print(f"\ntarget (one rewrite keeps every live row and brings promote_due back to within"
          f" twice its time without dead rows): {'met' if ok else 'missed'}")
    block.write([_docs.Target("one rewrite: every live row kept, promote_due within twice its"
                              " time without dead rows", ok,
                              f"{before:.1f} ms -> {after:.2f} ms (no dead rows:"
                              f" {baseline:.2f} ms)")])


if __name__ == "__main__":
    main()
