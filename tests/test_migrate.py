"""The migration runner against real PostgreSQL 17 and 18, through the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg import sql

from awa_sql import __version__
from awa_sql.migrate import MIGRATION_LOCK
from awa_sql.source import load_layer, load_migrations
from tests.support.catalog import snapshot
from tests.support.database import Database
from tests.support.ports import refusing_port

MIGRATIONS = load_migrations()
LAYER = load_layer()


def _records(conn: psycopg.Connection) -> tuple[list, list]:
    migrations = conn.execute(
        "select version, name, checksum, checksum_algorithm, contract_version, applied_at,"
        " applied_by, xmin::text from awa.schema_migrations order by version").fetchall()
    functions = conn.execute(
        "select file, checksum, applied_at, xmin::text from awa.schema_functions order by file"
    ).fetchall()
    return migrations, functions


def test_role_names_that_are_not_plain_identifiers_install(empty_db, role_prefix):
    """A role name with capitals, a space or a dot, the owner's included, is
    a name, not SQL to parse (AwaOwner was read as awaowner: the install
    failed after its migrations had committed, and every retry again)."""
    odd = f"Awa {role_prefix[:-1]}.x_"
    empty_db.awa("migrate", "--create-roles", "--role-prefix", odd, check=True)
    assert empty_db.awa("status", "--check", "--role-prefix", odd).returncode == 0
    with empty_db.connect() as conn:
        assert conn.execute("select r.rolname from pg_namespace n join pg_roles r"
                            " on r.oid = n.nspowner where n.nspname = 'awa'"
                            ).fetchone()[0] == f"{odd}owner"


def test_apply_on_empty_database(empty_db, role_prefix):
    result = empty_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix, check=True)
    assert f"applied migration {MIGRATIONS[0].label}" in result.stdout
    with empty_db.connect() as conn:
        migrations, functions = _records(conn)
        assert [(m[0], m[1], m[2], m[3], m[4]) for m in migrations] == [
            (m.version, m.name, m.checksum, "sha256", __version__) for m in MIGRATIONS
        ]
        assert all(m[6] == "postgres" for m in migrations)
        assert [f[:2] for f in functions] == sorted((f.name, f.checksum) for f in LAYER)
        assert conn.execute("select awa.contract_version()").fetchone()[0] == __version__
        owner = conn.execute(
            "select pg_catalog.pg_get_userbyid(nspowner) from pg_namespace where nspname='awa'"
        ).fetchone()[0]
        assert owner == f"{role_prefix}owner"
        check = conn.execute(
            "select pg_catalog.pg_get_constraintdef(oid) from pg_constraint"
            " where conname = 'queue_meta_enqueue_shards_range'").fetchone()
        assert check is not None and "64" in check[0]


def test_rerun_is_a_no_op(db):
    with db.connect() as conn:
        before_records = _records(conn)
        before_catalog = snapshot(conn)
    result = db.awa("migrate", check=True)
    assert "database is up to date" in result.stdout
    assert "applied" not in result.stdout
    with db.connect() as conn:
        assert _records(conn) == before_records  # same rows, same xmin: not even rewritten
        assert snapshot(conn) == before_catalog


def test_four_concurrent_runners_converge_on_a_fresh_install(cluster, empty_db, role_prefix):
    """One runner applies every migration, the others find the database up to
    date, and the result equals a runner's alone. A run does everything under
    one lock, so more runners only queue longer behind it: that they queue
    rather than fail is test_runners_queue_behind_each_other_not_fail's."""
    def run(_):
        return empty_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(4)))
    assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]
    assert sum("applied migration" in r.stdout for r in results) == 1
    with empty_db.connect() as conn:
        versions = [v for (v,) in conn.execute("select version from awa.schema_migrations")]
        assert sorted(versions) == [m.version for m in MIGRATIONS]
        assert conn.execute("select count(*) from awa.schema_functions").fetchone()[0] == len(
            LAYER)
        concurrent = snapshot(conn)
    fresh = Database(cluster, cluster.create_database())
    try:
        fresh.awa("migrate", "--role-prefix", role_prefix, check=True)
        with fresh.connect() as conn:
            assert snapshot(conn) == concurrent
    finally:
        cluster.drop_database(fresh.name)


def test_drift_is_refused_with_exit_3_and_nothing_applied(db):
    with db.connect() as conn:
        conn.execute("update awa.schema_migrations set checksum = repeat('0', 64)"
                     " where version = 1")
        conn.execute("delete from awa.schema_functions")  # pending work that must not run
    result = db.awa("migrate")
    assert result.returncode == 3
    assert f"{MIGRATIONS[0].label}.sql" in result.stderr
    assert "sha256:" + "0" * 64 in result.stderr
    assert f"sha256:{MIGRATIONS[0].checksum}" in result.stderr
    with db.connect() as conn:
        assert conn.execute("select count(*) from awa.schema_functions").fetchone()[0] == 0
    status = db.awa("status", "--check")
    assert status.returncode == 3
    assert "drifted:" in status.stdout


@pytest.mark.parametrize("older, newer", [
    ("0.1.0.dev4", "0.1.0a1"), ("0.1.0a1", "0.1.0b2"), ("0.1.0b2", "0.1.0rc1"),
    ("0.1.0rc1", "0.1.0"), ("0.1.0-rc.1", "0.1.0"), ("0.1.0", "0.1.0.post1"),
    ("0.1.0rc1", "0.1.0rc2"), ("0.9.9", "0.10.0"), ("0.1.0", "0.1.1.dev1"),
])
def test_versions_order_as_pep_440_does(older, newer):
    """A release candidate comes before its release: a database installed
    by 0.1.0rc1 is not refused as newer by 0.1.0 (it was: digits only)."""
    from awa_sql.migrate import version_tuple

    assert version_tuple(older) < version_tuple(newer)
    assert version_tuple("0.1") == version_tuple("0.1.0")


def test_newer_database_is_refused_naming_both_versions(db):
    with db.connect() as conn:
        conn.execute(
            "insert into awa.schema_migrations (version, name, checksum, checksum_algorithm,"
            " contract_version, execution_ms) values (9999, 'from_the_future', 'x', 'sha256',"
            " '99.1.0', 1)")
    result = db.awa("migrate")
    assert result.returncode == 4
    assert "99.1.0" in result.stderr and __version__ in result.stderr
    assert "9999_from_the_future" in result.stderr
    assert db.awa("status", "--check").returncode == 4


