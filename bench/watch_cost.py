"""What watching a queue costs, with a big backlog and a long history against
an empty queue, side by side on one server.

Two queues at S = 8: `empty`, and `full` with 1,000,000 ready jobs (keyed
over all its lanes) and 5,000,000 terminal ones (completed, 2% failed) in
awa.finished. For each, the median of 9 timings of:

  overview       select * from awa.queue_overview where queue = Q
  lanes          select * from awa.lane_overview where queue = Q
  scrape         a whole /metrics scrape (awa_sql.metrics.database.render),
                 of the same two queues before `full` is filled and after
  exact counts   awa.queue_counts(Q), which reads every row on purpose

Target (the steady-state issue): the overview and a scrape with `full` take
at most 2x their time with only `empty`.

    python bench/watch_cost.py [--ready 1000000] [--finished 5000000] [--write-docs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql.metrics.database import render
from bench import _docs
from bench._server import bench_server, machine

RUNS = 9


def fill(conn: psycopg.Connection, ready: int, finished: int) -> None:
    for start in range(0, ready, 50_000):
        n = min(50_000, ready - start)
        conn.execute("select count(*) from awa.enqueue_batch(array_fill('full'::text, array[%s]),"
                     " array_fill('bench.job'::text, array[%s]), ordering_keys =>"
                     " array(select convert_to('k' || i, 'UTF8')"
                     " from generate_series(%s::int, %s::int) i))", [n, n, start, start + n - 1])
    conn.execute("""
        insert into awa.finished (job_id, slot, queue_id, priority, kind, state, attempt,
                                  max_attempts, enqueued_at, finished_at)
        select nextval('awa.job_id_seq'), awa._finished_slot(st, t), m.queue_id, 2, 'bench.job',
               st, 1, 25, t, t
          from awa.queue_meta m,
               lateral (select case when i %% 50 = 0 then 'failed' else 'completed' end as st,
                               now() - (i %% 20) * interval '1 hour' as t
                          from generate_series(1, %s) i) x
         where m.queue = 'full'
    """, [finished])
    conn.execute("vacuum analyze")


def timed(conn: psycopg.Connection, call) -> float:
    call(conn)  # warm the plan and the cache
    samples = []
    for _ in range(RUNS):
        started = time.perf_counter()
        call(conn)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ready", type=int, default=1_000_000)
    ap.add_argument("--finished", type=int, default=5_000_000)
    _docs.add_argument(ap)
    args = ap.parse_args()
    block = _docs.Block(__file__, "Watching a queue", args.write_docs)
    with bench_server() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        for q in ("empty", "full"):
            conn.execute("select awa.set_enqueue_shards(%s, 8)", [q])
        # The same queues and lanes, before `full` holds anything.
        scrape_empty = timed(conn, render)
        print("filling ...", file=sys.stderr, flush=True)
        fill(conn, args.ready, args.finished)
        rows = {}
        for q in ("empty", "full"):
            rows[q] = {
                "overview": timed(conn, lambda c, q=q: c.execute(
                    "select * from awa.queue_overview where queue = %s", [q]).fetchall()),
                "lanes": timed(conn, lambda c, q=q: c.execute(
                    "select * from awa.lane_overview where queue = %s", [q]).fetchall()),
                "exact counts": timed(conn, lambda c, q=q: c.execute(
                    "select * from awa.queue_counts(%s)", [q]).fetchall()),
            }
        scrape_full = timed(conn, render)
        depth = conn.execute("select ready, completed from awa.queue_overview"
                             " where queue = 'full'").fetchone()
    print(f"# watch_cost: {machine()}; PostgreSQL 18; medians of {RUNS}, ms;"
          f" `full`: {args.ready:,} ready, {args.finished:,} terminal"
          f" (overview says ready {depth[0]:,})")
    print("| read | empty queue | full queue | full / empty |")
    print("|---|---:|---:|---:|")
    for name in ("overview", "lanes", "exact counts"):
        e, f = rows["empty"][name], rows["full"][name]
        print(f"| {name} | {e:.2f} | {f:.2f} | {f / e:.2f}x |")
    print(f"| /metrics scrape (whole server) | {scrape_empty:.2f} | {scrape_full:.2f}"
          f" | {scrape_full / scrape_empty:.2f}x |")
    ok = (rows["full"]["overview"] <= 2 * rows["empty"]["overview"]
          and scrape_full <= 2 * scrape_empty)
    print(f"\ntarget (overview and scrape at most 2x empty): {'met' if ok else 'missed'}")
    overview = rows["full"]["overview"] / rows["empty"]["overview"]
    block.write([_docs.Target("the overview and a scrape with `full` at most 2x with only `empty`",
                              ok, f"overview {overview:.2f}x, scrape"
                                  f" {scrape_full / scrape_empty:.2f}x")])


if __name__ == "__main__":
    main()
