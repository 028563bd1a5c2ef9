"""A throw-away PostgreSQL 18 for benchmarks, with awa installed.

Durability settings stay at their defaults (fsync on, synchronous_commit on):
the numbers are meant to be what a production server would see on this
machine.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg

from awa_sql import migrate
from awa_sql.demo import embedded
from awa_sql.roles import Roles

BENCH_SETTINGS = {
    "shared_buffers": "512MB",
    "max_connections": "300",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "30min",
}


@contextlib.contextmanager
def bench_server(major: int = 18, settings: dict[str, str] | None = None) -> Iterator[str]:
    """Yields the DSN of a fresh database with awa installed. ``settings``
    adds to (or replaces) BENCH_SETTINGS; AWA_BENCH_DSN's server has its own."""
    if dsn := os.environ.get("AWA_BENCH_DSN"):
        yield dsn
        return
    workdir = Path(tempfile.mkdtemp(prefix="awa-bench-"))
    server = embedded.LocalServer(
        embedded.ensure_binaries(major), workdir / "pgdata",
        settings={**BENCH_SETTINGS, **(settings or {})},
    )
    server.start()
    try:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
        yield dsn
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def machine() -> str:
    cpu = "unknown cpu"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = subprocess.run(["free", "-g"], capture_output=True, text=True, check=False).stdout
    total = next((ln.split()[1] for ln in mem.splitlines() if ln.startswith("Mem:")), "?")
    return f"{platform.node()}: {os.cpu_count()} cores, {total} GiB, {cpu}"


def install_before(conn: psycopg.Connection, ref: str, file: str, function: str) -> None:
    """awa.<function> as of git revision `ref` (from sql/<file>), installed beside
    the current one as public.<function>_before, so that a change's before and
    after run side by side on one server. Its body must still work with
    today's schema."""
    text = subprocess.run(["git", "show", f"{ref}:sql/{file}"], capture_output=True,
                          text=True, check=True, cwd=Path(__file__).parent).stdout
    match = re.search(rf"create or replace function awa\.{function}\(.*?\n\$\$;", text, re.S)
    if not match:
        raise SystemExit(f"no awa.{function} in {ref}:sql/{file}")
    conn.execute(match.group(0)
                 .replace(f"function awa.{function}(", f"function public.{function}_before(")
                 .replace(f"{function}.", f"{function}_before."))
    # Owned like awa's own functions: a superuser's definer skips the
    # EXECUTE check of every function it sets up, and would run faster.
    conn.execute(f"alter function public.{function}_before owner to {Roles().owner}")


def install_enqueue_before(conn: psycopg.Connection, ref: str) -> None:
    install_before(conn, ref, "enqueue.sql", "enqueue")


def export_revision(ref: str, dest: Path) -> Path:
    """The tree of git revision `ref`, written into `dest` (an export, not a
    worktree: an interrupted run leaves nothing in .git)."""
    dest.mkdir(parents=True, exist_ok=True)
    # From the top of the tree: run in a subfolder, git archive exports only it.
    archive = subprocess.run(["git", "archive", ref], capture_output=True, check=True,
                             cwd=Path(__file__).resolve().parent.parent).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def install_revision(dsn: str, checkout: Path) -> None:
    """Migrates the database at `dsn` with the awa_sql package and sql/ of an
    exported checkout, in a process of its own (this one has today's)."""
    code = ("import sys, psycopg; from awa_sql import migrate; from awa_sql.roles import Roles;"
            "c = psycopg.connect(sys.argv[1], autocommit=True);"
            "migrate.migrate(c, Roles(), create_roles=True, log=lambda _l: None)")
    subprocess.run([sys.executable, "-c", code, dsn], check=True,
                   env=dict(os.environ, PYTHONPATH=str(checkout / "installer")))
