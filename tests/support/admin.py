"""Helpers for the admin tests: apps on a test database, a real standby."""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from fastapi.testclient import TestClient

from awa_sql import migrate
from awa_sql.admin.app import Settings, create_app, make_pool
from awa_sql.demo import embedded
from awa_sql.roles import Roles
from tests.support.cluster import ensure_binaries
from tests.support.database import Database
from tests.support.waiting import wait_until as wait_for

TOKEN = "test-token-0123456789abcdef"
ROOT = Path(__file__).resolve().parent.parent.parent


def operator_login(db: Database) -> str:
    return db.login_role("awa_reader", "awa_operator", prefix="awa_adm_")


def reader_login(db: Database) -> str:
    return db.login_role("awa_reader", prefix="awa_adm_")


@contextmanager
def client_for(dsn: str, writable: bool, token: str | None = TOKEN) -> Iterator[TestClient]:
    """A TestClient on an app with its own pool, as ``awa admin serve`` builds it."""
    app = create_app(Settings(dsn=dsn, writable=writable, token=token if writable else None))
    with TestClient(app) as client:
        yield client


@contextmanager
def shared_pool_app(dsn: str, writable: bool) -> Iterator:
    """An app on a pool that outlives any one request's lifespan (for schemathesis)."""
    settings = Settings(dsn=dsn, writable=writable, token=TOKEN if writable else None)
    pool = make_pool(settings, open_now=True)
    try:
        yield create_app(settings, pool=pool)
    finally:
        pool.close()


def auth(token: str = TOKEN) -> dict:
    return {"Authorization": f"Bearer {token}"}


def enqueue_jobs(db: Database, queue: str, count: int, keyed: bool = True) -> None:
    with db.connect() as conn:
        conn.execute(
            "select awa.enqueue(%(q)s, 't', '{}'::jsonb, 2::smallint,"
            " case when %(keyed)s then ('k' || i)::bytea end)"
            " from generate_series(1, %(n)s) as i", {"q": queue, "n": count, "keyed": keyed})


@contextmanager
def serve_cli(dsn: str, *args: str, token: str | None = None, env: dict | None = None,
              output: list[str] | None = None) -> Iterator[str]:
    """``awa admin serve`` as a real process; yields its base URL once it
    answers. ``env`` adds to the environment; ``output`` gets what the
    process printed (stdout and stderr), once it has stopped."""
    import httpx

    given = env or {}
    env = {**os.environ, "AWA_DATABASE_URL": dsn}
    env.pop("AWA_ADMIN_TOKEN", None)
    env.pop("AWA_ADMIN_ALLOWED_HOSTS", None)
    if token:
        env["AWA_ADMIN_TOKEN"] = token
    env.update(given)
    # --port 0 and the port it prints: a port picked here and passed on could
    # be taken by another test's server meanwhile, which would then answer.
    proc = subprocess.Popen(
        [sys.executable, "-m", "awa_sql", "admin", "serve", "--port", "0", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    assert ready, "awa admin serve printed nothing in 30 s"
    line = proc.stdout.readline()
    match = re.search(r"on (http://\S+?)/ ", line)
    if not match:
        proc.kill()
        raise AssertionError(f"no URL in {line!r}: {proc.communicate()[0]}")
    base = match.group(1)

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"awa admin serve exited {proc.returncode}: "
                                 f"{proc.stdout.read()}")
        try:
            return httpx.get(f"{base}/api/server", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, timeout=30, what="awa admin serve to answer")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # Read through proc.stdout, not communicate(timeout=...): that reads
        # the pipe itself and loses what readline() above already buffered.
        rest = proc.stdout.read()
        proc.stdout.close()
        if output is not None:
            output.extend([line, *rest.splitlines(keepends=True)])


# -- a real streaming standby ------------------------------------------------------------


def _chown_tree(path: Path) -> None:
    user = embedded.server_os_user()
    if user is None:
        return
    for p in [path, *path.rglob("*")]:
        os.chown(p, user.pw_uid, user.pw_gid, follow_symlinks=False)


BIND_ATTEMPTS = 5


def _start_on_a_free_port(server: embedded.LocalServer) -> None:
    """Starts ``server``; a port another test took since it was picked (the
    standby's is picked seconds before, across a base backup) is picked again."""
    for attempt in range(BIND_ATTEMPTS):
        try:
            server.start()
            return
        except embedded.EmbeddedError as err:
            if "Address already in use" not in str(err) or attempt == BIND_ATTEMPTS - 1:
                raise
            server.port = embedded.free_port()


@contextmanager
def primary_and_standby(major: int, workdir: Path) -> Iterator[tuple[str, str]]:
    """A small primary with awa installed in database ``awa`` and a hot standby
    streaming from it, made by a low-level base backup (the embedded builds
    carry no pg_basebackup). Yields the two DSNs of database ``awa``."""
    bindir = ensure_binaries(major)
    primary = embedded.LocalServer(bindir, workdir / "primary", settings={
        "fsync": "off", "wal_level": "replica", "max_wal_senders": "4",
        "wal_keep_size": "64MB"})
    standby = embedded.LocalServer(bindir, workdir / "standby",
                                   settings={"fsync": "off", "hot_standby": "on"})
    _start_on_a_free_port(primary)
    try:
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("create database awa")
        with psycopg.connect(primary.dsn(dbname="awa"), autocommit=True) as conn:
            migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
            conn.execute("select awa.enqueue('standby-q', 't', '{}'::jsonb)")
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("select pg_backup_start('awa-admin-standby', true)")
            shutil.copytree(primary.data_dir, standby.data_dir, symlinks=True,
                            ignore=shutil.ignore_patterns("postmaster.pid", "postmaster.opts"))
            label, _spcmap = conn.execute(
                "select labelfile, spcmapfile from pg_backup_stop(false)").fetchone()
        (standby.data_dir / "backup_label").write_text(label)
        (standby.data_dir / "standby.signal").write_text("")
        with (standby.data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={primary.port} "
                       "user=postgres'\n")
        standby.data_dir.chmod(0o700)
        _chown_tree(standby.data_dir)
        _start_on_a_free_port(standby)
        try:
            yield primary.dsn(dbname="awa"), standby.dsn(dbname="awa")
        finally:
            standby.stop("immediate")
    finally:
        primary.stop("immediate")
