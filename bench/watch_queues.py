"""What watching many queues costs: awa.queue_overview, awa.lane_overview and
the metrics exporter over 1, 1,000 and 10,000 physical queues, each at S = 1
(four lanes) and empty, so that what is measured is the queues' shape and
nothing else (bench/watch_cost.py holds the queues and grows the jobs).

For each count, on one connection of a reader login kept from read to read
(as the exporter keeps its own), the median of 3 timings, after one that
warms the session's caches, of:

  queue_overview   select * from awa.queue_overview (every queue)
  lane_overview    select * from awa.lane_overview (every lane)
  scrape SQL       the exporter's one statement (SCRAPE_SQL), rows fetched;
                   the CPU its backend used (/proc/<pid>/stat, 10 ms
                   ticks), steadier than the clock on a busy machine; and
                   its first run in a new session (3 sessions), whose
                   caches start cold: what `awa storage show` pays
  /metrics         a whole render (awa_sql.metrics.database.render): that
                   statement under its 10 s timeout, then prometheus_client's
                   text of every series

and the locks on sequences the scrape statement's transaction holds at its
end (one slot of the shared lock table each), and the series it exports.

--before reads the views as they were before they read the lanes and the
counters in place (tests/support/views_before.sql, as of 9df3c08) on the
same queues, with the scrape statement of then. Those keep a lock per
sequence read to the end of the statement, 8 a queue: at 10,000 queues past
the lock table PostgreSQL's default max_locks_per_transaction (64) gives this
server (300 connections), so they fail with 53200; run them with
--max-locks-per-transaction 512 for their times.

Target: the scrape statement at 10,000 queues under 2 s. The exporter gives
it 10 s; past that awa_up is 0 and every other series is gone.

    python bench/watch_queues.py [--queues 1,1000,10000] [--before]
        [--max-locks-per-transaction N] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from prometheus_client import CollectorRegistry, generate_latest
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql.metrics import database
from awa_sql.roles import Roles
from bench import _docs
from bench._server import bench_server, machine

RUNS = 3
ROOT = Path(__file__).resolve().parent.parent
BEFORE_VIEWS = ROOT / "tests" / "support" / "views_before.sql"
READER = "watch_reader"
SEQUENCE_LOCKS = """
    select count(*) from pg_catalog.pg_locks as l
      join pg_catalog.pg_class as c on c.oid = l.relation
     where l.pid = pg_catalog.pg_backend_pid() and c.relkind = 'S'
"""


def before_scrape_sql() -> str:
    """The scrape statement of 9df3c08 over the views of then: the queue rows
    carried their own ready and lag, every row was jsonb."""
    sql = database.SCRAPE_SQL.replace("pg_catalog.json_build_object(",
                                      "pg_catalog.jsonb_build_object(")
    for old, new in (
        ("awa.queue_overview", "before.queue_overview"),
        ("awa.lane_overview", "before.lane_overview"),
        ("'running', q.running,", "'ready', q.ready, 'running', q.running,"),
        ("'retried', q.retried) as row",
         "'retried', q.retried,\n    'lag', coalesce(extract(epoch from q.oldest_ready_age), 0))"
         " as row"),
    ):
        if old not in sql:
            raise SystemExit(f"SCRAPE_SQL has no {old!r}: bench/watch_queues.py needs an update")
        sql = sql.replace(old, new)
    return sql


def install_before(conn: psycopg.Connection) -> None:
    """The old views and functions in schema `before`, owned and granted as
    awa's were (their definers run as the owner, a reader reads the views)."""
    roles = Roles()
    conn.execute(BEFORE_VIEWS.read_text())
    conn.execute(f"grant usage on schema before to {roles.reader}")
    for (name,) in conn.execute("select p.oid::regprocedure::text from pg_catalog.pg_proc p"
                                " where p.pronamespace = 'before'::regnamespace").fetchall():
        conn.execute(f"alter function {name} owner to {roles.owner}")
    for view in ("queue_overview", "lane_overview"):
        conn.execute(f"alter view before.{view} owner to {roles.owner}")
        conn.execute(f"grant select on before.{view} to {roles.reader}")


