"""Who may migrate: logins that cannot act as the owner role are refused
before any step; a stale --sql script stops before taking a database back;
bad lock durations are exit 2; the lock notes of docs/migrations.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from awa_sql import __version__, migrate
from awa_sql.roles import Roles
from awa_sql.source import load_layer, load_migrations
from tests.support.catalog import snapshot
from tests.support.ports import refusing_port

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = load_migrations()
LAYER = load_layer()


def _records(conn: psycopg.Connection) -> tuple[list, list]:
    return (conn.execute("select version, xmin::text from awa.schema_migrations"
                         " order by version").fetchall(),
            conn.execute("select file, xmin::text from awa.schema_functions order by file"
                         ).fetchall())


def _memberships(conn: psycopg.Connection, login: str) -> list[tuple]:
    return conn.execute(
        "select r.rolname, m.admin_option, m.inherit_option, m.set_option"
        "  from pg_auth_members m join pg_roles r on r.oid = m.roleid"
        "  join pg_roles u on u.oid = m.member where u.rolname = %s order by 1, 2",
        [login]).fetchall()


def test_a_login_with_only_admin_option_on_the_owner_is_refused_on_an_installed_database(db):
    """What the CREATEROLE login that created the roles holds (PostgreSQL
    16+): ADMIN OPTION, neither SET nor INHERIT. It cannot read schema awa,
    yet the database is installed: status and migrate say so (exit 6, with
    the grant that works) rather than see an empty database, and migrate
    does not grant the login the owner role to reach it."""
    login = db.login_role()
    with db.connect() as conn:
        conn.execute(sql.SQL("grant awa_owner to {} with admin true, inherit false, set false")
                     .format(sql.Identifier(login)))
        conn.execute("delete from awa.schema_functions")  # work a run would do
        records, held = _records(conn), _memberships(conn, login)
    grant = f"GRANT awa_owner TO {login} WITH INHERIT TRUE, SET TRUE"
    gate = db.awa("status", "--check", user=login)
    assert gate.returncode == 6, gate.stdout + gate.stderr
    assert f"login '{login}' cannot act as 'awa_owner': {grant}" in gate.stdout, gate.stdout
    assert "may not read its migration records" in gate.stdout
    assert "0001_schema" not in gate.stdout  # not listed as pending
    refused = db.awa("migrate", user=login)
    assert refused.returncode == 6, refused.stdout + refused.stderr
    assert grant in refused.stderr and "ADMIN OPTION" in refused.stderr, refused.stderr
    assert "applied" not in refused.stdout and "skipped" not in refused.stdout, refused.stdout
    with db.connect() as conn:
        assert _records(conn) == records
        assert _memberships(conn, login) == held == [("awa_owner", True, False, False)]
    # The grant named works, run by the login itself.
    with db.connect(login) as own:
        own.execute(grant)
    assert "applied function layer" in db.awa("migrate", user=login, check=True).stdout


def test_a_createrole_login_with_admin_option_installs_a_first_time(empty_db, role_prefix):
    """The roles made beforehand by a CREATEROLE login, which holds ADMIN
    OPTION on them only: its first install grants itself the owner role."""
    login = empty_db.login_role(extra="createrole")
    with empty_db.cluster.admin() as conn:
        conn.execute(sql.SQL("grant create on database {} to {}").format(
            sql.Identifier(empty_db.name), sql.Identifier(login)))
    with empty_db.connect(login) as conn:
        for name in Roles.with_prefix(role_prefix).as_dict().values():
            conn.execute(sql.SQL("create role {} nologin").format(sql.Identifier(name)))
    installed = empty_db.awa("migrate", "--role-prefix", role_prefix, user=login)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert empty_db.awa("status", "--check", "--role-prefix", role_prefix,
                        user=login).returncode == 0


@pytest.mark.parametrize("self_grant", ["set", "inherit"])
def test_a_createrole_login_whose_self_grant_gives_one_option_installs(empty_db, role_prefix,
                                                                      self_grant):
    """createrole_self_grant = 'set' (or 'inherit') makes the creator a
    member with SET (or INHERIT) only; the bootstrap's plain GRANT kept the
    existing grant's options, and the first install failed after the roles
    step (exit 7 or 6). It grants both."""
    login = empty_db.login_role(extra="createrole")
    with empty_db.cluster.admin() as conn:
        conn.execute(sql.SQL("grant create on database {} to {}").format(
            sql.Identifier(empty_db.name), sql.Identifier(login)))
        conn.execute(sql.SQL("alter role {} set createrole_self_grant = {}").format(
            sql.Identifier(login), sql.Literal(self_grant)))
    installed = empty_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix,
                             user=login)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert empty_db.awa("status", "--check", "--role-prefix", role_prefix,
                        user=login).returncode == 0


def test_a_noinherit_createrole_login_is_refused_before_any_step(empty_db, role_prefix):
    """A NOINHERIT login's grant of the owner role to itself would not be
    inherited, and the bootstrap's ALTER DEFAULT PRIVILEGES needs it: the
    roles step used to commit, and every run fail at the bootstrap (7).
    Refused first, saying why; the explicit grant named works."""
    login = empty_db.login_role(extra="createrole noinherit")
    roles = Roles.with_prefix(role_prefix)
    with empty_db.cluster.admin() as conn:
        conn.execute(sql.SQL("grant create on database {} to {}").format(
            sql.Identifier(empty_db.name), sql.Identifier(login)))
    refused = empty_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix,
                           user=login)
    assert refused.returncode == 6, refused.stdout + refused.stderr
    assert f"login '{login}' cannot act as '{roles.owner}': it is NOINHERIT" in refused.stderr
    assert f"ALTER ROLE {login} INHERIT" in refused.stderr, refused.stderr
    with empty_db.connect() as conn:
        assert conn.execute("select count(*) from pg_roles where rolname like %s",
                            [role_prefix + "%"]).fetchone()[0] == 0
        assert conn.execute("select to_regnamespace('awa')").fetchone()[0] is None

    # The roles made by someone else, the login holding ADMIN on the owner.
    with empty_db.cluster.admin() as conn:
        for name in roles.as_dict().values():
            conn.execute(sql.SQL("create role {} nologin").format(sql.Identifier(name)))
        conn.execute(sql.SQL("grant {} to {} with admin true, inherit false, set false")
                     .format(sql.Identifier(roles.owner), sql.Identifier(login)))
    again = empty_db.awa("migrate", "--role-prefix", role_prefix, user=login)
    assert again.returncode == 6, again.stdout + again.stderr
    assert f"GRANT {roles.owner} TO {login} WITH INHERIT TRUE, SET TRUE, or ALTER ROLE " \
        f"{login} INHERIT. It is NOINHERIT" in again.stderr, again.stderr
    with empty_db.connect() as conn:
        assert conn.execute("select to_regnamespace('awa')").fetchone()[0] is None
        conn.execute(sql.SQL("grant {} to {} with inherit true, set true").format(
            sql.Identifier(roles.owner), sql.Identifier(login)))
    done = empty_db.awa("migrate", "--role-prefix", role_prefix, user=login)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("cap", ["operator", "producer"])
def test_an_applications_login_is_refused_as_a_stranger_is(db, logins, cap):
    """Not 7 and "permission denied for table schema_migrations": the
    refusal (6) with the grant that works, and nothing of awa's read."""
    login = getattr(logins, cap)
    with db.connect() as conn:
        conn.execute("delete from awa.schema_functions")
        records = _records(conn)
    for args, stream in ((("migrate",), "stderr"), (("status", "--check"), "stdout")):
        result = db.awa(*args, user=login)
        assert result.returncode == 6, result.stdout + result.stderr
        assert f"login '{login}' cannot act as 'awa_owner': GRANT awa_owner TO {login}" \
            f" WITH INHERIT TRUE, SET TRUE." in getattr(result, stream), result
        assert "42501" not in result.stderr
    with db.connect() as conn:
        assert _records(conn) == records


