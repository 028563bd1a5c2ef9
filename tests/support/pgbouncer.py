"""A real PgBouncer in transaction mode in front of a test server.

Debian's ``pgbouncer`` package (1.18 on Debian 12: no protocol-level prepared
statements) runs in the foreground as the unprivileged OS user that runs the
test servers, on a free port, with few server connections and many clients.
Any login the server knows may connect: PgBouncer looks it up with
``auth_query`` as the superuser and, like the test server, trusts it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from awa_sql.connect import connect
from awa_sql.demo import embedded
from tests.support.database import Database

POOL_SIZE = 4  # server connections per database
MAX_CLIENTS = 200


class PgBouncerError(RuntimeError):
    pass


class PortTaken(PgBouncerError):
    """Another process bound the port before PgBouncer could."""


def binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)
    if found is None:
        raise PgBouncerError(
            "pgbouncer is not installed: apt-get install pgbouncer (.ci/run does)")
    return found


def config(port: int, server_port: int, superuser: str, workdir: Path) -> str:
    return f"""\
[databases]
* = host=127.0.0.1 port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir / "userlist.txt"}
auth_user = {superuser}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_db_connections = {POOL_SIZE}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = {MAX_CLIENTS}
server_reset_query = DISCARD ALL
ignore_startup_parameters = extra_float_digits
query_wait_timeout = 60
logfile = {workdir / "pgbouncer.log"}
log_connections = 0
log_disconnections = 0
admin_users = {superuser}
"""


@dataclass
class PgBouncer:
    port: int
    workdir: Path
    process: subprocess.Popen
    admin_user: str = "postgres"

    def admin(self) -> psycopg.Connection:
        """The admin console (database ``pgbouncer``): simple protocol only, so
        use ``server_connections`` rather than ``execute``."""
        return psycopg.connect(
            f"host=127.0.0.1 port={self.port} dbname=pgbouncer user={self.admin_user}",
            autocommit=True)

    @staticmethod
    def server_connections(admin: psycopg.Connection, dbname: str) -> int:
        """How many server connections PgBouncer holds to ``dbname`` now."""
        res = admin.pgconn.exec_(b"SHOW SERVERS")
        if res.status != psycopg.pq.ExecStatus.TUPLES_OK:
            raise PgBouncerError(f"SHOW SERVERS failed: {res.error_message.decode()}")
        col = [res.fname(i) for i in range(res.nfields)].index(b"database")
        return sum(res.get_value(row, col) == dbname.encode() for row in range(res.ntuples))

    @property
    def log_file(self) -> Path:
        return self.workdir / "pgbouncer.log"

    def log_text(self, start: int = 0) -> str:
        with self.log_file.open("rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")

    def log_size(self) -> int:
        return self.log_file.stat().st_size if self.log_file.exists() else 0

    def dsn(self, base_dsn: str) -> str:
        """``base_dsn`` (a direct DSN to the test server) pointed at PgBouncer."""
        info = psycopg.conninfo.conninfo_to_dict(base_dsn)
        info.update(host="127.0.0.1", port=str(self.port))
        return psycopg.conninfo.make_conninfo(**info)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Pooled:
    """A test database reached through PgBouncer."""

    db: Database
    bouncer: PgBouncer

    def dsn(self, user: str | None = None) -> str:
        return self.bouncer.dsn(self.db.dsn(user))

    def connect(self, user: str | None = None, autocommit: bool = True) -> psycopg.Connection:
        return connect(self.dsn(user), autocommit=autocommit)


@dataclass
class LogMark:
    bouncer_at: int
    server_at: int


def mark(p: Pooled) -> LogMark:
    return LogMark(p.bouncer.log_size(), p.db.cluster.server.log_file.stat().st_size)


def log_problems(p: Pooled, since: LogMark) -> list[str]:
    """PgBouncer's warnings and errors, and the server's errors, since ``since``."""
    found = [f"pgbouncer: {line}" for line in p.bouncer.log_text(since.bouncer_at).splitlines()
             if " WARNING " in line or " ERROR " in line]
    with p.db.cluster.server.log_file.open("rb") as f:
        f.seek(since.server_at)
        server = f.read().decode("utf-8", "replace")
    found += [f"server: {line}" for line in server.splitlines()
              if "ERROR:" in line or "FATAL:" in line]
    return found


BIND_ATTEMPTS = 5


def start(server_port: int, workdir: Path, superuser: str = "postgres") -> PgBouncer:
    """PgBouncer on a free port, answering. PgBouncer cannot be told to pick
    its port, so a port picked here may be taken by another test worker
    before PgBouncer binds it: then PgBouncer exits, and another port is
    tried. Nothing connects until PgBouncer's log says it listens, so a
    test never talks to whatever else took the port."""
    for _ in range(BIND_ATTEMPTS - 1):
        try:
            return _start_on(embedded.free_port(), server_port, workdir, superuser)
        except PortTaken:
            continue
    return _start_on(embedded.free_port(), server_port, workdir, superuser)


def _start_on(port: int, server_port: int, workdir: Path, superuser: str) -> PgBouncer:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "userlist.txt").write_text(f'"{superuser}" ""\n')
    ini = workdir / "pgbouncer.ini"
    ini.write_text(config(port, server_port, superuser, workdir))
    user = embedded.server_os_user()
    kwargs = {}
    if user is not None:
        os.chown(workdir, user.pw_uid, user.pw_gid)
        for p in workdir.iterdir():
            os.chown(p, user.pw_uid, user.pw_gid)
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    # Not a pipe: nobody reads it while the tests run, and a full pipe blocks.
    with (workdir / "stderr.log").open("wb") as stderr:
        process = subprocess.Popen(
            [binary(), str(ini)], cwd="/", stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=stderr, **kwargs)
    bouncer = PgBouncer(port, workdir, process, superuser)
    listening = f"listening on 127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        log = bouncer.log_text() if bouncer.log_file.exists() else ""
        if process.poll() is not None:
            stderr_text = (workdir / "stderr.log").read_text(errors="replace")
            if "nowhere to listen on" in log + stderr_text:
                raise PortTaken(f"port {port} was taken before pgbouncer bound it")
            raise PgBouncerError(
                f"pgbouncer exited {process.returncode}: {stderr_text[-2000:]}\n{log}")
        if listening in log:
            try:
                with psycopg.connect(
                        f"host=127.0.0.1 port={port} dbname=postgres user={superuser}",
                        connect_timeout=2, autocommit=True) as conn:
                    conn.execute("select 1")
                return bouncer
            except psycopg.OperationalError as err:
                if time.monotonic() > deadline:
                    bouncer.stop()
                    raise PgBouncerError(
                        f"pgbouncer did not answer on port {port}: {err}") from err
        elif time.monotonic() > deadline:
            bouncer.stop()
            raise PgBouncerError(f"pgbouncer did not log {listening!r}:\n{log}")
        time.sleep(0.1)  # polling for the listener, with a deadline