def test_newer_function_layer_is_refused(db):
    with db.connect() as conn:
        conn.execute("update awa.schema_functions set contract_version = '42.0.0'")
    result = db.awa("migrate")
    assert result.returncode == 4
    assert "42.0.0" in result.stderr and __version__ in result.stderr


def test_dry_run_changes_nothing(empty_db, role_prefix):
    result = empty_db.awa("migrate", "--dry-run", "--create-roles", "--role-prefix", role_prefix,
                          check=True)
    assert f"migration {MIGRATIONS[0].label}" in result.stdout
    assert "nothing changed" in result.stdout
    with empty_db.connect() as conn:
        assert conn.execute(
            "select count(*) from pg_namespace where nspname = 'awa'").fetchone()[0] == 0
        assert conn.execute(
            "select count(*) from pg_roles where rolname like %s",
            [role_prefix + "%"]).fetchone()[0] == 0


def _psql(dsn: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn],
        input=script, capture_output=True, text=True, check=False, timeout=120,
    )


@pytest.mark.parametrize("offline", [False, True], ids=["planned", "offline"])
def test_sql_script_applied_with_psql_equals_the_runner(cluster, empty_db, role_prefix, offline):
    extra = ["--offline"] if offline else []
    script = empty_db.awa("migrate", "--sql", "--create-roles", "--role-prefix", role_prefix,
                          *extra, check=True).stdout
    assert "begin;" in script and "commit;" in script
    with empty_db.connect() as conn:  # printing the script changed nothing
        assert conn.execute(
            "select count(*) from pg_namespace where nspname = 'awa'").fetchone()[0] == 0
    applied = _psql(empty_db.dsn(), script)
    assert applied.returncode == 0, applied.stderr

    other = cluster.create_database()
    try:
        runner_db = Database(cluster, other)
        runner_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix, check=True)
        with empty_db.connect() as a, runner_db.connect() as b:
            assert snapshot(a) == snapshot(b)
            assert _records(a)[0][0][:5] == _records(b)[0][0][:5]
        # The database the script built is up to date for the runner too.
        assert "up to date" in empty_db.awa(
            "migrate", "--role-prefix", role_prefix, check=True).stdout
    finally:
        cluster.drop_database(other)


def test_sql_script_refuses_to_run_twice(empty_db, role_prefix):
    script = empty_db.awa("migrate", "--sql", "--create-roles", "--role-prefix", role_prefix,
                          "--offline", check=True).stdout
    assert _psql(empty_db.dsn(), script).returncode == 0
    with empty_db.connect() as conn:
        before = snapshot(conn)
    again = _psql(empty_db.dsn(), script)
    assert again.returncode != 0
    with empty_db.connect() as conn:
        assert snapshot(conn) == before


def test_lock_timeout_leaves_nothing_partial_and_a_retry_succeeds(db):
    with db.connect() as conn:
        conn.execute("drop function awa.contract_version()")
        conn.execute("delete from awa.schema_functions")
    blocker = db.connect(autocommit=False)
    try:
        # Readers pass, writers wait: the runner plans, then blocks inside its step.
        blocker.execute("lock table awa.schema_functions in exclusive mode")
        result = db.awa("migrate", "--lock-timeout", "300ms")
        assert result.returncode == 5, result.stderr
        assert "could not get a lock within 300ms" in result.stderr
        assert "nothing of this step was applied" in result.stderr
    finally:
        blocker.rollback()
        blocker.close()
    with db.connect() as conn:
        gone = conn.execute("select to_regprocedure('awa.contract_version()')").fetchone()[0]
        assert gone is None
        assert conn.execute("select count(*) from awa.schema_functions").fetchone()[0] == 0
    db.awa("migrate", check=True)
    with db.connect() as conn:
        assert conn.execute("select awa.contract_version()").fetchone()[0] == __version__


def test_waiting_for_another_runner_times_out_clearly(db):
    with db.connect() as holder:
        holder.execute("select pg_advisory_lock(%s, %s)", MIGRATION_LOCK)
        result = db.awa("migrate", "--lock-wait", "200ms")
    assert result.returncode == 5
    assert "another awa migrate is running" in result.stderr


def test_install_as_nosuperuser_with_createrole(cluster, role_prefix):
    migrator = f"{role_prefix}migrator"
    with cluster.admin() as conn:
        conn.execute(sql.SQL("create role {} login createrole nosuperuser password 'x'").format(
            sql.Identifier(migrator)))
    name = cluster.create_database(owner=migrator)
    try:
        database = Database(cluster, name)
        with database.connect(user=migrator) as conn:
            assert conn.execute("select rolsuper from pg_roles where rolname = current_user"
                                ).fetchone()[0] is False
        database.awa("migrate", "--create-roles", "--role-prefix", role_prefix,
                     user=migrator, check=True)
        with database.connect() as conn:
            row = conn.execute(
                "select rolcanlogin, rolsuper, rolcreaterole, rolbypassrls, rolcreatedb"
                " from pg_roles where rolname = %s", [f"{role_prefix}owner"]).fetchone()
            assert row == (False, False, False, False, False)
            assert conn.execute("select count(*) from awa.schema_migrations").fetchone()[0] == len(
                MIGRATIONS)
        assert "up to date" in database.awa("migrate", "--role-prefix", role_prefix,
                                            user=migrator, check=True).stdout
    finally:
        cluster.drop_database(name)


def test_a_createrole_login_without_create_on_the_database_is_refused_before_any_step(
        cluster, empty_db, role_prefix):
    """The roles step would commit and the schema's creation fail after it,
    leaving six roles behind (and again on every retry)."""
    migrator = f"{role_prefix}migrator"
    with cluster.admin() as conn:
        conn.execute(sql.SQL("create role {} login createrole nosuperuser password 'x'").format(
            sql.Identifier(migrator)))
    result = empty_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix,
                          user=migrator)
    assert result.returncode == 6, result.stdout + result.stderr
    assert f"login '{migrator}' may not create schema awa: neither it nor" in result.stderr
    with cluster.admin() as conn:
        assert conn.execute("select count(*) from pg_roles where rolname like %s",
                            [f"{role_prefix}%"]).fetchone()[0] == 1  # the migrator alone
        # The owner role's CREATE will do: the bootstrap makes the login inherit it.
        for cap in ("owner", "producer", "worker", "maintenance", "operator", "reader"):
            conn.execute(sql.SQL("create role {}").format(sql.Identifier(f"{role_prefix}{cap}")))
            conn.execute(sql.SQL("grant {} to {} with admin option, inherit false, set false"
                                 ).format(sql.Identifier(f"{role_prefix}{cap}"),
                                          sql.Identifier(migrator)))
        conn.execute(sql.SQL("grant create on database {} to {}").format(
            sql.Identifier(empty_db.name), sql.Identifier(f"{role_prefix}owner")))
    empty_db.awa("migrate", "--role-prefix", role_prefix, user=migrator, check=True)


