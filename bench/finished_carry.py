"""What carrying a long retention costs: the prune of a slot of awa.finished
that holds an hour of a busy queue's completed jobs kept for two days.

The ring's next slot is filled with `--rows` completed jobs (default
3,600,000: an hour at 1,000 jobs/s) of a queue that keeps them 48 hours,
`--retained` of them (default all); the rest belong to a queue that keeps
them an hour. Then, each call in its own transaction with awa maintain's
statement timeout (10 s), as awa maintain makes them:

  one statement  the carry as it was before ADR 040: awa._prune_slot of
                 `--before` (default 304808a), one INSERT ... SELECT of every
                 retained row under the slot's lock, then TRUNCATE
  batches        awa.carry_finished() again while it moves rows, then
                 awa.prune_finished()

and prints, per cell, whether the slot was emptied, the calls, the longest
call, the whole time and the rows carried per second; medians of `--runs`.
Target: every call within the statement timeout, the slot emptied, no row
lost.

    python bench/finished_carry.py [--rows 3600000] [--retained 1.0] [--runs 3] [--write-docs]
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
from bench._server import bench_server, install_before, machine

TIMEOUT = "10s"  # awa maintain's statement timeout


def fill(conn: psycopg.Connection, rows: int, retained: float) -> int:
    """The ring's next slot, as an hour that ended 30 hours ago left it; its number."""
    conn.execute("truncate awa.finished")
    conn.execute("delete from awa.finished_carry")
    kept = round(rows * retained)
    conn.execute("""
        insert into awa.finished (job_id, slot, queue_id, priority, kind, state, attempt,
                                  max_attempts, enqueued_at, finished_at)
        select nextval('awa.job_id_seq'), awa._finished_slot('completed', x.t), m.queue_id, 2,
               'bench.job', 'completed', 1, 25, x.t, x.t
          from generate_series(1, %(rows)s) as i
         cross join lateral (select now() - interval '31 hours'
                                    + (i %% 3600) * interval '1 second' / 4 as t) as x
          join awa.queue_meta as m on m.queue = case when i <= %(kept)s then 'long' else 'short' end
    """, {"rows": rows, "kept": kept})
    conn.execute("vacuum analyze awa.finished")
    return conn.execute("select awa._finished_slot('completed', now() - interval '31 hours')"
                        ).fetchone()[0]


def timed_call(conn: psycopg.Connection, statement: str, params=()) -> tuple[float, int | None]:
    """Seconds and result of one call in its own transaction; None on a timeout."""
    started = time.perf_counter()
    try:
        with conn.transaction():
            conn.execute("select set_config('statement_timeout', %s, true)", [TIMEOUT])
            result = conn.execute(statement, params).fetchone()[0]
    except psycopg.errors.QueryCanceled:
        result = None
    return time.perf_counter() - started, result


def one_statement(conn: psycopg.Connection, slot: int) -> list[float]:
    """The old carry, retried as awa maintain would retry its prune (three times)."""
    calls = []
    for _ in range(3):
        seconds, result = timed_call(conn, "select public._prune_slot_before(%s)", [slot])
        calls.append(seconds)
        if result is not None:
            break
    return calls


def batches(conn: psycopg.Connection) -> list[float]:
    calls = []
    while True:
        seconds, carried = timed_call(conn, "select awa.carry_finished()")
        calls.append(seconds)
        if not carried:
            break
    seconds, _ = timed_call(conn, "select awa.prune_finished()")
    return [*calls, seconds]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=3_600_000)
    ap.add_argument("--retained", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", default="304808a")
    _docs.add_argument(ap)
    args = ap.parse_args()
    block = _docs.Block(__file__, "Carrying a long retention", args.write_docs)
    results: dict[str, list[dict]] = {"one statement": [], "batches": []}
    with bench_server() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        install_before(conn, args.before, "retention.sql", "_prune_slot")
        for q, keep in (("long", "48 hours"), ("short", "1 hour")):
            conn.execute("select awa.set_enqueue_shards(%s, 1)", [q])
            conn.execute("select awa.set_retention(%s, %s, null)", [q, keep])
        kept = round(args.rows * args.retained)
        for run in range(args.runs):
            for cell, carry in (("one statement", one_statement), ("batches", batches)):
                print(f"run {run + 1}, {cell}: filling ...", file=sys.stderr, flush=True)
                slot = fill(conn, args.rows, args.retained)
                started = time.perf_counter()
                calls = carry(conn, slot) if cell == "one statement" else carry(conn)
                total = time.perf_counter() - started
                left = conn.execute("select count(*) from awa.finished where slot = %s",
                                    [slot]).fetchone()[0]
                moved = conn.execute("select count(*) from awa.finished where slot <> %s",
                                     [slot]).fetchone()[0]
                results[cell].append({"emptied": left == 0 and moved == kept,
                                      "calls": len(calls), "longest": max(calls),
                                      "total": total, "rate": moved / total if left == 0 else 0})
                print(f"  {cell}: emptied {left == 0}, moved {moved:,}, {len(calls)} calls,"
                      f" longest {max(calls):.2f} s, {total:.1f} s", file=sys.stderr, flush=True)
    print(f"# finished_carry: {machine()}; PostgreSQL 18; the next completed slot holds"
          f" {args.rows:,} rows, {kept:,} of them retained; each call with a {TIMEOUT}"
          f" statement timeout; medians of {args.runs}")
    print("| cell | slot emptied | calls | longest call, s | whole, s | rows carried/s |")
    print("|---|---|---:|---:|---:|---:|")
    for cell, runs in results.items():
        emptied = sum(r["emptied"] for r in runs)
        med = {k: statistics.median(r[k] for r in runs) for k in ("calls", "longest", "total",
                                                                 "rate")}
        print(f"| {cell} | {emptied} of {len(runs)} | {med['calls']:.0f} |"
              f" {med['longest']:.2f} | {med['total']:.1f} | {med['rate']:,.0f} |")
    ok = all(r["emptied"] and r["longest"] < 10 for r in results["batches"])
    print(f"\ntarget (every call within {TIMEOUT}, the slot emptied, no row lost):"
          f" {'met' if ok else 'missed'}")
    longest = statistics.median(r["longest"] for r in results["batches"])
    block.write([_docs.Target("batches: every call within the statement timeout, the slot"
                              " emptied, no row lost", ok, f"longest call {longest:.2f} s")])


if __name__ == "__main__":
    main()
