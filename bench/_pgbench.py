"""pgbench plumbing shared by the server-side benchmarks.

pgbench is a C client (Debian's postgresql-client ships it), so its numbers
are the server's, not a Python driver's. Each cell runs one pgbench script
for a fixed time with ``-M prepared`` and synchronous commit on; the caller
interleaves cells so that the ones it compares run side by side, and takes
the median of several runs.

Peers are installed by the bench, never by the package: ``procrastinate``'s
wheel is fetched from PyPI into a cache and only its ``schema.sql`` is read.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

PROCRASTINATE = "procrastinate==3.10.0"
CACHE = Path(os.environ.get("AWA_BENCH_CACHE", Path(tempfile.gettempdir()) / "awa-bench-cache"))

_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.M)


def pgbench_binary() -> str:
    found = shutil.which("pgbench")
    if not found:
        raise SystemExit("pgbench not found: apt-get install postgresql-client")
    return found


def run(dsn: str, script: str, clients: int, seconds: float) -> float:
    """Transactions per second of ``script`` with ``clients`` connections.

    Each client runs the script in a loop for ``seconds``; one pgbench
    transaction is one run of the script. Fails loudly on any failed
    transaction, so a cell that errors cannot pass for a slow one.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        proc = subprocess.run(
            [pgbench_binary(), "-n", "-M", "prepared", "-c", str(clients),
             "-j", str(min(clients, os.cpu_count() or 1)), "-T", str(max(1, round(seconds))),
             "-f", path, dsn],
            capture_output=True, text=True, check=False,
        )
    finally:
        os.unlink(path)
    match = _TPS.search(proc.stdout)
    failed = re.search(r"number of failed transactions: ([1-9][0-9]*)", proc.stdout)
    if proc.returncode != 0 or not match or failed:
        raise RuntimeError(f"pgbench failed:\n{script}\n{proc.stdout}\n{proc.stderr}")
    return float(match.group(1))


def pgbench_version() -> str:
    return subprocess.run([pgbench_binary(), "--version"], capture_output=True, text=True,
                          check=True).stdout.strip()


@dataclass
class Cell:
    """One measured thing: a pgbench script, and a reset run before each run."""

    name: str
    script: str
    rows_per_tx: int = 1
    reset: Callable[[psycopg.Connection], None] | None = None


@dataclass
class Grid:
    """Runs every cell at every client count, ``runs`` times, interleaved.

    Interleaving (run 1 of every cell, then run 2, ...) keeps a noisy
    machine's slow minute from landing on one cell only.
    """

    dsn: str
    cells: Sequence[Cell]
    clients: Sequence[int]
    seconds: float
    runs: int = 3
    results: dict[tuple[str, int], list[float]] = field(default_factory=dict)

    def measure(self, progress: Callable[[str], None] = lambda _s: None) -> None:
        for run_no in range(1, self.runs + 1):
            for clients in self.clients:
                for cell in self.cells:
                    with psycopg.connect(self.dsn, autocommit=True) as conn:
                        if cell.reset:
                            cell.reset(conn)
                        conn.execute("checkpoint")
                    tps = run(self.dsn, cell.script, clients, self.seconds)
                    self.results.setdefault((cell.name, clients), []).append(
                        tps * cell.rows_per_tx)
                    progress(f"run {run_no} {cell.name} c={clients}: "
                             f"{tps * cell.rows_per_tx:,.0f}/s")

    def median(self, name: str, clients: int) -> float:
        return statistics.median(self.results[(name, clients)])

    def paired(self, name: str, base: str, clients: int) -> float:
        """The median over runs of `name` / `base` within each run: steadier
        than a ratio of medians when the machine's speed drifts between runs."""
        return statistics.median(
            v / b for v, b in zip(self.results[(name, clients)],
                                  self.results[(base, clients)], strict=True))

    def spread(self, name: str, clients: int) -> str:
        values = self.results[(name, clients)]
        return f"{min(values):,.0f}-{max(values):,.0f}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def procrastinate_schema() -> str:
    """procrastinate's own schema.sql, from its wheel on PyPI (cached)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob("procrastinate-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "-d", str(CACHE), PROCRASTINATE],
            check=True,
        )
        wheels = sorted(CACHE.glob("procrastinate-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        return wheel.read("procrastinate/sql/schema.sql").decode()


def install_procrastinate(conn: psycopg.Connection) -> str:
    """Installs procrastinate's tables and functions in schema public.

    Returns the version installed.
    """
    conn.execute(procrastinate_schema())
    return PROCRASTINATE.split("==")[1]