def test_install_as_database_owner_pointed_at_existing_roles(cluster, role_prefix):
    owner_login = f"{role_prefix}dbowner"
    with cluster.admin() as conn:
        conn.execute(sql.SQL("create role {} login nocreaterole password 'x'").format(
            sql.Identifier(owner_login)))
        for cap in ("owner", "producer", "worker", "maintenance", "operator", "reader"):
            conn.execute(sql.SQL("create role {}").format(sql.Identifier(f"{role_prefix}{cap}")))
        conn.execute(sql.SQL("grant {} to {}").format(
            sql.Identifier(f"{role_prefix}owner"), sql.Identifier(owner_login)))
    name = cluster.create_database(owner=owner_login)
    try:
        database = Database(cluster, name)
        database.awa("migrate", "--role-prefix", role_prefix, user=owner_login, check=True)
        with database.connect() as conn:
            assert conn.execute("select awa.contract_version()").fetchone()[0] == __version__
    finally:
        cluster.drop_database(name)


def test_missing_roles_are_named_without_create_roles(empty_db, role_prefix):
    result = empty_db.awa("migrate", "--role-prefix", role_prefix)
    assert result.returncode == 6
    assert f"{role_prefix}owner" in result.stderr and f"{role_prefix}reader" in result.stderr
    assert "--create-roles" in result.stderr


def test_other_role_names_than_the_bound_ones_are_refused(db, role_prefix):
    with db.connect() as conn:
        for cap in ("owner", "producer", "worker", "maintenance", "operator", "reader"):
            conn.execute(sql.SQL("create role {}").format(sql.Identifier(f"{role_prefix}{cap}")))
    result = db.awa("migrate", "--role-prefix", role_prefix)
    assert result.returncode == 6
    assert "bound to other role names" in result.stderr
    with db.connect() as conn:
        bound = dict(conn.execute("select capability, role_name from awa.role_binding"
                                  ).fetchall())
    # It names the options that would pass: the bound names' prefix.
    assert f"Pass the same names: --role-prefix {bound['owner'][:-len('owner')]}." \
        in result.stderr, result.stderr


def test_schema_owned_by_someone_else_is_refused(empty_db, role_prefix):
    with empty_db.connect() as conn:
        conn.execute("create schema awa")  # owned by the superuser, not the owner role
    result = empty_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix)
    assert result.returncode == 6
    assert "owned by 'postgres'" in result.stderr


def test_public_create_on_public_schema_warns_but_installs(empty_db, role_prefix):
    with empty_db.connect() as conn:
        conn.execute("grant create on schema public to public")
    result = empty_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix, check=True)
    assert "warning: schema public still grants CREATE to PUBLIC" in result.stdout


@pytest.mark.one_version
def test_status_reports_pending_and_json(db):
    clean = db.awa("status", "--check", check=True)
    assert "pending: none" in clean.stdout
    with db.connect() as conn:
        conn.execute("delete from awa.schema_functions where file = 'private.sql'")
    gate = db.awa("status", "--check")
    assert gate.returncode == 1
    doc = json.loads(db.awa("status", "--json", check=True).stdout)
    assert doc["up_to_date"] is False
    assert doc["function_layer_changes"] == ["private.sql (new)"]
    assert [a["version"] for a in doc["applied"]] == [m.version for m in MIGRATIONS]
    assert doc["pending"] == [] and doc["drifted"] == []
    assert doc["roles"]["producer"]["name"] == "awa_producer"
    db.awa("migrate", check=True)
    assert db.awa("status", "--check").returncode == 0


@pytest.mark.one_version
def test_status_of_an_empty_database_says_the_function_layer_is_not_installed(
        empty_db, role_prefix):
    """Nothing installed and no roles: the missing roles stop the plan, which
    left no layer change to list, and status said "function layer: up to date"."""
    status = empty_db.awa("status", "--role-prefix", role_prefix, check=True).stdout
    assert "database contract not installed" in status
    assert "function layer: not installed" in status
    assert "up to date" not in status
    assert f"problem: missing roles: {role_prefix}owner" in status
    doc = json.loads(empty_db.awa("status", "--json", "--role-prefix", role_prefix,
                                  check=True).stdout)
    assert doc["function_layer_installed"] is False
    assert doc["function_layer_changes"] == [f"{f.name} (new)" for f in LAYER]
    empty_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix, check=True)
    installed = empty_db.awa("status", "--role-prefix", role_prefix, check=True).stdout
    assert "function layer: up to date" in installed
    assert json.loads(empty_db.awa("status", "--json", "--role-prefix", role_prefix,
                                   check=True).stdout)["function_layer_installed"] is True


def test_status_lists_layer_changes_when_a_problem_stops_the_plan(db):
    """A drifted migration is a problem that stops the plan; the layer that
    differs from the files is still reported, not "up to date"."""
    with db.connect() as conn:
        conn.execute("delete from awa.schema_functions where file = 'private.sql'")
        conn.execute("update awa.schema_migrations set checksum = repeat('0', 64)"
                     " where version = 1")
    status = db.awa("status").stdout
    assert "function layer: private.sql (new)" in status
    assert "problem: migration 0001_" in status


