"""Enqueue throughput under contention, against a no-lane ceiling.

P producer processes (1, 4, 16) run single-row awa.enqueue transactions into
one queue for a fixed time at S = 1, 2, 4, 8, 16, then the same with 100-row
awa.enqueue_batch calls. The ceiling is measured in the same run: the same
rows inserted by the same connections into a table shaped like awa.ready,
with no lane lock and no sequence. Prints jobs/s per cell and each cell as a
fraction of its ceiling. Single-row runs also show the "definer floor": the
same INSERT inside a SECURITY DEFINER PL/pgSQL function with a pinned
search_path, the best any function-based contract can do. With --keyed, a
third table: single-row transactions each with an ordering key drawn from
100,000 (keyed jobs wait for their key's lane; unkeyed ones move to a free
one). Synchronous commit stays on.

    python bench/enqueue_contention.py [--seconds 5] [--producers 1,4,16] [--shards 1,2,4,8,16]
                                       [--keyed] [--before REF] [--write-docs]

--before REF adds a table for single-row transactions through awa.enqueue as
of git revision REF (installed beside today's as public.enqueue_before), so
a change's before and after run side by side.

Targets (the storage-core issue), as fractions of the ceiling: 1 producer,
single rows, 85% at every S; 16 producers, single rows, 90% at S = 16 and
75% at S = 8; 16 producers, 100-row batches, 80% at S = 8.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _docs
from bench._server import bench_server, install_enqueue_before, machine

BATCH = 100
QUEUE = "bench"


def _worker(dsn, mode, deadline_at, start, results, index):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("set synchronous_commit = on")
        kinds = ["bench.job"] * BATCH
        queues = [QUEUE] * BATCH
        seq = 0
        start.wait()
        done = 0
        if mode == "ceiling-single":
            while time.monotonic() < deadline_at.value:
                seq += 1
                conn.execute(
                    "insert into bench_ceiling (lane_id, lane_seq, job_id, queue_id, priority,"
                    " kind, args, attempt, max_attempts, enqueued_at)"
                    " values (%s, %s, %s, 1, 2, 'bench.job', '{}', 0, 25, now())",
                    [index, seq, index * 10**9 + seq], prepare=True)
                done += 1
        elif mode == "ceiling-batch":
            while time.monotonic() < deadline_at.value:
                seqs = list(range(seq + 1, seq + BATCH + 1))
                seq += BATCH
                conn.execute(
                    "insert into bench_ceiling (lane_id, lane_seq, job_id, queue_id, priority,"
                    " kind, args, attempt, max_attempts, enqueued_at)"
                    " select %s, s, %s::bigint * 1000000000 + s, 1, 2, k, '{}', 0, 25, now()"
                    " from unnest(%s::bigint[], %s::text[]) as u (s, k)",
                    [index, index, seqs, kinds], prepare=True)
                done += BATCH
        elif mode == "floor-single":
            while time.monotonic() < deadline_at.value:
                seq += 1
                conn.execute("select bench_floor(%s, %s)", [index, seq], prepare=True)
                done += 1
        elif mode == "single":
            while time.monotonic() < deadline_at.value:
                conn.execute("select awa.enqueue(%s, 'bench.job')", [QUEUE], prepare=True)
                done += 1
        elif mode == "before":
            while time.monotonic() < deadline_at.value:
                conn.execute("select enqueue_before(%s, 'bench.job')", [QUEUE], prepare=True)
                done += 1
        elif mode == "keyed":
            rng = random.Random(index)
            while time.monotonic() < deadline_at.value:
                key = b"key-%d" % rng.randrange(100_000)
                conn.execute("select awa.enqueue(%s, 'bench.job', ordering_key => %s)",
                             [QUEUE, key], prepare=True)
                done += 1
        elif mode == "batch":
            while time.monotonic() < deadline_at.value:
                conn.execute("select awa.enqueue_batch(%s::text[], %s::text[])",
                             [queues, kinds], prepare=True)
                done += BATCH
        results[index] = done


def run_cell(dsn, mode, producers, seconds):
    ctx = mp.get_context("fork")
    start = ctx.Barrier(producers + 1)
    deadline_at = ctx.Value("d", 0.0)
    results = ctx.Array("q", producers)
    procs = [ctx.Process(target=_worker, args=(dsn, mode, deadline_at, start, results, i))
             for i in range(producers)]
    for p in procs:
        p.start()
    deadline_at.value = time.monotonic() + seconds + 0.2
    start.wait()
    began = time.monotonic()
    for p in procs:
        p.join()
    elapsed = time.monotonic() - began
    return sum(results) / elapsed


def reset(dsn, shards=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("truncate awa.ready, bench_ceiling")
        if shards is not None:
            conn.execute("select awa.set_enqueue_shards(%s, %s)", [QUEUE, shards])
        conn.execute("checkpoint")


def hashing_cost(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        out = {}
        for label, expr, n in [
            ("16-byte key", "convert_to(lpad(g::text, 16, 'k'), 'UTF8')", 200_000),
            ("1 KiB key", "convert_to(repeat('k', 1020) || lpad(g::text, 4, '0'), 'UTF8')", 2_000),
        ]:
            t0 = time.perf_counter()
            conn.execute(f"select count(awa.shard_for_ordering_key({expr}, 8))"
                         f" from generate_series(1, {n}) as g")
            t1 = time.perf_counter()
            conn.execute(f"select count({expr}) from generate_series(1, {n}) as g")
            t2 = time.perf_counter()
            out[label] = ((t1 - t0) - (t2 - t1)) / n * 1e6
        return out


# (kind, producers, S or None for every S, fraction of the ceiling)
TARGETS = (("single", 1, None, 0.85), ("single", 16, 16, 0.90), ("single", 16, 8, 0.75),
           ("batch", 16, 8, 0.80))


def targets(shares: dict[tuple[str, int, int], float]) -> list[_docs.Target]:
    out = []
    for kind, producers, shards, goal in TARGETS:
        got = [v for (k, p, s), v in shares.items()
               if (k, p) == (kind, producers) and shards in (None, s)]
        if not got:
            continue
        rows = "single rows" if kind == "single" else f"{BATCH}-row batches"
        where = "every S" if shards is None else f"S = {shards}"
        measured = f"{min(got):.0%}" + (f"-{max(got):.0%}" if len(got) > 1 else "")
        out.append(_docs.Target(f"{producers} producer{'s' if producers > 1 else ''}, {rows}:"
                                f" at least {goal:.0%} of the ceiling at {where}",
                                min(got) >= goal, measured))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--producers", default="1,4,16")
    parser.add_argument("--shards", default="1,2,4,8,16")
    parser.add_argument("--keyed", action="store_true",
                        help="also run single-row transactions with ordering keys")
    parser.add_argument("--before", metavar="REF",
                        help="also run single-row transactions through awa.enqueue as of git REF")
    _docs.add_argument(parser)
    args = parser.parse_args()
    block = _docs.Block(__file__, "Enqueue under contention", args.write_docs)
    shares = {}
    producer_counts = [int(x) for x in args.producers.split(",")]
    shard_counts = [int(x) for x in args.shards.split(",")]

    with bench_server() as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("create table bench_ceiling (like awa.ready including all)")
            # The floor of any function-based contract: a SECURITY DEFINER
            # PL/pgSQL function with a pinned search_path that only inserts.
            conn.execute(
                "create function bench_floor(p integer, s bigint) returns bigint"
                " language plpgsql security definer set search_path = pg_catalog, pg_temp as $$"
                " begin insert into public.bench_ceiling (lane_id, lane_seq, job_id, queue_id,"
                " priority, kind, args, attempt, max_attempts, enqueued_at) values (p, s,"
                " p::bigint * 1000000000 + s, 1, 2, 'bench.job', '{}', 0, 25, now());"
                " return s; end $$")
            conn.execute("select awa.enqueue(%s, 'warmup')", [QUEUE])
            if args.before:
                install_enqueue_before(conn, args.before)
            version = conn.execute("show server_version").fetchone()[0]
        print(f"# enqueue_contention: {machine()}; PostgreSQL {version}; "
              f"synchronous_commit=on; {args.seconds:g} s per cell")
        kinds = ("single", *(("before",) if args.before else ()), "batch",
                 *(("keyed",) if args.keyed else ()))
        for kind in kinds:
            unit = {"single": "1-row transactions", "batch": f"{BATCH}-row batch calls",
                    "before": f"1-row transactions, awa.enqueue as of {args.before}",
                    "keyed": "keyed 1-row transactions"}[kind]
            print(f"\n## {unit}: jobs/s (fraction of the no-lane ceiling)")
            floor_col = ["definer floor"] if kind == "single" else []
            header = ["P", "ceiling", *floor_col] + [f"S={s}" for s in shard_counts]
            print(" | ".join(f"{h:>16}" for h in header))
            for producers in producer_counts:
                reset(dsn)
                ceiling_mode = "ceiling-batch" if kind == "batch" else "ceiling-single"
                ceiling = run_cell(dsn, ceiling_mode, producers, args.seconds)
                cells = []
                if kind == "single":
                    reset(dsn)
                    rate = run_cell(dsn, "floor-single", producers, args.seconds)
                    cells.append(f"{rate:,.0f} ({rate / ceiling:.0%})")
                for shards in shard_counts:
                    reset(dsn, shards)
                    rate = run_cell(dsn, kind, producers, args.seconds)
                    cells.append(f"{rate:,.0f} ({rate / ceiling:.0%})")
                    shares[(kind, producers, shards)] = rate / ceiling
                row = [str(producers), f"{ceiling:,.0f}", *cells]
                print(" | ".join(f"{c:>16}" for c in row), flush=True)
        print("\n## routing hash cost (µs per key, awa.shard_for_ordering_key)")
        for label, micros in hashing_cost(dsn).items():
            print(f"{label:>16}: {micros:.2f} µs")
    block.write(targets(shares))


if __name__ == "__main__":
    main()
