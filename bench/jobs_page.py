"""What the operators' job tools cost with 1,000 jobs per state against
1,000,000, on one server (ADR 025, ADR 029, ADR 031).

For each size N (1,000, 10,000 and 1,000,000), in turn, a queue at S = 8
gets N ready jobs (keyed over all its lanes), N scheduled ones, and N
failed and N completed ones in awa.finished (spread over the last 20
hours), and is timed; the database keeps the queues before it. Each number
is the best of 15 timings (after one to warm the plan and the cache): the
machine's other load only ever adds time, and the best is what the call
itself costs. The calls:

  failed page        awa.jobs(Q, 'failed')                 a page of 100
  failed deep page   awa.jobs(Q, 'failed', after => mid)    from the middle
  completed page     awa.jobs(Q, 'completed')
  scheduled page     awa.jobs(Q, 'scheduled')
  ready page         awa.jobs(Q, 'ready')     every lane from its head
  ready deep page    awa.jobs(Q, 'ready', after => mid)     each lane bisected
  all states page    awa.jobs(Q)
  count failed       awa.count_jobs(Q, 'failed')            up to 10,000
  job (failed)       awa.job(id)                            by key
  job (ready)        awa.job(id), the queue's newest ready job, and
  job (mid ready)    the one in the middle of its ready jobs: each lane with
                     ready rows bisected (ADR 031)
  job (unknown)      awa.job(id) of an id no job has: every such lane bisected

The session runs with synchronize_seqscans off, so that each scan starts
at the table's first block (with it on, a scan of a big table starts where
the last one stopped, and finds a row near there at once: faster, but by
chance).

Targets: with 1,000,000 jobs, every page (ready ones included, from the
front and from the middle of the backlog), the count and the keyed lookup
take at most 2x their time with 1,000. awa.job on a ready or unknown job
bisects every lane with ready rows in the database, so its cost follows
those lanes (8, 16, then 24 here: each size's queue is kept) and the log
of their depth; it is printed, marked (lanes), outside the target.

    python bench/jobs_page.py [--sizes 1000,10000,1000000] [--write-docs]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _docs
from bench._server import bench_server, machine

RUNS = 15
CHUNK = 50_000


def fill(conn: psycopg.Connection, queue: str, n: int) -> None:
    conn.execute("select awa.set_enqueue_shards(%s, 8)", [queue])
    for start in range(0, n, CHUNK):
        k = min(CHUNK, n - start)
        conn.execute(
            "select count(*) from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
            " array_fill('bench.job'::text, array[%s]),"
            " args => array_fill('{\"user\": 42}'::jsonb, array[%s]),"
            " ordering_keys => array(select convert_to('k' || i, 'UTF8')"
            " from generate_series(%s::int, %s::int) i))",
            [queue, k, k, k, start, start + k - 1])
    conn.execute("""
        insert into awa.scheduled (job_id, queue_id, priority, kind, args, attempt,
                                   max_attempts, enqueued_at, run_at)
        select nextval('awa.job_id_seq'), m.queue_id, 2, 'bench.job', '{"user": 42}', 0, 25,
               now(), now() + interval '1 day'
          from awa.queue_meta m, generate_series(1, %s)
         where m.queue = %s
    """, [n, queue])
    conn.execute("""
        insert into awa.finished (job_id, slot, queue_id, priority, kind, state, attempt,
                                  max_attempts, enqueued_at, finished_at, args, last_error)
        select nextval('awa.job_id_seq'), awa._finished_slot(x.st, x.t), m.queue_id, 2,
               'bench.job', x.st, 1, 25, x.t, x.t,
               case when x.st = 'failed' then '{"user": 42}'::jsonb end,
               case when x.st = 'failed' then 'boom' end
          from awa.queue_meta m,
               lateral (select case when i %% 2 = 0 then 'failed' else 'completed' end as st,
                               now() - (i %% 20) * interval '1 hour' as t
                          from generate_series(1, 2 * %s) i) x
         where m.queue = %s
    """, [n, queue])


def timed(conn: psycopg.Connection, sql: str, params: list) -> float:
    conn.execute(sql, params).fetchall()  # warm the plan and the cache
    samples = []
    for _ in range(RUNS):
        started = time.perf_counter()
        conn.execute(sql, params).fetchall()
        samples.append((time.perf_counter() - started) * 1000)
    return min(samples)


def calls(conn: psycopg.Connection, queue: str) -> dict[str, tuple[str, list]]:
    ids = conn.execute("""
        select (select min(f.job_id) from awa.finished f join awa.queue_meta m using (queue_id)
                 where m.queue = %(q)s and f.state = 'failed'),
               (select percentile_disc(0.5) within group (order by f.job_id)
                  from awa.finished f join awa.queue_meta m using (queue_id)
                 where m.queue = %(q)s and f.state = 'failed'),
               (select max(r.job_id) from awa.ready r join awa.queue_meta m using (queue_id)
                 where m.queue = %(q)s),
               (select percentile_disc(0.5) within group (order by r.job_id)
                  from awa.ready r join awa.queue_meta m using (queue_id)
                 where m.queue = %(q)s)
    """, {"q": queue}).fetchone()
    first_failed, mid_failed, last_ready, mid_ready = ids
    unknown = conn.execute("select nextval('awa.job_id_seq')").fetchone()[0]  # no job has it
    return {
        "failed page": ("select * from awa.jobs(%s, 'failed')", [queue]),
        "failed deep page": ("select * from awa.jobs(%s, 'failed', after_job_id => %s)",
                             [queue, mid_failed]),
        "completed page": ("select * from awa.jobs(%s, 'completed')", [queue]),
        "scheduled page": ("select * from awa.jobs(%s, 'scheduled')", [queue]),
        "ready page": ("select * from awa.jobs(%s, 'ready')", [queue]),
        "ready deep page": ("select * from awa.jobs(%s, 'ready', after_job_id => %s)",
                            [queue, mid_ready]),
        "all states page": ("select * from awa.jobs(%s)", [queue]),
        "count failed": ("select awa.count_jobs(%s, 'failed')", [queue]),
        "job (failed)": ("select * from awa.job(%s)", [first_failed]),
        "job (ready)": ("select * from awa.job(%s)", [last_ready]),
        "job (mid ready)": ("select * from awa.job(%s)", [mid_ready]),
        "job (unknown)": ("select * from awa.job(%s)", [unknown]),
    }


LANE_WALKS = ("job (ready)", "job (mid ready)", "job (unknown)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,1000000",
                    help="jobs per state of each queue, ascending (default %(default)s)")
    _docs.add_argument(ap)
    args = ap.parse_args()
    block = _docs.Block(__file__, "The job tools", args.write_docs)
    sizes = sorted(int(n) for n in args.sizes.split(","))
    results = {}
    with bench_server() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        for n in sizes:
            queue = f"q{n}"
            print(f"filling {queue}: {n:,} jobs per state ...", file=sys.stderr, flush=True)
            fill(conn, queue, n)
            conn.execute("vacuum analyze")
            conn.execute("set synchronize_seqscans = off")
            results[n] = {name: timed(conn, sql, params)
                          for name, (sql, params) in calls(conn, queue).items()}
        server = conn.execute("show server_version").fetchone()[0]
    print(f"# awa job tools, PostgreSQL {server}, {machine()}")
    print(f"# S = 8; ready, scheduled, failed and completed jobs per queue; best of {RUNS}, ms")
    names = list(results[sizes[0]])
    width = max(len(name) for name in names)
    print(f"{'call'.ljust(width)}  " + "  ".join(f"{n:>10,}" for n in sizes)
          + f"  {sizes[-1]:,} / baseline")
    missed = []
    worst = (0.0, "")
    for name in names:
        base = sizes[0]
        ratio = results[sizes[-1]][name] / results[base][name]
        mark = "  (lanes)" if name in LANE_WALKS else f"  vs {base:,}"
        print(f"{name.ljust(width)}  " + "  ".join(f"{results[n][name]:10.2f}" for n in sizes)
              + f"  {ratio:6.2f}{mark}")
        if name not in LANE_WALKS:
            worst = max(worst, (ratio, name))
            if ratio > 2:
                missed.append(name)
    print("targets (pages, count, keyed job within 2x of their baseline):",
          "met" if not missed else f"missed by {', '.join(missed)}")
    block.write([_docs.Target("pages, count and keyed job at most 2x their baseline", not missed,
                              f"at most {worst[0]:.2f}x ({worst[1]})"
                              + (f"; over: {', '.join(missed)}" if missed else ""))])


if __name__ == "__main__":
    main()
