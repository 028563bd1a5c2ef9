"""`awa admin serve` under the admin page's requests: its memory while the
hour of queue history that the queue page charts fills, and once it is full.

bench/soak.py found the admin server's RSS rising through its hour. This
tells a leak from the size of what the pages read: the history a queue page
reads every 3 s (GET /api/queues/{q}/history) holds a point per contention
sample of the last hour, so during a process's first hour on a new database
(or a soak's) each answer is larger than the one before.

On a fresh PostgreSQL 18 (bench/_server.py) three queues as the soak's (S = 1;
S = 8 in auto mode; partitioned, P = 4), and two servers on it:

  plain    `awa admin serve`, as shipped: its RSS
  traced   the same app in a process that runs tracemalloc: its Python heap
           (tracemalloc's own tables make its RSS larger, so not compared)

Both get the page's requests: per queue a tab of the queue page (the queue
and its history at once, then its failed jobs, 3 s after the last answer, on
keep-alive connections, as a browser sends them), a tab of the queue list, a
tab of a job's page, bench/soak.py's poller (a new connection per request),
and every 15 s a HEAD, a 404, a 422, a page and its static files, and two
clients that leave mid-request.

Two phases: `--fill-minutes` in which the hour of samples arrives (older
samples written each 5 s beside awa.autoscale_tick()'s own, so that the hour
is full at the end), then `--full-minutes` with awa.autoscale_tick() alone
every 5 s: the hour slides, its size stays. Each phase's first minute is left
out of the fit.

    python bench/admin_memory.py [--fill-minutes 10] [--full-minutes 15] [--arena-max N]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql import client
from bench import _docs
from bench._server import bench_server, machine
from bench.soak import (
    AWA,
    CREEP_KB_PER_HOUR,
    CREEP_R2,
    QUEUES,
    ROOT,
    fit,
    free_port,
    proc_status,
    set_up,
)

SLOTS = 720  # contention samples in an hour, one per queue each 5 s (awa maintain's tick)
TICK = 5.0
SAMPLE_EVERY = 15.0
WARMUP = 60.0  # seconds of each phase left out of the fit
STATS_EVERY = 10.0
REFRESH = 3.0  # the page's REFRESH_MS


# -- the traced server (`--role traced`) ----------------------------------------------------


def run_traced(dsn: str, port: int, stats: Path) -> None:
    import tracemalloc

    tracemalloc.start(1)
    from awa_sql.admin.serve import serve

    def write() -> None:
        while True:
            tmp = stats.with_suffix(".tmp")
            tmp.write_text(json.dumps({"traced": tracemalloc.get_traced_memory()[0]}))
            os.replace(tmp, stats)
            time.sleep(STATS_EVERY)
    threading.Thread(target=write, daemon=True).start()
    sys.exit(serve(dsn, "127.0.0.1", port, False))


# -- the history ------------------------------------------------------------------------


class History:
    """Ticks awa.autoscale_tick() every TICK s; while filling, also writes
    the next older samples of every queue, ``per_tick`` slots a tick."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="awa-bench history")
        self.conn.execute("select awa.autoscale_tick()")
        self.columns = [r[0] for r in self.conn.execute(
            "select a.attname from pg_catalog.pg_attribute as a"
            " where a.attrelid = 'awa.contention_samples'::pg_catalog.regclass"
            " and a.attnum > 0 and not a.attisdropped and a.attname <> 'sampled_at'"
            " order by a.attnum")]
        self.filled = 0
        self.per_tick = 0

    def tick(self) -> None:
        self.conn.execute("select awa.autoscale_tick()")
        if self.filled >= SLOTS or not self.per_tick:
            return
        cols = ", ".join(self.columns)
        # Each queue's newest sample again, TICK s apart further back each time.
        self.conn.execute(
            f"insert into awa.contention_samples (sampled_at, {cols})"
            f" select s.sampled_at - pg_catalog.make_interval(secs => %s * g),"
            f" {', '.join('s.' + c for c in self.columns)}"
            " from (select distinct on (queue_id) * from awa.contention_samples"
            "        order by queue_id, sampled_at desc) as s"
            " cross join pg_catalog.generate_series(%s::integer, %s::integer) as g"
            " on conflict do nothing",
            [TICK, self.filled + 1, min(self.filled + self.per_tick, SLOTS - 1)])
        self.filled += self.per_tick

    def points(self) -> int:
        """The sample times of the last hour: the points of a history answer."""
        return self.conn.execute(
            "select count(distinct sampled_at) from awa.contention_samples"
            " where sampled_at > pg_catalog.now() - interval '1 hour'").fetchone()[0]


# -- the page's requests ------------------------------------------------------------------


