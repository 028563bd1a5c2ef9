"""PostgreSQL behaviours the design relies on (docs/security.md),
re-checked on every supported major version. If one of these starts failing,
a design decision needs revisiting, not just a test."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql


@pytest.fixture
def conn(empty_db):
    with empty_db.connect() as c:
        c.execute("create schema sem")
        yield c


def _login(empty_db, *extra: str) -> str:
    return empty_db.login_role(extra=" ".join(extra))


def test_a_search_path_without_pg_temp_searches_the_callers_temp_schema_first(empty_db, conn):
    conn.execute("create table sem.jobs (what text)")
    conn.execute("insert into sem.jobs values ('real')")
    conn.execute("create function sem.unsafe() returns text language sql security definer"
                 " set search_path = sem as 'select what from jobs'")
    conn.execute("create function sem.safe() returns text language sql security definer"
                 " set search_path = pg_catalog, pg_temp as 'select what from sem.jobs'")
    caller = _login(empty_db)
    conn.execute(sql.SQL("grant usage on schema sem to {}").format(sql.Identifier(caller)))
    conn.execute(sql.SQL("grant temporary on database {} to {}").format(
        sql.Identifier(empty_db.name), sql.Identifier(caller)))
    with empty_db.connect(caller) as c:
        c.execute("create temp table jobs (what text)")
        c.execute("insert into jobs values ('hijacked')")
        assert c.execute("select sem.unsafe()").fetchone()[0] == "hijacked"
        assert c.execute("select sem.safe()").fetchone()[0] == "real"


def test_functions_are_public_by_default_and_only_the_global_default_acl_helps(empty_db, conn):
    owner = _login(empty_db)
    conn.execute(sql.SQL("grant create, usage on schema sem to {}").format(sql.Identifier(owner)))
    conn.execute(sql.SQL("alter default privileges for role {} in schema sem"
                         " revoke execute on functions from public").format(sql.Identifier(owner)))
    with empty_db.connect(owner) as c:
        c.execute("create function sem.f1() returns int language sql as 'select 1'")
    public_can = "select has_function_privilege('public', %s::regprocedure, 'EXECUTE')"
    assert conn.execute(public_can, ["sem.f1()"]).fetchone()[0] is True
    conn.execute(sql.SQL("alter default privileges for role {}"
                         " revoke execute on functions from public").format(sql.Identifier(owner)))
    with empty_db.connect(owner) as c:
        c.execute("create function sem.f2() returns int language sql as 'select 2'")
    assert conn.execute(public_can, ["sem.f2()"]).fetchone()[0] is False


def test_replace_without_set_drops_the_pinned_path_and_drop_create_resets_the_acl(conn):
    conn.execute("create function sem.g() returns int language sql security definer"
                 " set search_path = pg_catalog, pg_temp as 'select 1'")
    conn.execute("revoke execute on function sem.g() from public")
    conn.execute("create or replace function sem.g() returns int language sql security definer"
                 " as 'select 2'")
    assert conn.execute("select proconfig from pg_proc where oid = 'sem.g()'::regprocedure"
                        ).fetchone()[0] is None
    assert conn.execute("select has_function_privilege('public', 'sem.g()', 'EXECUTE')"
                        ).fetchone()[0] is False  # CREATE OR REPLACE keeps the ACL ...
    conn.execute("drop function sem.g()")
    conn.execute("create function sem.g() returns int language sql as 'select 3'")
    assert conn.execute("select has_function_privilege('public', 'sem.g()', 'EXECUTE')"
                        ).fetchone()[0] is True  # ... DROP + CREATE does not


def test_a_sequence_created_by_one_runtime_role_is_unusable_by_another(empty_db, conn):
    a, b = _login(empty_db), _login(empty_db)
    for role in (a, b):
        conn.execute(sql.SQL("grant create, usage on schema sem to {}").format(
            sql.Identifier(role)))
    with empty_db.connect(a) as c:
        c.execute("create sequence sem.lane_1")
    with empty_db.connect(b) as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
        c.execute("select nextval('sem.lane_1')")


def test_identifiers_are_cut_to_63_bytes_and_if_not_exists_then_shares(conn):
    long_a = "q" * 63 + "_first"
    long_b = "q" * 63 + "_second"
    conn.execute(sql.SQL("create sequence if not exists sem.{}").format(sql.Identifier(long_a)))
    conn.execute(sql.SQL("create sequence if not exists sem.{}").format(sql.Identifier(long_b)))
    assert conn.execute("select count(*) from pg_class where relnamespace = 'sem'::regnamespace"
                        ).fetchone()[0] == 1  # two names, one sequence


def test_two_int_and_bigint_advisory_keys_do_not_conflict(empty_db):
    with empty_db.connect() as a, empty_db.connect() as b:
        a.execute("select pg_advisory_lock(%s::bigint)", [(1635213644 << 32) | 7])
        b.execute("set lock_timeout = '200ms'")
        b.execute("select pg_advisory_lock(1635213644, 7)")  # does not wait
        with pytest.raises(psycopg.errors.LockNotAvailable):
            b.execute("select pg_advisory_lock(%s::bigint)", [(1635213644 << 32) | 7])


def test_update_privilege_alone_allows_lock_table_access_exclusive(empty_db, conn):
    conn.execute("create table sem.t (x int)")
    updater = _login(empty_db)
    conn.execute(sql.SQL("grant usage on schema sem to {}").format(sql.Identifier(updater)))
    conn.execute(sql.SQL("grant update on sem.t to {}").format(sql.Identifier(updater)))
    with empty_db.connect(updater, autocommit=False) as c:
        c.execute("lock table sem.t in access exclusive mode")  # why runtime roles get no DML
        c.rollback()
