"""Enqueue throughput measured with a C client (pgbench), against its ceilings
and against procrastinate, side by side in one run.

Cells, each at 1 and 16 clients, synchronous commit on, fsync on:
  ceiling        a plain INSERT of one job-shaped row into a table like awa.ready
  floor          the same INSERT inside a SECURITY DEFINER PL/pgSQL function
                 with a pinned search_path: the best any function contract can do
  lane floor S=N the floor holding one of N advisory locks through its commit
                 (its own first, any free one next, else it waits for its own):
                 the best any design can do that keeps lane order = commit
                 order with N lanes (--only lane)
  enqueue S=N    awa.enqueue, unkeyed, into a queue at S = 1, 8, 16
  keyed S=N      awa.enqueue with an ordering key drawn from 100,000
  batch INSERT   one INSERT of 100 rows into the ceiling table
  batch S=N      awa.enqueue_batch of 100 unkeyed rows at S = 8, 16
  procrastinate  procrastinate_defer_jobs_v1 with 1 and with 100 jobs

Prints, per client count, the median of the runs (jobs/s), the spread, each
single-row cell as a fraction of the floor and each batch cell as a fraction
of the batched INSERT (of the medians, and "per run": the median of each
run's fraction, steadier when the machine's speed drifts), and every awa
cell against procrastinate's.

    python bench/enqueue_pgbench.py [--seconds 10] [--runs 3] [--clients 1,16]
                                    [--only enqueue,keyed,...] [--before REF]
                                    [--write-docs]

--before REF adds "before S=N" cells: awa.enqueue as it was at git revision
REF, installed beside the current one as public.enqueue_before, so a change's
before and after run side by side on one server.

Targets (the enqueue-core issue; ADR 022 judges the 16-client ones against
the lane floor): with 16 clients awa.enqueue at S = 16 at least 85% of the
floor and at S = 8 70%; with 1 client 85%; 100-row batches at S = 16 at
least 75% of the batched INSERT.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql.roles import Roles
from bench import _docs
from bench._pgbench import Cell, Grid, install_procrastinate, pgbench_version, table
from bench._server import bench_server, install_enqueue_before, machine

BATCH = 100
SHARDS = (1, 8, 16)
BATCH_SHARDS = (8, 16)

ROW = ("(lane_id, lane_seq, job_id, queue_id, priority, kind, args, attempt, max_attempts,"
       " enqueued_at, ready_at)")
VALUES = ("nextval('public.bench_seq'), currval('public.bench_seq'), 1, 2, 'bench.job', '{}',"
          " 0, 25, now(), clock_timestamp()")
# The lane floor's advisory lock class: not awa's (1635213644 and nearby).
LANE_FLOOR_LOCKS = 4242
PROCRASTINATE_JOB = ("row('default', 'bench.job', 0, null, null, '{}'::jsonb, null)"
                     "::procrastinate_job_to_defer_v1")


def setup(conn: psycopg.Connection) -> str:
    conn.execute("create table bench_ceiling (like awa.ready including all)")
    conn.execute("create sequence bench_seq")
    conn.execute(
        "create function bench_floor(client integer) returns bigint"
        " language plpgsql security definer set search_path = pg_catalog, pg_temp as $$"
        f" begin insert into public.bench_ceiling {ROW} values (client, {VALUES});"
        " return currval('public.bench_seq'); end $$")
    conn.execute(
        "create function bench_lane_floor(client integer, lanes integer) returns bigint"
        " language plpgsql security definer set search_path = pg_catalog, pg_temp as $$"
        " declare own integer := client % lanes; got boolean := false; begin"
        " for i in 0 .. lanes - 1 loop"
        f"   got := pg_try_advisory_xact_lock({LANE_FLOOR_LOCKS}, (own + i) % lanes);"
        "   exit when got;"
        " end loop;"
        f" if not got then perform pg_advisory_xact_lock({LANE_FLOOR_LOCKS}, own); end if;"
        f" insert into public.bench_ceiling {ROW} values (client, {VALUES});"
        " return currval('public.bench_seq'); end $$")
    # Owned like awa's functions: a superuser's definer skips the EXECUTE
    # check of every function it sets up, which would flatter the floors.
    owner = Roles().owner
    conn.execute(f"grant insert on public.bench_ceiling to {owner}")
    conn.execute(f"grant usage on sequence public.bench_seq to {owner}")
    conn.execute(f"alter function public.bench_floor(integer) owner to {owner}")
    conn.execute(f"alter function public.bench_lane_floor(integer, integer) owner to {owner}")
    for s in sorted({*SHARDS, *BATCH_SHARDS}):
        conn.execute("select awa.set_enqueue_shards(%s, %s)", [f"bench_s{s}", s])
    return install_procrastinate(conn)


def reset(conn: psycopg.Connection) -> None:
    conn.execute("truncate awa.ready, public.bench_ceiling")
    conn.execute("truncate procrastinate_jobs cascade")


def cells(before: bool = False) -> list[Cell]:
    out = [
        Cell("ceiling", f"insert into bench_ceiling {ROW} values (:client_id, {VALUES});"),
        Cell("floor", "select bench_floor(:client_id);"),
    ]
    out += [Cell(f"lane floor S={s}", f"select bench_lane_floor(:client_id, {s});")
            for s in SHARDS]
    out += [Cell(f"enqueue S={s}", f"select awa.enqueue('bench_s{s}', 'bench.job');")
            for s in SHARDS]
    if before:
        out += [Cell(f"before S={s}", f"select enqueue_before('bench_s{s}', 'bench.job');")
                for s in SHARDS]
    out += [Cell(f"keyed S={s}",
                 "\\set k random(1, 100000)\n"
                 f"select awa.enqueue('bench_s{s}', 'bench.job',"
                 " ordering_key => convert_to(cast(:k as text), 'UTF8'));")
            for s in SHARDS]
    out.append(Cell("procrastinate",
                    f"select procrastinate_defer_jobs_v1(array[{PROCRASTINATE_JOB}]);"))
    out.append(Cell("batch INSERT",
                    f"insert into bench_ceiling {ROW} select :client_id, {VALUES}"
                    f" from generate_series(1, {BATCH});", BATCH))
    out += [Cell(f"batch S={s}",
                 "select count(*) from awa.enqueue_batch("
                 f"array_fill('bench_s{s}'::text, array[{BATCH}]),"
                 f" array_fill('bench.job'::text, array[{BATCH}]));", BATCH)
            for s in BATCH_SHARDS]
    out.append(Cell("procrastinate batch",
                    "select procrastinate_defer_jobs_v1(array("
                    f"select {PROCRASTINATE_JOB} from generate_series(1, {BATCH})));", BATCH))
    for c in out:
        c.reset = reset
    return out


def report(grid: Grid, clients: int) -> str:
    rows = []
    for cell in grid.cells:
        name = cell.name
        rate = grid.median(name, clients)
        batched = cell.rows_per_tx > 1
        peer = grid.median("procrastinate batch" if batched else "procrastinate", clients)
        base_name = "batch INSERT" if batched else "floor"
        rows.append([name, f"{rate:,.0f}", grid.spread(name, clients),
                     f"{rate / grid.median(base_name, clients):.0%} of {base_name}",
                     f"{grid.paired(name, base_name, clients):.0%}",
                     f"{rate / peer:.2f}x"])
    return table(["cell", "jobs/s (median)", "runs", "fraction", "per run", "vs procrastinate"],
                 rows)


def targets(grid: Grid) -> list[_docs.Target]:
    """The targets whose cells ran, each with the lane floor that bounds it."""
    def ran(name: str, clients: int) -> bool:
        return (name, clients) in grid.results

    def share(name: str, base: str, clients: int) -> float:
        return grid.median(name, clients) / grid.median(base, clients)

    out = []
    for s, goal in ((16, 0.85), (8, 0.70)):
        if ran(f"enqueue S={s}", 16):
            got = share(f"enqueue S={s}", "floor", 16)
            bound = (f"; lane floor S = {s}: {share(f'lane floor S={s}', 'floor', 16):.0%}"
                     if ran(f"lane floor S={s}", 16) else "")
            out.append(_docs.Target(f"16 clients: awa.enqueue S = {s} at least {goal:.0%} of the"
                                    " floor", got >= goal, f"{got:.0%}{bound}"))
    single = [share(f"enqueue S={s}", "floor", 1) for s in SHARDS if ran(f"enqueue S={s}", 1)]
    if single:
        out.append(_docs.Target("1 client: awa.enqueue at least 85% of the floor at every S",
                                min(single) >= 0.85, f"{min(single):.0%}-{max(single):.0%}"))
    for c in grid.clients:
        if ran("batch S=16", c):
            got = share("batch S=16", "batch INSERT", c)
            out.append(_docs.Target(f"{c} client{'s' if c > 1 else ''}: awa.enqueue_batch S = 16"
                                    " at least 75% of the batched INSERT", got >= 0.75,
                                    f"{got:.0%}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--before", metavar="REF", help="also measure awa.enqueue as of git REF")
    ap.add_argument("--only", default="",
                    help="comma-separated name prefixes; floor, batch INSERT and the"
                         " procrastinate cells always run")
    _docs.add_argument(ap)
    args = ap.parse_args()
    block = _docs.Block(__file__, "Enqueue with a C client", args.write_docs)
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    always = {"floor", "batch INSERT", "procrastinate", "procrastinate batch"}
    chosen = [c for c in cells(before=bool(args.before))
              if not wanted or c.name in always or any(c.name.startswith(w) for w in wanted)]
    clients = [int(c) for c in args.clients.split(",")]
    with bench_server() as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            peer_version = setup(conn)
            if args.before:
                install_enqueue_before(conn, args.before)
            version = conn.execute("show server_version").fetchone()[0]
        grid = Grid(dsn, chosen, clients, args.seconds, args.runs)
        grid.measure(lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    print(f"# enqueue_pgbench: {machine()}; PostgreSQL {version}; {pgbench_version()};"
          f" procrastinate {peer_version}; -M prepared, synchronous_commit=on, fsync on;"
          f" {args.seconds:g} s per cell, median of {args.runs}")
    for c in clients:
        print(f"\n## {c} client{'s' if c > 1 else ''}\n")
        print(report(grid, c))
    block.write(targets(grid))


if __name__ == "__main__":
    main()