class Tab:
    """A browser tab: its loads every REFRESH s after the last answer, on up
    to two keep-alive connections (a browser's two parallel reads)."""

    def __init__(self, port: int, load, every: float = REFRESH) -> None:
        self.port, self.load, self.every = port, load, every
        self.conns: list[http.client.HTTPConnection | None] = [None, None]
        self.answers = 0
        self.errors: collections.Counter[str] = collections.Counter()

    def get(self, path: str, i: int = 0, method: str = "GET") -> None:
        for _ in range(2):  # once more on a new connection: the server closed an idle one
            if self.conns[i] is None:
                self.conns[i] = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self.conns[i].request(method, path, headers={"Accept": "application/json"})
                self.conns[i].getresponse().read()
                self.answers += 1
                return
            except (http.client.HTTPException, OSError):
                self.conns[i].close()
                self.conns[i] = None
        self.errors[path.split("?")[0]] += 1

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.load(self)
            stop.wait(self.every)


def queue_tab(port: int, queue: str) -> Tab:
    base = f"/api/queues/{quote(queue, safe='')}"

    def load(tab: Tab) -> None:
        history = threading.Thread(target=tab.get, args=(f"{base}/history", 1))
        history.start()
        tab.get(base)
        history.join()
        tab.get(f"{base}/jobs?state=failed&brief=true&limit=20")
    return Tab(port, load)


def soak_tab(port: int, newest: list[int]) -> Tab:
    """bench/soak.py's poller: its URLs, a new connection each (urllib)."""
    def load(tab: Tab) -> None:
        q = QUEUES[tab.answers % len(QUEUES)]
        for path in ("/api/server", "/api/queues", f"/api/queues/{q}",
                     f"/api/queues/{q}/history", f"/api/queues/{q}/jobs?limit=20",
                     f"/api/queues/{q}/jobs?state=failed&limit=20", "/api/failures",
                     f"/api/jobs/{newest[0]}", "/"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                            timeout=30) as answer:
                    answer.read()
                tab.answers += 1
            except OSError:
                tab.errors[path] += 1
    return Tab(port, load)


def odd_tab(port: int) -> Tab:
    """HEAD, 404, 422, a page and its files, and two clients gone mid-request."""
    def load(tab: Tab) -> None:
        tab.get("/", method="HEAD")
        tab.get("/api/nope")
        tab.get(f"/api/queues/{QUEUES[0]}/jobs?limit=0")
        tab.get(f"/queues/{QUEUES[0]}")
        tab.get("/static/admin.js?v=1")
        tab.get("/static/admin.css?v=1")
        for request in (f"GET /api/queues/{QUEUES[2]}/history HTTP/1.1\r\nHost: x\r\n\r\n",
                        "GET /api/queu"):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(request.encode())
    return Tab(port, load, every=15.0)


def tabs_for(port: int, newest: list[int]) -> list[Tab]:
    def job_page(tab: Tab) -> None:
        tab.get(f"/api/jobs/{newest[0]}?args=false")
    return [*(queue_tab(port, q) for q in QUEUES), Tab(port, lambda t: t.get("/api/queues")),
            Tab(port, job_page), soak_tab(port, newest), odd_tab(port)]


# -- the run --------------------------------------------------------------------------------


def wait_for(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"admin_memory: a server exited ({proc.returncode})")
        with contextlib.suppress(OSError), urllib.request.urlopen(
                f"http://127.0.0.1:{port}/api/server", timeout=5):
            return
        time.sleep(0.5)
    raise SystemExit("admin_memory: a server did not answer in 60 s")


def measure(procs: dict[str, subprocess.Popen], stats: Path, history: History,
            phases: tuple[tuple[str, float], ...]) -> list[tuple[str, float, float, float]]:
    """(series, elapsed s, value, start of its phase) every SAMPLE_EVERY s."""
    rows = []
    started = time.monotonic()
    for phase, minutes in phases:
        begun = time.monotonic() - started
        end = time.monotonic() + minutes * 60
        next_sample = time.monotonic()
        while time.monotonic() < end:
            history.tick()
            if time.monotonic() >= next_sample:
                at = time.monotonic() - started
                for name, proc in procs.items():
                    if proc.poll() is not None:
                        raise SystemExit(f"admin_memory: {name} exited ({proc.returncode})")
                    rows.append((f"{phase}.{name}.rss_kb", at,
                                 proc_status(proc.pid)["VmRSS"], begun))
                with contextlib.suppress(OSError, ValueError):
                    traced = json.loads(stats.read_text())["traced"] / 1024
                    rows.append((f"{phase}.traced.heap_kb", at, traced, begun))
                rows.append((f"{phase}.history.points", at, history.points(), begun))
                next_sample += SAMPLE_EVERY
            time.sleep(TICK)
        history.per_tick = 0
    return rows


