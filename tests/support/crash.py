"""A PostgreSQL server of a test module's own, to crash: stopped in
immediate mode (what the server sees of a power cut or an OOM kill of the
postmaster), or one backend killed with SIGKILL, after which the postmaster
ends every other backend and recovers from the WAL as after a crash. Either
way unlogged tables come back empty and sequences at the value they last
logged. The suite's shared servers are never crashed.

A step is crashed at a known point by a statement trigger that the test
installs on a table the step writes (``Hold``): it waits for an advisory lock
that the test holds, the step's backend is seen waiting for it in
pg_stat_activity, and only then is it killed."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from awa_sql import migrate
from awa_sql.demo import embedded
from awa_sql.roles import Roles
from tests.support import scratch
from tests.support.cluster import LOGIN_PASSWORD, TEST_SETTINGS, ensure_binaries
from tests.support.waiting import wait_until

HOLD_KEY = 1_635_213_099  # the advisory lock a held step waits for
GATE_KEY = 1_635_213_100  # the one a step stopped before its statement waits for


@dataclass
class CrashServer:
    server: embedded.LocalServer
    template: str = ""
    databases: list[str] = field(default_factory=list)

    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        info = psycopg.conninfo.conninfo_to_dict(self.server.dsn(dbname=dbname))
        if user is not None:
            info.update(user=user, password=LOGIN_PASSWORD)
        return psycopg.conninfo.make_conninfo(**info)

    def admin(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.dsn(dbname), autocommit=True)

    def new_database(self) -> str:
        name = f"awa_crash_{uuid.uuid4().hex[:10]}"
        with self.admin() as conn:
            conn.execute(sql.SQL("create database {} template {}").format(
                sql.Identifier(name), sql.Identifier(self.template)))
        self.databases.append(name)
        return name

    def login(self, *roles: str) -> str:
        name = f"awa_c_{uuid.uuid4().hex[:10]}"
        with self.admin() as conn:
            conn.execute(sql.SQL("create role {} login password {}").format(
                sql.Identifier(name), sql.Literal(LOGIN_PASSWORD)))
            for role in roles:
                conn.execute(sql.SQL("grant {} to {}").format(
                    sql.Identifier(role), sql.Identifier(name)))
        return name

    def stop_immediately_and_start(self) -> None:
        """A crash as the server sees one, and its recovery."""
        self.server.stop(mode="immediate")
        self.server.start()

    def kill_backend(self, pid: int) -> None:
        """SIGKILL of one backend: the postmaster ends every other one and
        recovers; returns once the server takes connections again."""
        with self.admin() as witness:  # a backend, ended with the others
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not _alive(witness), 60, "the postmaster to end every backend")
        self.wait_up()

    def wait_up(self) -> None:
        def up() -> bool:
            try:
                with self.admin() as conn:
                    return not conn.execute("select pg_is_in_recovery()").fetchone()[0]
            except psycopg.OperationalError:
                return False
        wait_until(up, 60, "the server to take connections after its recovery")


def _alive(conn: psycopg.Connection) -> bool:
    try:
        conn.execute("select 1")
    except psycopg.OperationalError:
        return False
    return True


@contextmanager
def crash_server(major: int) -> Iterator[CrashServer]:
    """A server of its own with the contract migrated into a template database."""
    workdir = scratch.mkdtemp(f"awa-crash-pg{major}-")
    server = embedded.LocalServer(ensure_binaries(major), workdir / "pg",
                                  settings={**TEST_SETTINGS, "max_connections": "100"})
    server.start()
    try:
        crash = CrashServer(server)
        with crash.admin() as conn:
            crash.template = f"awa_crash_template_{uuid.uuid4().hex[:8]}"
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(crash.template)))
        with crash.admin(crash.template) as conn:
            migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
        yield crash
    finally:
        server.stop(mode="immediate")
        shutil.rmtree(workdir, ignore_errors=True)


class Hold:
    """Makes the next ``event`` (insert, update, delete, truncate) statement on
    ``table`` wait, after it ran and before its transaction goes on, for an
    advisory lock this object holds. ``waiting(pid)`` says when backend
    ``pid`` is stopped there. The trigger function sets no lock timeout of
    its own, so the step's own lock_timeout does not end the wait.

    ``before=True`` stops the statement before it touches a row instead, at
    an advisory lock of its own; with ``shut=False`` it lets statements
    through until ``shut()``, so that only the later ones wait."""

    def __init__(self, admin: psycopg.Connection, table: str, event: str, *,
                 before: bool = False, shut: bool = True):
        self.dsn, self.table = admin.info.dsn, table
        when = "before" if before else "after"
        self.key = GATE_KEY if before else HOLD_KEY
        self.trigger = f"crash_gate_{event}" if before else f"crash_hold_{event}"
        function = f"crash_test.hold_{when}"
        admin.execute("create schema if not exists crash_test")
        admin.execute("grant usage on schema crash_test to public")
        # A gate is let go of once passed: shut() must not wait for the
        # transactions that went through it while it was open.
        wait = (f"perform pg_advisory_lock_shared({self.key});"
                f" perform pg_advisory_unlock_shared({self.key});" if before
                else f"perform pg_advisory_xact_lock_shared({self.key});")
        admin.execute(
            f"create or replace function {function}() returns trigger language plpgsql"
            " set lock_timeout = 0 set statement_timeout = 0"
            f" as $$ begin {wait} return null; end $$")
        self.holder = psycopg.connect(self.dsn, autocommit=True)
        if shut:
            self.shut()
        admin.execute(sql.SQL(
            "create trigger {} " + when + " " + event + " on {} for each statement"
            " execute function " + function + "()").format(
                sql.Identifier(self.trigger), sql.SQL(table)))

    def shut(self) -> None:
        self.holder.execute("select pg_advisory_lock(%s)", [self.key])

    def waiting(self, pid: int) -> bool:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(
                "select exists (select from pg_locks where pid = %s and not granted"
                " and locktype = 'advisory' and objid = %s)",
                [pid, self.key & 0xFFFFFFFF]).fetchone()[0]

    def close(self) -> None:
        self.holder.close()


def drop_holds(admin: psycopg.Connection, table: str) -> None:
    for event in ("insert", "update", "delete", "truncate"):
        for trigger in (f"crash_hold_{event}", f"crash_gate_{event}"):
            admin.execute(sql.SQL("drop trigger if exists {} on {}").format(
                sql.Identifier(trigger), sql.SQL(table)))


class Step(threading.Thread):
    """``work(conn)`` on its own connection in a thread, keeping its error:
    the statement a test crashes."""

    def __init__(self, dsn: str, work: Callable[[psycopg.Connection], object]):
        super().__init__(daemon=True)
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.pid = self.conn.execute("select pg_backend_pid()").fetchone()[0]
        self.work = work
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work(self.conn)
        except BaseException as err:  # kept for the test to look at
            self.error = err
