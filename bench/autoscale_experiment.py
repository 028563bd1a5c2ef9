"""The auto-scaler's experiment gate: three producer shapes against static S = 1, 2, 4, 8 and
against auto (max 8), reporting throughput, p99 enqueue latency and S changes.

Shapes (one queue, single-row awa.enqueue transactions, synchronous_commit on):
  steady  16 producers for the whole run, unkeyed;
  bursty  4 producers, joined by 28 more (32 in all) for 10 s every 30 s;
  skewed  16 producers, 80% of jobs on 4 hot ordering keys, 20% on 10,000 others.

Auto mode runs the real controller (`awa.autoscale_tick()` from its own
process) with its time constants scaled to the run length: tick every 1 s,
grow window 5 s, cooldown 10 s, shrink window 30 s, min 3 samples (the
defaults are 5 s / 30 s / 60 s / 5 min; see configuration.md). Runs are
interleaved (shape by shape, configurations in turn) so machine noise hits
every configuration alike.

Gate (ADR 008): auto ships as recommended only if on every shape it is
within 10% of the best static setting's throughput, changes S at most twice
per steady phase, and its p99 enqueue latency is at most 20% above the best
static setting's. Phases: steady and skewed are one phase each; bursty has
burst and quiet phases. With --runs N every shape runs N times and the gate
judges the medians (the most changes in one phase: the worst run).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _docs
from bench._server import bench_server, machine

QUEUE = "experiment"
HOT_KEYS = [f"hot-{i}".encode() for i in range(4)]
CONFIGS = ["S=1", "S=2", "S=4", "S=8", "auto"]
BURST_EVERY, BURST_LENGTH, BURST_EXTRA = 30.0, 10.0, 28


def active(shape: str, index: int, t: float) -> bool:
    """Whether producer `index` enqueues at `t` seconds into the run."""
    if shape != "bursty" or index < 4:
        return True
    return (t % BURST_EVERY) < BURST_LENGTH


def producers_for(shape: str) -> int:
    return 4 + BURST_EXTRA if shape == "bursty" else 16


def _producer(dsn, shape, index, t0, seconds, out):
    rng = random.Random(index)
    latencies: list[float] = []
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select 1")
        while (now := time.monotonic()) < t0 + seconds:
            if now < t0:
                time.sleep(t0 - now)
                continue
            if not active(shape, index, now - t0):
                time.sleep(0.05)  # idle between bursts, by design of the shape
                continue
            key = None
            if shape == "skewed":
                key = (rng.choice(HOT_KEYS) if rng.random() < 0.8
                       else f"cold-{rng.randrange(10_000)}".encode())
            began = time.perf_counter()
            conn.execute("select awa.enqueue(%s, 'exp.job', ordering_key => %s)",
                         [QUEUE, key], prepare=True)
            latencies.append(time.perf_counter() - began)
            done += 1
    out.put((done, latencies))


def _ticker(dsn, t0, seconds):
    with psycopg.connect(dsn, autocommit=True) as conn:
        time.sleep(max(0.0, t0 - time.monotonic()))
        while time.monotonic() < t0 + seconds:
            conn.execute("select count(*) from awa.autoscale_tick()")
            time.sleep(1.0)  # the controller's tick interval


def prepare(dsn: str, config: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("truncate awa.ready, awa.contention_samples, awa.autoscale_decisions,"
                     " awa.shard_changes cascade")
        conn.execute("select awa.set_shard_mode(%s, 'manual')", [QUEUE])
        shards = 1 if config == "auto" else int(config.split("=")[1])
        conn.execute("select awa.set_enqueue_shards(%s, %s)", [QUEUE, shards])
        conn.execute("truncate awa.shard_changes cascade")
        if config == "auto":
            conn.execute("select awa.set_shard_mode(%s, 'auto', 8)", [QUEUE])
            conn.execute(
                "select awa.set_autoscale_policy(%s, grow_window => '5 s',"
                " cooldown => '10 s', shrink_window => '30 s', min_samples => 3)", [QUEUE])
        conn.execute("checkpoint")


def phases(shape: str, seconds: float) -> list[tuple[str, float, float]]:
    if shape != "bursty":
        return [(shape, 0.0, seconds)]
    out, t = [], 0.0
    while t < seconds:
        out.append(("burst", t, min(t + BURST_LENGTH, seconds)))
        if t + BURST_LENGTH < seconds:
            out.append(("quiet", t + BURST_LENGTH, min(t + BURST_EVERY, seconds)))
        t += BURST_EVERY
    return out


def run(dsn: str, shape: str, config: str, seconds: float) -> dict:
    prepare(dsn, config)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    t0 = time.monotonic() + 1.0
    procs = [ctx.Process(target=_producer, args=(dsn, shape, i, t0, seconds, out))
             for i in range(producers_for(shape))]
    if config == "auto":
        procs.append(ctx.Process(target=_ticker, args=(dsn, t0, seconds)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        started_at = conn.execute("select clock_timestamp()").fetchone()[0]
    for p in procs:
        p.start()
    results = [out.get() for _ in range(producers_for(shape))]
    for p in procs:
        p.join()
    done = sum(r[0] for r in results)
    latencies = sorted(x for r in results for x in r[1])
    p99 = latencies[int(len(latencies) * 0.99)] if latencies else float("nan")
    with psycopg.connect(dsn, autocommit=True) as conn:
        changes = conn.execute(
            "select extract(epoch from changed_at - %s)::float8 - 1.0, old_shards, new_shards"
            " from awa.shard_changes where queue = %s order by change_id",
            [started_at, QUEUE]).fetchall()
    per_phase = [(name, sum(1 for c in changes if start <= c[0] < end))
                 for name, start, end in phases(shape, seconds)]
    return {"rate": done / seconds, "p99_ms": p99 * 1000, "changes": changes,
            "per_phase": per_phase}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per run (default 60)")
    parser.add_argument("--shapes", default="steady,bursty,skewed")
    parser.add_argument("--runs", type=int, default=3, help="runs per shape (default 3)")
    _docs.add_argument(parser)
    args = parser.parse_args()
    block = _docs.Block(__file__, "Auto-scaler experiment", args.write_docs)
    shapes = args.shapes.split(",")
    with bench_server() as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("select awa.enqueue(%s, 'warmup')", [QUEUE])
            version = conn.execute("show server_version").fetchone()[0]
        print(f"# autoscale_experiment: {machine()}; PostgreSQL {version}; "
              f"synchronous_commit=on; {args.seconds:g} s per run", flush=True)
        verdicts = []
        gate = []
        for shape in shapes:
            print(f"\n## {shape}: jobs/s, p99 enqueue latency, S changes")
            print(f"{'run':>3} | {'config':>8} | {'jobs/s':>9} | {'p99 ms':>8} | "
                  "changes (t s: old->new)")
            runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
            for n in range(1, args.runs + 1):
                for config in CONFIGS:
                    r = run(dsn, shape, config, args.seconds)
                    runs[config].append(r)
                    trail = ", ".join(f"{t:.0f}s: {a}->{b}" for t, a, b in r["changes"]) or "-"
                    print(f"{n:>3} | {config:>8} | {r['rate']:>9,.0f} | {r['p99_ms']:>8.1f} | "
                          f"{trail}", flush=True)
            rate = {c: statistics.median(r["rate"] for r in runs[c]) for c in CONFIGS}
            p99 = {c: statistics.median(r["p99_ms"] for r in runs[c]) for c in CONFIGS}
            best = max(CONFIGS[:-1], key=lambda c: rate[c])
            share = rate["auto"] / rate[best]
            latency = p99["auto"] / p99[best]
            most = max(n for r in runs["auto"] for _, n in r["per_phase"])
            ok = share >= 0.9 and most <= 2 and latency <= 1.2
            verdicts.append(ok)
            gate.append(_docs.Target(
                f"{shape}: auto within 10% of the best static S's throughput, p99 at most"
                " 120% of its, at most 2 changes of S per phase", ok,
                f"{share:.0%} of {best}, p99 {latency:.0%}, {most} changes"))
            print("medians: " + ", ".join(f"{c} {rate[c]:,.0f}/s p99 {p99[c]:.1f} ms"
                                          for c in CONFIGS))
            print(f"auto vs best static ({best}): throughput {share:.0%}, p99 {latency:.0%}; "
                  f"most S changes in one phase: {most} -> {'PASS' if ok else 'FAIL'}",
                  flush=True)
        verdict = ("PASS: auto may ship as recommended" if all(verdicts)
                   else "FAIL: shadow stays the default")
        print(f"\ngate: {verdict}")
    block.write(gate)


if __name__ == "__main__":
    main()