@pytest.mark.one_version
def test_status_check_gives_each_outcome_its_own_exit_code(db):
    """The deploy gate: 0 up to date, 1 pending, 3 drift, 4 newer, 6 a login that
    cannot act as the owner role, 7 could not ask."""
    def gate(**kw) -> subprocess.CompletedProcess[str]:
        return db.awa("status", "--check", **kw)

    codes = {"up to date": gate().returncode}
    with db.connect() as conn:
        conn.execute("delete from awa.schema_functions where file = 'private.sql'")
        codes["pending"] = gate().returncode
        db.awa("migrate", check=True)
        conn.execute("update awa.schema_migrations set checksum = repeat('0', 64)"
                     " where version = 1")
        codes["drift"] = gate().returncode
        conn.execute("update awa.schema_migrations set checksum = %s where version = 1",
                     [MIGRATIONS[0].checksum])
        conn.execute(
            "insert into awa.schema_migrations (version, name, checksum, checksum_algorithm,"
            " contract_version, execution_ms) values (9999, 'from_the_future', 'x', 'sha256',"
            " '99.1.0', 1)")
        codes["newer"] = gate().returncode
        conn.execute("delete from awa.schema_migrations where version = 9999")
    assert gate().returncode == 0  # back where it started: each code came from its cause

    with refusing_port() as port:
        nobody_listens = f"host=127.0.0.1 port={port} dbname={db.name} connect_timeout=5"
        refused = gate(env={"AWA_DATABASE_URL": nobody_listens})
    codes["connection failure"] = refused.returncode
    assert "cannot connect" in refused.stderr
    app = db.login_role("awa_producer")  # an application's login: refused, not denied
    denied = gate(user=app)
    codes["application login"] = denied.returncode
    assert f"login '{app}' cannot act as 'awa_owner'" in denied.stdout, denied
    assert "run it as the login that migrates: an application's login" in denied.stdout
    stranger = db.login_role()  # no awa role at all: not even the schema's usage
    nobody = gate(user=stranger)
    codes["no role"] = nobody.returncode
    assert f"login '{stranger}' cannot act as 'awa_owner': GRANT awa_owner TO" \
        in nobody.stdout + nobody.stderr, nobody
    assert codes == {"up to date": 0, "pending": 1, "drift": 3, "newer": 4,
                     "connection failure": 7, "application login": 6, "no role": 6}


def test_a_login_that_does_not_inherit_the_owner_is_refused_before_any_step(db):
    """A NOINHERIT login granted the owner role can SET ROLE to it but not
    read schema awa as itself: it would install and then fail every later
    run on the reads of what is applied. Refused first (exit 6), saying
    what grant works; `awa status` says the same."""
    login = db.login_role("awa_owner", extra="noinherit")
    with db.connect() as conn:
        before = conn.execute("select count(*) from awa.schema_migrations").fetchone()[0]
        conn.execute("delete from awa.schema_functions")  # the layer would be applied again
    result = db.awa("migrate", user=login)
    assert result.returncode == 6, result
    assert f"login '{login}' cannot act as 'awa_owner': GRANT awa_owner TO {login} WITH" \
        " INHERIT TRUE, SET TRUE" in result.stderr, result.stderr
    with db.connect() as conn:
        assert conn.execute("select count(*) from awa.schema_migrations").fetchone()[0] == before
        assert conn.execute("select count(*) from awa.schema_functions").fetchone()[0] == 0


def test_security_check_rolls_back_a_layer_that_breaks_it(db):
    """awa._assert_security() is the last statement of every layer step. A
    routine no layer defines is dropped by the layer, unless something
    depends on it (here a view): that one is left, and checked."""
    with db.connect() as conn:
        conn.execute("set role awa_owner")
        conn.execute("create function awa.unpinned() returns int language sql security definer"
                     " as 'select 1'")
        conn.execute("create view awa.uses_unpinned as select awa.unpinned() as one")
        conn.execute("reset role")
        conn.execute("delete from awa.schema_functions")
    result = db.awa("migrate")
    assert result.returncode == 7
    assert "AW001" in result.stderr or "pinned search_path" in result.stderr
    assert "awa.unpinned()" in result.stderr
    with db.connect() as conn:
        assert conn.execute("select count(*) from awa.schema_functions").fetchone()[0] == 0