def grow(conn: psycopg.Connection, have: int, want: int) -> None:
    """Queues w000001 .. w<want>, at S = 1, beside the `have` made before."""
    for start in range(have + 1, want + 1, 250):
        end = min(start + 249, want)
        conn.execute("select count(*) from generate_series(%s::int, %s::int) as i,"
                     " lateral awa.set_enqueue_shards('w' || lpad(i::text, 6, '0'), 1)",
                     [start, end])
        print(f"  {end:,} queues", file=sys.stderr, flush=True)


def timed(conn: psycopg.Connection, call: Callable[[psycopg.Connection], object]) -> float | str:
    """The median of RUNS timings in ms, after one that warms the caches; or
    why the read failed."""
    samples = []
    for n in range(RUNS + 1):
        started = time.perf_counter()
        try:
            call(conn)
        except psycopg.Error as err:
            return f"fails ({err.sqlstate}: {str(err).strip().splitlines()[0]})"
        if n:
            samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def backend_seconds(pid: int) -> float:
    """CPU time the backend used so far (10 ms ticks): what a busy machine
    disturbs least, where wall-clock times of these reads swing by 2x."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ms(conn: psycopg.Connection, sql: str) -> float | str:
    """The median of RUNS, in ms, of the server CPU the statement took."""
    pid = conn.execute("select pg_catalog.pg_backend_pid()").fetchone()[0]
    samples = []
    for _ in range(RUNS):
        started = backend_seconds(pid)
        try:
            conn.execute(sql).fetchall()
        except psycopg.Error as err:
            return f"fails ({err.sqlstate})"
        samples.append((backend_seconds(pid) - started) * 1000)
    return statistics.median(samples)


def first_in_session(dsn: str, sql: str) -> float | str:
    """The median of RUNS, in ms, of the statement's first run in a new
    session: what `awa storage show` (a process of its own) and a new
    connection of the admin page's pool pay, the session's caches cold."""
    samples = []
    for _ in range(RUNS):
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = time.perf_counter()
            try:
                conn.execute(sql).fetchall()
            except psycopg.Error as err:
                return f"fails ({err.sqlstate})"
            samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def render_with(sql: str) -> Callable[[psycopg.Connection], bytes]:
    """database.render, with `sql` for the scrape statement."""
    def render(conn: psycopg.Connection) -> bytes:
        with conn.transaction():
            conn.execute("select pg_catalog.set_config('statement_timeout', %s, true)",
                         [f"{database.STATEMENT_TIMEOUT_MS}ms"])
            rows = conn.execute(sql).fetchall()
        families = database.metric_families(rows)

        class Families:
            def collect(self):
                return families

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Families())
        return generate_latest(registry)
    return render


def locks_and_series(conn: psycopg.Connection, sql: str) -> tuple[int | str, int | str]:
    try:
        with conn.transaction():
            rows = conn.execute(sql).fetchall()
            locks = conn.execute(SEQUENCE_LOCKS).fetchone()[0]
    except psycopg.Error as err:
        return f"fails ({err.sqlstate})", "-"
    return locks, sum(len(f.samples) for f in database.metric_families(rows))


def measure(conn: psycopg.Connection, dsn: str, side: str) -> dict[str, float | int | str]:
    views, sql = ("awa", database.SCRAPE_SQL) if side == "after" else ("before",
                                                                         before_scrape_sql())
    out: dict[str, float | int | str] = {
        "queue_overview": timed(conn, lambda c: c.execute(
            f"select * from {views}.queue_overview").fetchall()),
        "lane_overview": timed(conn, lambda c: c.execute(
            f"select * from {views}.lane_overview").fetchall()),
        "scrape SQL": timed(conn, lambda c: c.execute(sql).fetchall()),
        "scrape SQL, server CPU": cpu_ms(conn, sql),
        "scrape SQL, a new session's first": first_in_session(dsn, sql),
        "/metrics": timed(conn, (lambda c: database.render(c)) if side == "after"
                          else render_with(sql)),
    }
    out["sequence locks held"], out["series"] = locks_and_series(conn, sql)
    return out


def cell(value: float | int | str, name: str) -> str:
    if isinstance(value, str):
        return value
    return f"{value:,}" if name in ("sequence locks held", "series") else f"{value:,.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--queues", default="1,1000,10000",
                    help="queue counts, ascending (default 1,1000,10000)")
    ap.add_argument("--before", action="store_true",
                    help="also read the views and the scrape of 9df3c08 on the same queues")
    ap.add_argument("--max-locks-per-transaction", type=int, default=None,
                    help="the server's setting (default PostgreSQL's, 64)")
    _docs.add_argument(ap)
    args = ap.parse_args()
    counts = [int(n) for n in args.queues.split(",")]
    if counts != sorted(counts) or counts[0] < 1:
        raise SystemExit("--queues: counts of 1 or more, ascending")
    block = _docs.Block(__file__, "Watching many queues", args.write_docs)
    settings = ({"max_locks_per_transaction": str(args.max_locks_per_transaction)}
                if args.max_locks_per_transaction else None)
    sides = ["after", "before"] if args.before else ["after"]
    results: dict[str, dict[int, dict]] = {side: {} for side in sides}
    with bench_server(settings=settings) as dsn, \
            psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"create role {READER} login in role {Roles().reader}")
        admin.execute("select awa.set_max_queues(greatest(%s, 10000))", [counts[-1]])
        if args.before:
            install_before(admin)
        locks = admin.execute("show max_locks_per_transaction").fetchone()[0]
        have = 0
        for n in counts:
            print(f"making {n:,} queues ...", file=sys.stderr, flush=True)
            grow(admin, have, n)
            have = n
            admin.execute("vacuum analyze")
            # A new session per count, kept for its reads, as the exporter's.
            reader = make_conninfo(dsn, user=READER)
            with psycopg.connect(reader, autocommit=True) as conn:
                for side in sides:
                    print(f"reading {n:,} queues ({side}) ...", file=sys.stderr, flush=True)
                    results[side][n] = measure(conn, reader, side)
    print(f"# watch_queues: {machine()}; PostgreSQL 18, max_locks_per_transaction {locks},"
          f" shared_buffers 512MB; empty queues at S = 1 (4 lanes each), read by a"
          f" reader login; medians of {RUNS}, ms; per queue: the slope from the fewest"
          f" queues to the most, in µs (locks and series: a count)")
    heads = " | ".join(f"{n:,} {'queue' if n == 1 else 'queues'}" for n in counts)
    per_queue = len(counts) > 1
    print(f"| read | {heads} |" + (" per queue |" if per_queue else ""))
    print("|---|" + "---:|" * (len(counts) + per_queue))
    for side in sides:
        for name in results[side][counts[0]]:
            label = name if side == "after" else f"before: {name}"
            row = [results[side][n][name] for n in counts]
            cells = " | ".join(cell(v, name) for v in row)
            slope = ""
            if per_queue:
                first, last = row[0], row[-1]
                ok = all(isinstance(v, (int, float)) for v in (first, last))
                scale = 1 if name in ("sequence locks held", "series") else 1000
                slope = (f" {(last - first) * scale / (counts[-1] - counts[0]):,.1f} |"
                         if ok else " - |")
            print(f"| {label} | {cells} |{slope}")
    largest = results["after"][counts[-1]]["scrape SQL"]
    rendered = results["after"][counts[-1]]["/metrics"]
    met = isinstance(largest, float) and largest < 2000 if counts[-1] >= 10_000 else None
    shown = f"{largest:,.0f} ms" if isinstance(largest, float) else largest
    print(f"\ntarget (the scrape statement at 10,000 queues under 2 s):"
          f" {'not measured' if met is None else 'met' if met else 'missed'}, {shown}")
    block.write([
        _docs.Target("the scrape statement at 10,000 queues under 2 s", met,
                     f"{shown} at {counts[-1]:,} queues"),
        _docs.Target("a whole /metrics render at 10,000 queues under the exporter's 10 s",
                     isinstance(rendered, float) and rendered < 10_000
                     if counts[-1] >= 10_000 else None,
                     f"{rendered:,.0f} ms" if isinstance(rendered, float) else str(rendered)),
    ])


if __name__ == "__main__":
    main()