def run(args: argparse.Namespace) -> list[tuple[str, float, float, float]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "installer"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if args.arena_max:
        env["MALLOC_ARENA_MAX"] = str(args.arena_max)
    stats = Path(tempfile.mkdtemp(prefix="awa-admin-memory-")) / "traced.json"
    with bench_server() as dsn:
        set_up(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            newest = [max(client.enqueue(conn, "ok", {"i": i}, queue=queue).job_id
                          for queue in QUEUES for i in range(20))]
        ports = {"plain": free_port(), "traced": free_port()}
        procs = {
            "plain": subprocess.Popen([*AWA, "admin", "serve", "--dsn", dsn, "--port",
                                       str(ports["plain"])], env=env, cwd=ROOT,
                                      stdout=subprocess.DEVNULL),
            "traced": subprocess.Popen([sys.executable, __file__, "--role", "traced", "--dsn",
                                        dsn, "--port", str(ports["traced"]), "--stats",
                                        str(stats)], env=env, cwd=ROOT,
                                       stdout=subprocess.DEVNULL),
        }
        stop = threading.Event()
        tabs: list[Tab] = []
        threads: list[threading.Thread] = []
        try:
            for name, port in ports.items():
                wait_for(port, procs[name])
                tabs += tabs_for(port, newest)
            threads = [threading.Thread(target=t.run, args=(stop,), daemon=True) for t in tabs]
            for thread in threads:
                thread.start()
            history = History(dsn)
            history.per_tick = -(-SLOTS // int(args.fill_minutes * 60 / TICK))
            rows = measure(procs, stats, history, (("fill", args.fill_minutes),
                                                   ("full", args.full_minutes)))
        finally:
            stop.set()
            for thread in threads:  # a load under way ends before its server does
                thread.join(60)
            for proc in procs.values():
                proc.terminate()
                proc.wait(30)
    errors = sum((t.errors for t in tabs), collections.Counter())
    print(f"# admin memory: {machine()}; PostgreSQL 18; history filled in"
          f" {args.fill_minutes:g} min, then {args.full_minutes:g} min full;"
          f" MALLOC_ARENA_MAX {args.arena_max or 'unset'}")
    print(f"answers: {sum(t.answers for t in tabs):,}; failed requests:"
          f" {sum(errors.values())}{' ' + str(dict(errors.most_common(3))) if errors else ''}")
    return rows


def summarise(rows: list[tuple[str, float, float, float]]) -> list[_docs.Target]:
    series: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for name, at, value, begun in rows:
        if at - begun >= WARMUP:
            series[name].append((at, value))
    print("\n| phase | series | first | last | slope / h | r^2 |")
    print("|---|---|---:|---:|---:|---:|")
    creeps = {}
    for name in sorted(series, key=lambda n: (n.split(".")[0] != "fill", n)):
        points = series[name]
        if len(points) < 4:
            continue
        slope, r2 = fit(points)
        # bench/soak.py's memory that creeps: a line this straight, rising this fast.
        creeps[name] = r2 >= CREEP_R2 and slope * 3600 >= CREEP_KB_PER_HOUR
        phase, what = name.split(".", 1)
        print(f"| {phase} | {what} | {points[0][1]:,.0f} | {points[-1][1]:,.0f} |"
              f" {slope * 3600:+,.0f} | {r2:.2f} |")
    test = f"(r^2 >= {CREEP_R2}, >= {CREEP_KB_PER_HOUR:g} kB/h)"
    heap = [p for p in ("fill", "full") if creeps.get(f"{p}.traced.heap_kb", True)]
    full = creeps.get("full.plain.rss_kb", True)
    return [_docs.Target(f"the Python heap does not creep in either phase {test}", not heap,
                         f"creeps: {', '.join(heap)}" if heap else "neither"),
            _docs.Target(f"RSS does not creep once the hour is full {test}", not full,
                         "creeps" if full else "does not")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fill-minutes", type=float, default=10.0,
                        help="minutes in which the hour of history fills")
    parser.add_argument("--full-minutes", type=float, default=15.0,
                        help="minutes with the hour full after it")
    parser.add_argument("--arena-max", type=int, default=0,
                        help="MALLOC_ARENA_MAX for both servers (0: unset)")
    parser.add_argument("--role", choices=("traced",), help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    _docs.add_argument(parser)
    args = parser.parse_args()
    if args.role:
        run_traced(args.dsn, args.port, Path(args.stats))
        return
    block = _docs.Block(__file__, "Admin server memory", args.write_docs)
    block.write(summarise(run(args)))


if __name__ == "__main__":
    main()