def _psql(dsn: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn],
        input=script, capture_output=True, text=True, check=False, timeout=120,
    )


def test_a_script_rendered_before_a_newer_runner_migrated_takes_nothing_back(db):
    """A layer-only script of an earlier package (0.0.9) run with psql after
    this package migrated the database: the runner of 0.0.9 refuses (exit
    4); the script stops at its guard, applying nothing."""
    with db.connect() as conn:
        conn.execute("update awa.schema_functions set contract_version = '0.0.9'")
        conn.execute("revoke usage on schema awa from awa_reader")  # what 0.0.9 repairs
        conn.execute("set search_path = pg_catalog, pg_temp")
        plan = migrate.build_plan(migrate.read_state(conn, Roles()), Roles(),
                                  package_version="0.0.9")
        conn.execute("reset search_path")
    assert [s.kind for s in plan.steps] == ["layer"]
    script = migrate.render_sql(plan)
    db.awa("migrate", check=True)
    with db.connect() as conn:
        before = snapshot(conn), _records(conn)
    ran = _psql(db.dsn(), script)
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert "this script was rendered for another state of the database" in ran.stderr
    assert f"function layer contract {__version__}; the script expects " in ran.stderr, \
        ran.stderr
    with db.connect() as conn:
        assert (snapshot(conn), _records(conn)) == before
        assert conn.execute("select awa.contract_version()").fetchone()[0] == __version__


