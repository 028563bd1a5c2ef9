"""Worker throughput measured with a C client (pgbench), against procrastinate,
side by side in one run, on a preloaded queue.

Cells, each at 1, 4 and 16 clients, synchronous commit on, fsync on; every
claim and every complete is its own transaction, as a worker does them:
  claim 1        awa.claim of 1 job, then awa.complete
  claim 10       awa.claim of 10 jobs, then awa.complete of each
  procrastinate  procrastinate_fetch_job_v2, then procrastinate_finish_job_v1
  enqueue        awa.enqueue of one job (for the claim/enqueue ratio at 4)
A claim that comes back short fails the run (claim 1 by \\gset, claim 10 by a
division by zero), so an empty claim cannot pass for a slow one. The queue
(S = --shards) and procrastinate's table hold --preload jobs at the start of
every run.

Then the Python Worker (installer/awa_sql/worker.py) with 1, 4 and 16 slots
and a handler that does nothing drains the same preloaded queue: jobs/s.

Prints jobs/s (median of the runs, and the spread), awa against
procrastinate, and claim 1 at 4 clients against enqueue at 4 clients.

    python bench/claim_pgbench.py [--seconds 10] [--runs 3] [--clients 1,4,16]
                                  [--shards 1] [--preload 100000] [--no-worker]
                                  [--before REF] [--write-docs]

--before REF adds "before 1" and "before 10" cells: awa.claim as it was at git
revision REF, installed beside the current one as public.claim_before, so a
change's before and after run side by side on one server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql.worker import Worker
from bench import _docs
from bench._pgbench import Cell, Grid, install_procrastinate, pgbench_version, table
from bench._server import bench_server, install_before, machine

QUEUE = "bench"


def preload_awa(conn: psycopg.Connection, jobs: int) -> None:
    conn.execute("truncate awa.ready, awa.running, awa.finished, awa.lane_hints")
    for start in range(0, jobs, 50_000):
        n = min(50_000, jobs - start)
        conn.execute("select count(*) from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                     " array_fill('bench.job'::text, array[%s]))", [QUEUE, n, n])
    conn.execute("vacuum analyze awa.ready, awa.running, awa.finished")


def preload_procrastinate(conn: psycopg.Connection, jobs: int) -> None:
    conn.execute("truncate procrastinate_jobs cascade")
    conn.execute("insert into procrastinate_jobs (queue_name, task_name, args)"
                 " select 'default', 'bench.job', '{}' from generate_series(1, %s)", [jobs])
    conn.execute("vacuum analyze procrastinate_jobs")


def claim_cells(function: str, label: str, preload: int) -> list[Cell]:
    """Claim 1 + complete and claim 10 + complete each, with `function`."""
    complete_each = "".join(
        f"select awa.complete((:ids::bigint[])[{i}], (:leases::bigint[])[{i}]);\n"
        for i in range(1, 11))
    return [
        Cell(f"{label} 1",
             f"select job_id, run_lease from {function}('{{{QUEUE}}}', 1, 'bench') \\gset\n"
             "select awa.complete(:job_id, :run_lease);\n",
             reset=lambda conn: preload_awa(conn, preload)),
        Cell(f"{label} 10",
             "select array_agg(job_id) as ids, array_agg(run_lease) as leases,"
             f" 1 / (count(*) / 10) as full from {function}('{{{QUEUE}}}', 10, 'bench') \\gset\n"
             + complete_each, rows_per_tx=10,
             reset=lambda conn: preload_awa(conn, preload)),
    ]


def cells(preload: int, worker_id: int, before: bool) -> list[Cell]:
    return [
        *claim_cells("awa.claim", "claim", preload),
        *(claim_cells("claim_before", "before", preload) if before else []),
        Cell("procrastinate",
             "select id, 1 / (id is not null)::int as found"
             f" from procrastinate_fetch_job_v2('{{default}}', {worker_id}) \\gset\n"
             "select procrastinate_finish_job_v1(:id, 'succeeded', false);\n",
             reset=lambda conn: preload_procrastinate(conn, preload)),
        Cell("enqueue", "select awa.enqueue('bench_enqueue', 'bench.job');\n",
             reset=lambda conn: conn.execute("truncate awa.ready")),
    ]


def worker_rate(dsn: str, slots: int, seconds: float, preload: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        preload_awa(conn, preload)
        conn.execute("checkpoint")
    worker = Worker(dsn, queues=[{"queue": QUEUE, "max_workers": slots}],
                    handlers={"bench.job": lambda _job: None}, snapshot_every=None)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        time.sleep(1)  # connections up, first claims done
        first, t0 = worker.completed, time.monotonic()
        time.sleep(seconds)
        done, elapsed = worker.completed - first, time.monotonic() - t0
    finally:
        worker.stop()
        runner.join()
    if worker.completed >= preload:
        raise RuntimeError(f"the queue ran dry: raise --preload above {preload}")
    return done / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--preload", type=int, default=100_000)
    ap.add_argument("--no-worker", action="store_true")
    ap.add_argument("--before", metavar="REF", help="also measure awa.claim as of git REF")
    _docs.add_argument(ap)
    args = ap.parse_args()
    block = _docs.Block(__file__, "Claim throughput", args.write_docs)
    clients = [int(c) for c in args.clients.split(",")]

    with bench_server() as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("select awa.set_enqueue_shards(%s, %s)", [QUEUE, args.shards])
            version = install_procrastinate(conn)
            worker_id = conn.execute(
                "select worker_id from procrastinate_register_worker_v1()").fetchone()[0]
            server = conn.execute("show server_version").fetchone()[0]
            if args.before:
                install_before(conn, args.before, "claim.sql", "claim")
        grid = Grid(dsn, cells(args.preload, worker_id, bool(args.before)), clients,
                    args.seconds, args.runs)
        grid.measure(lambda line: print(line, file=sys.stderr, flush=True))
        workers: dict[int, list[float]] = {}
        if not args.no_worker:
            for run_no in range(args.runs):
                for slots in clients:
                    rate = worker_rate(dsn, slots, args.seconds, args.preload)
                    workers.setdefault(slots, []).append(rate)
                    print(f"run {run_no + 1} worker slots={slots}: {rate:,.0f}/s",
                          file=sys.stderr, flush=True)

    print(f"machine: {machine()}")
    print(f"PostgreSQL {server}, {pgbench_version()}, procrastinate {version}, "
          f"S = {args.shards}, {args.seconds:g} s per cell, median of {args.runs}, "
          f"{args.preload:,} jobs preloaded")
    names = ["claim 1", "claim 10", *(["before 1", "before 10"] if args.before else []),
             "procrastinate", "enqueue"]
    rows = []
    for c in clients:
        peer = grid.median("procrastinate", c)
        row = [str(c)]
        for name in names:
            row.append(f"{grid.median(name, c):,.0f} ({grid.spread(name, c)})")
        row += [f"{grid.median('claim 1', c) / peer:.2f}x",
                f"{grid.median('claim 10', c) / peer:.2f}x"]
        if args.before:
            row.append(f"{grid.median('claim 1', c) / grid.median('before 1', c):.2f}x")
        if workers:
            row.append(f"{statistics.median(workers[c]):,.0f}")
        rows.append(row)
    header = ["clients", *names, "claim 1 / procr.", "claim 10 / procr.",
              *(["claim 1 / before 1"] if args.before else [])]
    if workers:
        header.append("Worker (slots = clients)")
    print("jobs/s (spread)")
    print(table(header, rows))
    targets = []
    for c in clients:
        ahead = grid.median("claim 1", c) / grid.median("procrastinate", c)
        targets.append(_docs.Target(f"claim 1 + complete ahead of procrastinate at {c} client"
                                    + ("s" if c > 1 else ""), ahead > 1, f"{ahead:.2f}x"))
    if 4 in clients:
        ratio = grid.median("claim 1", 4) / grid.median("enqueue", 4)
        print(f"claim 1 + complete at 4 clients / enqueue at 4 clients: {ratio:.0%}")
        targets.append(_docs.Target("claim 1 + complete at 4 clients at least 60% of awa.enqueue"
                                    " at 4", ratio >= 0.6, f"{ratio:.0%}"))
    block.write(targets)


if __name__ == "__main__":
    main()