def test_runners_queue_behind_each_other_not_fail(db):
    """A runner that finds the lock held waits for it (within --lock-wait)."""
    holder = db.connect()
    holder.execute("select pg_advisory_lock(%s, %s)", MIGRATION_LOCK)
    proc = subprocess.Popen(
        [sys.executable, "-m", "awa_sql", "migrate", "--dsn", db.dsn(), "--lock-wait", "60s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    waiting = threading.Event()
    with db.connect() as watcher:
        for _ in range(600):
            row = watcher.execute(
                "select count(*) from pg_locks where locktype = 'advisory' and not granted"
                " and classid = %s and objid = %s"
                " and database = (select oid from pg_database where datname = current_database())",
                MIGRATION_LOCK).fetchone()
            if row[0]:
                waiting.set()
                break
            watcher.execute("select pg_sleep(0.05)")
    assert waiting.is_set(), "the second runner never queued on the lock"
    holder.execute("select pg_advisory_unlock(%s, %s)", MIGRATION_LOCK)
    holder.close()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "up to date" in out


def test_fresh_install_equals_an_upgrade(cluster, empty_db, role_prefix):
    """Install the first migration alone (an older release), upgrade to this
    one, and compare with a fresh install; then DROP and CREATE a function the
    way a later layer may, and add routines an earlier layer had and this one
    does not: the re-applied layer restores the ACL and drops those."""
    from awa_sql import migrate
    from awa_sql.roles import Roles

    roles = Roles.with_prefix(role_prefix)
    with empty_db.connect() as conn:
        conn.execute("set search_path = pg_catalog, pg_temp")
        old = migrate.build_plan(migrate.read_state(conn, roles), roles, create_roles=True,
                                 migrations=MIGRATIONS[:1], layer=LAYER[:1],
                                 package_version="0.0.1")
        migrate.apply_plan(conn, old, "5s", lambda _line: None)
        assert conn.execute("select count(*) from awa.schema_migrations").fetchone()[0] == 1
    upgrade = empty_db.awa("migrate", "--role-prefix", role_prefix, check=True)
    assert "migration 0002" in upgrade.stdout
    fresh = Database(cluster, cluster.create_database())
    try:
        fresh.awa("migrate", "--role-prefix", role_prefix, check=True)
        with empty_db.connect() as a, fresh.connect() as b:
            assert snapshot(a) == snapshot(b)
            a.execute(sql.SQL("set role {}").format(sql.Identifier(f"{role_prefix}owner")))
            a.execute("drop function awa.enqueue_shards(text)")
            a.execute("create function awa.enqueue_shards(queue text) returns smallint"
                      " language sql security definer set search_path = pg_catalog, pg_temp"
                      " as 'select 1::smallint'")
            # An earlier layer's overload of a helper whose arguments
            # changed since (a one-argument call of it became ambiguous),
            # and a helper no layer defines any more.
            a.execute("create function awa._lock_queue(queue text) returns awa.queue_meta"
                      " language sql set search_path = pg_catalog, pg_temp"
                      " as 'select null::awa.queue_meta'")
            a.execute("create function awa._gone_helper(n integer) returns integer"
                      " language sql immutable as 'select n'")
            # One granted to a runtime role: the layer's revokes rewrite its
            # catalog row, which must not pass for the layer's own.
            a.execute("create function awa._gone_granted(n integer) returns integer"
                      " language sql immutable as 'select n'")
            a.execute("select awa._grant_execute('awa._gone_granted(integer)', 'worker')")
            a.execute("reset role")
            a.execute("delete from awa.schema_functions")
        again = empty_db.awa("migrate", "--role-prefix", role_prefix, check=True)
        for routine in ("awa._lock_queue(text)", "awa._gone_helper(integer)",
                        "awa._gone_granted(integer)"):
            assert f"warning: dropped {routine}, an earlier function layer's routine" \
                in again.stdout, again.stdout
        with empty_db.connect() as a, fresh.connect() as b:
            assert snapshot(a) == snapshot(b)
    finally:
        cluster.drop_database(fresh.name)


def test_lane_shards_backfill_gives_the_shards_lanes_span(db):
    """Migration 0019's backfill: every queue's lane_shards is the number of
    shards its lanes span, lanes of a lowered S included, as
    awa._provision_lanes keeps it from then on."""
    from awa_sql.source import load_migrations

    (migration,) = [m for m in load_migrations() if m.version == 19]
    backfill = next(s for s in migration.text.split(";\n") if "set lane_shards" in s)
    with db.connect() as conn:
        conn.execute("select awa.set_enqueue_shards('ls-one', 1)")
        conn.execute("select awa.set_enqueue_shards('ls-low', 8)")
        conn.execute("select awa.set_enqueue_shards('ls-low', 2)")
        conn.execute("select awa.set_queue_partitions('ls-parts', 3)")
        conn.execute("select awa.set_enqueue_shards('ls-parts', 5)")
        spans = "select queue, lane_shards from awa.queue_meta order by queue"
        kept = conn.execute(spans).fetchall()
        truth = conn.execute(
            "select m.queue, (select count(distinct l.shard) from awa.lanes l"
            " where l.queue_id = m.queue_id)::smallint from awa.queue_meta m order by m.queue"
        ).fetchall()
        assert kept == truth and ("ls-low", 8) in kept
        with conn.transaction(force_rollback=True):
            conn.execute("update awa.queue_meta set lane_shards = 0")
            conn.execute(backfill)
            assert conn.execute(spans).fetchall() == kept


def test_lanes_an_earlier_layer_made_are_walked(db, logins):
    """A raise of S by the function layer before migration 0019 (which did
    not count lanes) while an upgrade runs: the claim still walks every
    shard below S, the next provisioning call counts the lanes again, and
    so does the next layer apply."""
    with db.connect() as conn:
        conn.execute("select awa.set_enqueue_shards('ls-up', 8)")
        conn.execute("select awa.enqueue_batch(array_fill('ls-up'::text, array[64]),"
                     " array_fill('j'::text, array[64]), ordering_keys =>"
                     " array(select convert_to('k' || i, 'UTF8') from generate_series(1, 64) i))")
        # What the earlier layer left: the lanes, uncounted.
        conn.execute("update awa.queue_meta set lane_shards = 1 where queue = 'ls-up'")
        with conn.transaction(force_rollback=True):
            assert conn.execute("select count(*) from awa.claim(array['ls-up'], 100, 'w')"
                                ).fetchone()[0] == 64
        conn.execute("select awa.set_enqueue_shards('ls-up', 2)")
        assert conn.execute("select lane_shards from awa.queue_meta where queue = 'ls-up'"
                            ).fetchone()[0] == 8
        conn.execute("update awa.queue_meta set lane_shards = 1 where queue = 'ls-up'")
        conn.execute("delete from awa.schema_functions")  # the layer is applied again
    db.awa("migrate", check=True)
    with db.connect() as conn:
        assert conn.execute("select lane_shards from awa.queue_meta where queue = 'ls-up'"
                            ).fetchone()[0] == 8


def test_a_queue_from_before_migration_0035_gets_its_retried_counter_at_the_layer(db):
    """After migration 0035 a queue has no retried counter until the layer
    gives it one, starting at 0, its terminal counters kept as they were."""
    with db.connect() as conn:
        conn.execute("select awa.enqueue('rc-old', 'j', max_attempts => 2)")
        conn.execute("select awa.enqueue('rc-old', 'j', max_attempts => 2)")
        conn.execute("select count(awa.complete(c.job_id, c.run_lease))"
                     " from awa.claim(array['rc-old'], 1, 'w') c")
        seq = conn.execute("update awa.queue_meta set retried_seq = null where queue = 'rc-old'"
                           " returning (select retried_seq from awa.queue_meta"
                           " where queue = 'rc-old')").fetchone()[0]
        conn.execute(f"drop sequence {seq}")
        conn.execute("delete from awa.schema_functions")  # the layer is applied again
    db.awa("migrate", check=True)
    overview = "select completed, retried from awa.queue_overview where queue = 'rc-old'"
    with db.connect() as conn:
        assert conn.execute(overview).fetchone() == (1, 0)
        conn.execute("select awa.fail(c.job_id, c.run_lease, 'boom')"
                     " from awa.claim(array['rc-old'], 1, 'w') c")
        assert conn.execute(overview).fetchone() == (1, 1)


# What the claim of a layer before migration 0024 inserted: no slot named.
EARLIER_CLAIM = """
    with moved as (
        delete from awa.ready as r where r.job_id = (select min(job_id) from awa.ready)
        returning r.*
    )
    insert into awa.running (job_id, run_lease, lane_id, lane_seq, queue_id, priority, kind,
                             args, ordering_key, attempt, max_attempts, enqueued_at, worker,
                             lease_expires_at, completed_seq, max_run_time, unique_jobs)
    select m.job_id, nextval('awa.run_lease_seq'), m.lane_id, m.lane_seq, m.queue_id,
           m.priority, m.kind, m.args, m.ordering_key, m.attempt + 1, m.max_attempts,
           m.enqueued_at, 'earlier', now() + interval '5 minutes', q.completed_seq,
           m.max_run_time, false
      from moved as m join awa.queue_meta as q using (queue_id)
    returning job_id, run_lease
"""


def test_running_jobs_stay_through_migration_0024_and_end_from_slot_2(empty_db, role_prefix):
    """awa.running becomes slot 2 of the partitioned table: the jobs running
    at the upgrade stay where they are, and a claim that names no slot (the
    earlier layer's) lands there too; the new layer completes and fails them,
    and its awa._finish is the only one left."""
    from awa_sql import migrate
    from awa_sql.roles import Roles

    roles = Roles.with_prefix(role_prefix)
    before = [m for m in MIGRATIONS if m.version < 24]
    assert before and len(before) < len(MIGRATIONS)
    with empty_db.connect() as conn:
        conn.execute("set search_path = pg_catalog, pg_temp")
        plan = migrate.build_plan(migrate.read_state(conn, roles), roles, create_roles=True,
                                  migrations=before, layer=LAYER[:1], package_version="0.0.1")
        migrate.apply_plan(conn, plan, "5s", lambda _line: None)
        queue = conn.execute("insert into awa.queue_meta (queue, completed_seq)"
                             " values ('up', 'awa.run_lease_seq') returning queue_id"
                             ).fetchone()[0]
        lane = conn.execute("insert into awa.lanes (queue_id, priority, shard, seq)"
                            " values (%s, 2, 0, 'awa.job_id_seq') returning lane_id",
                            [queue]).fetchone()[0]
        for seq in (1, 2):
            conn.execute("insert into awa.ready (job_id, lane_id, lane_seq, queue_id, priority,"
                         " kind, args, attempt, max_attempts, enqueued_at)"
                         " values (nextval('awa.job_id_seq'), %s, %s, %s, 2, 'j', '{}', 0, 3,"
                         " now())", [lane, seq, queue])
        done = conn.execute(EARLIER_CLAIM).fetchone()
    empty_db.awa("migrate", "--role-prefix", role_prefix, check=True)
    with empty_db.connect() as conn:
        failed = conn.execute(EARLIER_CLAIM).fetchone()
        where = "select tableoid::regclass::text, slot from awa.running where job_id = %s"
        assert conn.execute(where, [done[0]]).fetchone() == ("awa.running_carried", 2)
        assert conn.execute(where, [failed[0]]).fetchone() == ("awa.running_carried", 2)
        assert conn.execute("select awa.complete(%s, %s)", done).fetchone()[0] is True
        conn.execute("select awa.fail(%s, %s, 'boom')", failed)
        assert conn.execute("select count(*) from awa.running").fetchone()[0] == 0
        assert conn.execute("select array_agg(p.oid::regprocedure::text) from pg_proc p"
                            " where p.oid::regprocedure::text like 'awa._finish(%%'"
                            ).fetchone()[0] == ["awa._finish(awa.running,text,text)"]


# -- grants and owners lost after the install ------------------------------------------
#
# A restore with --no-acl (-x), a DBA's REVOKE or GRANT: the migrations and
# the function layer are all applied, so nothing is pending, yet the runtime
# roles cannot reach schema awa, or PUBLIC may run the owner's routines.

NO_ACL = (
    # What a restore with --no-acl leaves: every ACL the default one, the
    # owner's default privileges gone.
    "update pg_catalog.pg_namespace set nspacl = null where nspname = 'awa'",
    "update pg_catalog.pg_proc set proacl = null where pronamespace = 'awa'::regnamespace",
    "update pg_catalog.pg_class set relacl = null where relnamespace = 'awa'::regnamespace",
    "update pg_catalog.pg_attribute set attacl = null where attrelid in"
    " (select oid from pg_catalog.pg_class where relnamespace = 'awa'::regnamespace)",
    "delete from pg_catalog.pg_default_acl where defaclrole = 'awa_owner'::regrole",
)

DAMAGE = {
    "usage revoked": (["revoke usage on schema awa from awa_producer"],
                      "awa_producer"),
    "private routine granted to public": (
        ["grant execute on function awa._sticky(integer) to public"], "awa._sticky(integer)"),
    "every acl dropped": (list(NO_ACL), "routines executable by PUBLIC"),
}


def _can(conn: psycopg.Connection, statement: str) -> bool:
    try:
        with conn.transaction():
            conn.execute(statement)
        return True
    except psycopg.errors.InsufficientPrivilege:
        return False


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_lost_grants_fail_the_gate_and_migrate_puts_them_back(db, logins, damage):
    statements, named = DAMAGE[damage]
    enqueue = "select awa.enqueue('grants', 'k')"
    private = "select awa._sticky(4)"
    with db.connect(logins.producer) as p, db.connect(logins.reader) as r:
        assert _can(p, enqueue) and not _can(r, private)
    with db.connect() as conn:
        for statement in statements:
            conn.execute(statement)
        records = _records(conn)
    with db.connect(logins.producer) as p, db.connect(logins.reader) as r:
        broken = {"producer enqueues": _can(p, enqueue), "reader runs a private": _can(r, private)}
    assert broken != {"producer enqueues": True, "reader runs a private": False}  # the damage

    gate = db.awa("status", "--check")
    assert gate.returncode == 10, gate.stdout + gate.stderr
    assert named in gate.stdout and "awa migrate" in gate.stdout, gate.stdout
    assert "pending: none" in gate.stdout
    doc = json.loads(db.awa("status", "--json", check=True).stdout)
    assert doc["up_to_date"] is False and doc["pending"] == []
    assert any(named in line for line in doc["security"]), doc["security"]
    dry = db.awa("migrate", "--dry-run", check=True).stdout
    assert "function layer" in dry and named in dry, dry
    with db.connect() as conn:
        assert _records(conn) == records  # the dry run changed nothing

    repaired = db.awa("migrate", check=True)
    assert named in repaired.stdout and "applied function layer" in repaired.stdout, \
        repaired.stdout
    assert db.awa("status", "--check").returncode == 0
    assert "database is up to date" in db.awa("migrate", check=True).stdout
    with db.connect(logins.producer) as p, db.connect(logins.reader) as r:
        assert _can(p, enqueue) and not _can(r, private)
    with db.connect() as conn:
        assert conn.execute("select awa._assert_security()").fetchone() is not None


# Privileges granted or revoked by hand since the layer: (damage, what the
# gate names, a call the damage changes, as whom, whether it may run once
# the layer is applied again).
DRIFT = {
    "an operator's function granted to the producer role": (
        "grant execute on function awa.set_enqueue_shards(text, integer) to awa_producer",
        "awa_producer was granted EXECUTE on function awa.set_enqueue_shards(text,integer)",
        "select awa.set_enqueue_shards('drift', 2)", "producer", False),
    "the worker's heartbeat revoked": (
        "revoke execute on function awa.heartbeat(bigint, bigint, interval) from awa_worker",
        "awa_worker lost EXECUTE on function awa.heartbeat(bigint,bigint,interval)",
        "select awa.heartbeat(1, 1, interval '1 minute')", "worker", True),
    "a write on a table granted to a login": (
        "grant delete on awa.ready to {worker}",
        "{worker} was granted DELETE on table awa.ready",
        "delete from awa.ready", "worker", False),
    "a column of the staging table granted to the reader role": (
        "grant insert (kind) on awa.copy_staging to awa_reader",
        "awa_reader was granted INSERT (kind) on table awa.copy_staging",
        "insert into awa.copy_staging (kind) select 'k' where false", "reader", False),
    "a grant option given to the worker role": (
        "grant execute on function awa.heartbeat(bigint, bigint, interval) to awa_worker"
        " with grant option",
        "awa_worker was given the grant option of EXECUTE on function"
        " awa.heartbeat(bigint,bigint,interval)", None, "worker", True),
    # The schema's own grants: CREATE there lets a runtime role add a
    # routine that a definer's qualified call could resolve to.
    "CREATE on schema awa granted to the producer role": (
        "grant create on schema awa to awa_producer", "awa_producer has CREATE",
        None, "producer", False),
    "USAGE on schema awa granted to a login": (
        "grant usage on schema awa to {worker}", "{worker} has USAGE", None, "worker", False),
    "the grant option of USAGE on schema awa given to the reader role": (
        "grant usage on schema awa to awa_reader with grant option",
        "awa_reader has the grant option of USAGE", None, "reader", True),
}


def _drift_rounds(worker: str) -> list[list[tuple]]:
    """DRIFT's damages in rounds, no two of a round on one privilege of one
    grantee (a grant with its option would give back what a revoke took)."""
    rounds: list[list[tuple]] = []
    for damage, (statement, named, call, who, allowed) in DRIFT.items():
        statement, named = (x.format(worker=worker) for x in (statement, named))
        target = re.search(r" on (.+?) (?:to|from) (\S+)", statement).groups()
        entry = (damage, statement, named, call, who, allowed, target)
        for taken in rounds:
            if all(other[-1] != target for other in taken):
                taken.append(entry)
                break
        else:
            rounds.append([entry])
    return rounds


@pytest.mark.parametrize("round_", [0, 1], ids=["first round", "second round"])
def test_grants_made_or_revoked_by_hand_fail_the_gate_and_migrate_undoes_them(
        db, logins, round_):
    """DRIFT's damages a round at a time (one layer step undoes them all, as
    a run after several hands would): each changes what its call may do, the
    gate names each, and the run names and undoes each."""
    rounds = _drift_rounds(logins.worker)
    assert len(rounds) == 2
    damages = [(d, st, named, call, getattr(logins, who), allowed)
               for d, st, named, call, who, allowed, _ in rounds[round_]]
    with db.connect() as conn:
        for _, statement, *_ in damages:
            conn.execute(statement)
    for damage, _, _, call, login, allowed in damages:
        if call is not None:
            with db.connect(login) as c:
                assert _can(c, call) is not allowed, damage  # the damage
    gate = db.awa("status", "--check")
    assert gate.returncode == 10, gate.stdout + gate.stderr
    assert "awa migrate" in gate.stdout, gate.stdout
    repaired = db.awa("migrate", check=True)
    assert "applied function layer" in repaired.stdout, repaired.stdout
    for damage, _, named, *_ in damages:
        assert named in gate.stdout, (damage, gate.stdout)
        assert named in repaired.stdout, (damage, repaired.stdout)
    assert db.awa("status", "--check").returncode == 0
    for damage, _, _, call, login, allowed in damages:
        if call is not None:
            with db.connect(login) as c:
                assert _can(c, call) is allowed, damage
    with db.connect() as conn:
        assert conn.execute("select count(*) from awa._grants_found() where grantable"
                            ).fetchone()[0] == 0
        # The schema's grants are the bootstrap's again: USAGE to each
        # runtime role (the reader's too), nothing else.
        held = conn.execute(
            "select a.grantee::regrole::text || ' ' || a.privilege_type"
            "       || case when a.is_grantable then ' with grant option' else '' end"
            "  from pg_namespace n, aclexplode(n.nspacl) a"
            " where n.nspname = 'awa' and a.grantee <> n.nspowner order by 1").fetchall()
        assert [h for h, in held] == [f"awa_{cap} USAGE" for cap in (
            "maintenance", "operator", "producer", "reader", "worker")]


def test_the_upgrade_that_first_records_the_grants_names_those_it_takes_back(db, logins):
    """A database from before migration 0036: nothing recorded, so the plan
    sees no drift, and the layer's revoke-all takes a grant made by hand
    back all the same. The run names each one it did not grant again."""
    with db.connect() as conn:
        conn.execute(f"grant select on awa.queue_overview to {logins.producer}")
        conn.execute("grant execute on function awa.set_enqueue_shards(text, integer)"
                     " to awa_producer")
        conn.execute(f"grant create on schema awa to {logins.producer}")
        # As before 0036: no record of the grants, and the layer due again.
        conn.execute("drop table awa.expected_grants")
        conn.execute("delete from awa.schema_migrations where version = 36")
        conn.execute("delete from awa.schema_functions")
    upgraded = db.awa("migrate", check=True)
    assert "applied migration 0036_expected_grants" in upgraded.stdout, upgraded.stdout
    for taken in (f"{logins.producer} SELECT on table awa.queue_overview",
                  "awa_producer EXECUTE on function awa.set_enqueue_shards(text,integer)",
                  f"{logins.producer} CREATE on schema awa"):
        assert taken in upgraded.stdout, upgraded.stdout
    # What the layer grants itself again is not named.
    assert "awa_reader SELECT on table awa.queue_overview" not in upgraded.stdout
    with db.connect() as conn:
        assert conn.execute("select has_table_privilege(%s, 'awa.queue_overview', 'select')",
                            [logins.producer]).fetchone()[0] is False
    assert db.awa("status", "--check").returncode == 0


def test_a_routine_the_layer_drops_takes_its_grants_along_unnamed(db):
    """A function an earlier layer made and granted, which this one drops
    (the views' per-queue functions, dropped once the views no longer call
    them): its grants went with it, and the upgrade names none of them as
    taken back, which would tell the operator to fix a grant nobody made."""
    with db.connect() as conn:
        conn.execute("set role awa_owner")
        conn.execute("create function awa._finished_totals(queue_id integer) returns bigint"
                     " language sql stable as 'select 0::bigint'")
        conn.execute("grant execute on function awa._finished_totals(integer) to awa_reader")
        conn.execute("reset role")
        conn.execute("select awa._record_grants()")  # as the earlier layer left it
        conn.execute("delete from awa.schema_functions")  # the layer due again
    upgraded = db.awa("migrate", check=True)
    assert "took back" not in upgraded.stdout + upgraded.stderr, upgraded.stdout
    with db.connect() as conn:
        assert conn.execute("select to_regprocedure('awa._finished_totals(integer)')"
                            ).fetchone()[0] is None
        assert conn.execute("select * from awa._grant_drift()").fetchall() == []


def test_a_procedure_granted_by_hand_is_taken_back_too(db):
    """REVOKE ... ON FUNCTION refuses a procedure (42809): the layer's
    revoke-all names each routine as what it is, or one procedure granted
    by hand would stop every apply of the layer."""
    with db.connect() as conn:
        conn.execute("set role awa_owner")
        conn.execute("create procedure awa.by_hand() language sql as $$select 1$$")
        conn.execute("grant execute on procedure awa.by_hand() to awa_reader")
    gate = db.awa("status", "--check")
    assert gate.returncode == 10, gate.stdout + gate.stderr
    assert "awa_reader was granted EXECUTE on procedure awa.by_hand()" in gate.stdout
    repaired = db.awa("migrate")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    # Revoked, then swept: no layer defines it.
    assert "dropped awa.by_hand(), an earlier function layer's routine" in repaired.stdout
    with db.connect() as conn:
        assert conn.execute("select to_regprocedure('awa.by_hand()')").fetchone()[0] is None
    assert db.awa("status", "--check").returncode == 0


def test_a_layer_routine_granted_by_hand_is_taken_back_not_swept(db):
    """The layer's revokes run in a subtransaction, so that an earlier
    layer's granted routine does not pass for this layer's; a routine this
    layer defines before them (private.sql) and that was granted by hand is
    the layer's all the same: its privilege is taken back, the routine
    kept."""
    with db.connect() as conn:
        conn.execute("grant execute on function awa._role_for(text) to awa_reader")
        conn.execute("delete from awa.schema_functions")  # the layer is applied again
    applied = db.awa("migrate", check=True)
    assert "dropped awa._role_for" not in applied.stdout, applied.stdout
    with db.connect() as conn:
        assert conn.execute("select has_function_privilege('awa_reader',"
                            " 'awa._role_for(text)', 'execute')").fetchone()[0] is False
    assert db.awa("status", "--check").returncode == 0


def test_the_layer_records_every_grant_it_makes(db):
    """What the layer granted is what it recorded: nothing drifts after an
    apply, and every runtime role's grant is in the record."""
    with db.connect() as conn:
        assert conn.execute("select * from awa._grant_drift()").fetchall() == []
        recorded = conn.execute(
            "select grantee, count(*) from awa.expected_grants group by grantee order by 1"
        ).fetchall()
    assert {g for g, _ in recorded} == {
        "awa_maintenance", "awa_operator", "awa_producer", "awa_reader", "awa_worker"}
    assert all(n > 0 for _, n in recorded)


def test_a_security_definer_that_lost_its_search_path_fails_the_gate(db):
    with db.connect() as conn:
        conn.execute("alter function awa.enqueue_copied() reset search_path")
    gate = db.awa("status", "--check")
    assert gate.returncode == 10
    assert "awa.enqueue_copied()" in gate.stdout and "search_path" in gate.stdout
    db.awa("migrate", check=True)
    assert db.awa("status", "--check").returncode == 0


def test_an_object_owned_by_another_role_is_refused_not_repaired(db):
    """migrate cannot give an object back to the owner (it runs as the owner):
    exit 6 naming the object and what to do, and nothing changes."""
    with db.connect() as conn:
        conn.execute("alter function awa._sticky(integer) owner to postgres")
        records = _records(conn)
    gate = db.awa("status", "--check")
    assert gate.returncode == 6, gate.stdout + gate.stderr
    assert "awa._sticky(integer)" in gate.stdout and "not owned by awa_owner" in gate.stdout
    assert "--no-owner" in gate.stdout
    refused = db.awa("migrate")
    assert refused.returncode == 6
    assert "awa._sticky(integer)" in refused.stderr and "ALTER" in refused.stderr, \
        refused.stderr
    with db.connect() as conn:
        assert _records(conn) == records


def test_an_installed_schema_owned_by_another_role_says_what_to_do(db):
    """What a restore with --no-owner leaves: the schema and everything in it
    belong to the restoring login."""
    with db.connect() as conn:
        conn.execute("alter schema awa owner to postgres")
    gate = db.awa("status", "--check")
    assert gate.returncode == 6
    assert "owned by 'postgres', not 'awa_owner'" in gate.stdout
    assert "--no-owner" in gate.stdout and "restore" in gate.stdout, gate.stdout


def test_the_grants_hint_names_the_roles_bound_here(empty_db, role_prefix):
    """Installed with another prefix, the hint names that producer role."""
    empty_db.awa("migrate", "--create-roles", "--role-prefix", role_prefix, check=True)
    with empty_db.connect() as conn:
        conn.execute(f"grant execute on function awa.set_enqueue_shards(text, integer)"
                     f" to {role_prefix}producer")
    out = empty_db.awa("status", "--check", "--role-prefix", role_prefix)
    assert out.returncode == 10, out.stdout + out.stderr
    with empty_db.connect() as conn:
        conn.execute(f"set role {role_prefix}owner")
        hint = conn.execute("select hint from awa._security_violations() where rule = 'grants'"
                            ).fetchone()[0]
    assert f"GRANT {role_prefix}producer TO app" in hint, hint