def test_a_script_checks_each_step_against_the_steps_before_it(empty_db, role_prefix):
    """An install script's guards expect what its own earlier steps applied:
    it runs through, and a second run stops at its first step."""
    script = empty_db.awa("migrate", "--sql", "--offline", "--create-roles", "--role-prefix",
                          role_prefix, check=True).stdout
    assert script.count("$guard$;") == len(MIGRATIONS) + 3  # roles, bootstrap, layer
    first = _psql(empty_db.dsn(), script)
    assert first.returncode == 0, first.stderr
    second = _psql(empty_db.dsn(), script)
    assert second.returncode == 3
    assert "expects none, none" in second.stderr, second.stderr


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--lock-wait", "2 minutes", "invalid duration '2 minutes'"),
    ("--lock-timeout", "abc", "invalid duration 'abc'"),
    ("--lock-timeout", "30d", "duration '30d' is out of range"),
    ("--lock-wait", "-1s", "invalid duration '-1s'"),
    # PostgreSQL rounds these to 0, which is no limit at all.
    ("--lock-timeout", "500us", "duration '500us' is 0.5ms or less"),
    ("--lock-wait", "0.4ms", "duration '0.4ms' is 0.5ms or less"),
])
def test_a_bad_lock_duration_is_bad_input(option, value, says):
    """Exit 2 naming the value and the range, before connecting (was 7 from
    the server, or a --sql script carrying it)."""
    with refusing_port() as port:
        env = {**os.environ, "AWA_DATABASE_URL": f"host=127.0.0.1 port={port} dbname=x"}
        for args in (["migrate"], ["migrate", "--sql", "--offline", "--create-roles"]):
            result = subprocess.run([sys.executable, "-m", "awa_sql", *args, option, value],
                                    env=env, capture_output=True, text=True, timeout=60,
                                    check=False)
            assert result.returncode == 2, result.stdout + result.stderr
            assert f"argument {option}: {says}" in result.stderr, result.stderr
            assert "0 to 2147483647ms" in result.stderr
            assert result.stdout == ""


@pytest.mark.parametrize("value", ["5s", "5 s", "500", "1.5min", "0", "1000us", "0ms", "700us"])
def test_a_lock_duration_postgresql_reads_is_accepted(value):
    result = subprocess.run(
        [sys.executable, "-m", "awa_sql", "migrate", "--sql", "--offline", "--create-roles",
         "--lock-timeout", value, "--lock-wait", value],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert f"set local lock_timeout = '{value}';" in result.stdout


LOCK_TABLE = re.compile(r"^\| (\d{4}_\w+) \| (.*) \|$", re.M)


def _documented_locks() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "migrations.md").read_text()
    return {label: set(re.findall(r"`(awa\.\w+)`", tables))
            for label, tables in LOCK_TABLE.findall(text)}


def test_the_docs_name_every_migration_that_locks_a_table_and_the_tables(empty_db):
    """Each migration applied alone, in order: the tables of schema awa that
    existed before it (a partition counted as its parent) on which it holds
    ACCESS EXCLUSIVE at its commit are those docs/migrations.md's table
    names for it, and a migration that holds none is not listed."""
    roles = Roles()
    found: dict[str, set[str]] = {}
    with empty_db.connect() as conn:
        conn.execute("set search_path = pg_catalog, pg_temp")
        first = migrate.build_plan(migrate.read_state(conn, roles), roles, create_roles=True,
                                   migrations=MIGRATIONS[:1], layer=LAYER[:1])
        migrate.apply_plan(conn, first, "5s", lambda _line: None)
        for migration in MIGRATIONS[1:]:
            step = migrate._migration_step(migration, roles, __version__)
            assert step.transactional, migration.label  # else: lock it some other way
            with conn.transaction():
                before = [oid for (oid,) in conn.execute(
                    "select oid from pg_class where relnamespace = 'awa'::regnamespace")]
                conn.execute(step.sql)
                locked = {name for (name,) in conn.execute(
                    "select distinct 'awa.' || coalesce(p.relname, c.relname)"
                    "  from pg_locks l join pg_class c on c.oid = l.relation"
                    "  left join pg_inherits i on i.inhrelid = c.oid"
                    "  left join pg_class p on p.oid = i.inhparent"
                    " where l.pid = pg_backend_pid() and l.mode = 'AccessExclusiveLock'"
                    "   and c.relkind in ('r', 'p') and c.oid = any(%s)", [before])}
            if locked:
                found[migration.label] = locked
    assert _documented_locks() == found
