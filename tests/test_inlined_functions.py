"""The inlined constants and predicates: safe without a pinned search_path, free
at run time, and the one home of their rule.

The lock-class functions, the row predicates (awa._job_ok and its parts),
awa._sticky and awa._has_lane_memo are plain `language sql` without SET, so
the planner inlines them. That is safe only while they read no table (they
are immutable, or stable for the backend's pid and a transaction-local
setting), are never SECURITY DEFINER, are callable by the owner alone and
schema-qualify every name (pgspot checks the last in
test_lint); these tests check the rest, that the planner does inline them,
that each awa._check_* raises exactly for the rows its predicate refuses, and
that no other SQL file writes the rule or the number again.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from awa_sql import migrate
from tests.support.catalog import INLINED_FUNCTIONS
from tests.support.jobs import LANE_CLASS, copy_rows, valid_job

ROOT = Path(__file__).resolve().parent.parent
UNPINNED = """
    select p.oid::regprocedure::text, p.proname, l.lanname, p.provolatile, p.prosecdef,
           p.proacl::text, pg_get_userbyid(p.proowner),
           array(select format_type(t, null) from unnest(p.proargtypes) as t)
      from pg_proc p join pg_language l on l.oid = p.prolang
     where p.pronamespace = 'awa'::regnamespace
       and not exists (select from unnest(coalesce(p.proconfig, '{}')) as c
                        where c like 'search_path=%')
     order by 1
"""


def test_only_inlinable_owner_only_functions_go_without_a_pinned_search_path(db):
    with db.connect() as conn:
        rows = conn.execute(UNPINNED).fetchall()
        names = [r[1] for r in rows]
        assert sorted(names) == sorted(INLINED_FUNCTIONS)
        for signature, name, language, volatility, definer, acl, owner, types in rows:
            # Immutable, or stable where they read the backend's state (its
            # pid, a transaction-local setting): never volatile, never tables.
            assert (language, definer) == ("sql", False) and volatility in "is", signature
            # Only the owner's own grant: no runtime role, no PUBLIC.
            assert acl == f"{{{owner}=X/{owner}}}", (signature, acl)
            plan = _plan_of_a_call(conn, f"awa.{name}", types)
            assert name not in plan, f"{signature} is not inlined:\n{plan}"


def _plan_of_a_call(conn: psycopg.Connection, function: str, types: list[str]) -> str:
    """EXPLAIN VERBOSE of ``function`` called on the columns of a table, one per
    argument. Not on constants: the planner folds an immutable function of
    constants to its value whether it can inline it or not (one of no
    arguments too: nothing of it is left to run, inlined or not)."""
    conn.execute("drop table if exists pg_temp.call_args")
    columns = ", ".join(f"a{i} {t}" for i, t in enumerate(types))
    conn.execute(f"create temp table call_args ({columns})")
    call = f"{function}({', '.join(f'c.a{i}' for i in range(len(types)))})"
    return "\n".join(r[0] for r in conn.execute(
        f"explain verbose select {call} from pg_temp.call_args as c"))


@pytest.mark.parametrize(("language", "body", "inlined"), [
    ("sql", "select awa._queue_name_ok(q) and p > 0", True),
    # More than one statement, or another language: never inlined.
    ("sql", "select 1; select awa._queue_name_ok(q) and p > 0", False),
    ("plpgsql", "begin return awa._queue_name_ok(q) and p > 0; end", False),
])
def test_the_plan_shows_a_function_the_planner_does_not_inline(db, language, body, inlined):
    """The check above can fail: an immutable function it cannot inline stays in
    the plan of a call on columns, where a call on constants hid it."""
    with db.connect() as conn:
        conn.execute("create schema inline_control")
        conn.execute(f"create function inline_control.f(q text, p smallint) returns boolean"
                     f" language {language} immutable as $f${body}$f$")
        plan = _plan_of_a_call(conn, "inline_control.f", ["text", "smallint"])
        assert ("inline_control.f" not in plan) is inlined, plan
        folded = "\n".join(r[0] for r in conn.execute(
            "explain verbose select inline_control.f(null::text, null::smallint)"))
        assert "inline_control.f" not in folded, folded


def test_the_lock_class_functions_name_the_numbers_the_runner_and_tests_use(db):
    with db.connect() as conn:
        lane, migrate_class = conn.execute(
            "select awa._lock_class_lane(), awa._lock_class_migrate()").fetchone()
    assert lane == LANE_CLASS
    assert migrate_class == migrate.MIGRATION_LOCK[0] == migrate.STEP_LOCK[0]


def test_no_other_sql_file_writes_a_lock_class_number_or_the_row_rule():
    number = re.compile(r"16352136\d\d")
    rule = re.compile(r"between 1 and (4|200|1000)\b|octet_length\(\w*queue|'#'\)")
    # The queues a name covers (awa._names_cover); a queue's rows found from
    # its locked row (anchor) go by its id instead.
    cover = re.compile(r"(logical_queue|root_queue)\s*=(?!\s*\(?anchor\b)"
                       r"|=\s*\(?\w+\)?\.(logical_queue|root_queue)\b"
                       r"|\bin\s*\([^)]*\b(logical_queue|root_queue)\b")
    homes = {"number": {"private.sql"}, "rule": {"queues.sql"}}
    for path in sorted(ROOT.glob("sql/*.sql")):
        code = "\n".join(line.split("--")[0] for line in path.read_text().splitlines())
        if path.name not in homes["number"]:
            assert not number.search(code), f"{path.name}: use awa._lock_class_*()"
        if path.name not in homes["rule"]:
            assert not rule.search(code), f"{path.name}: {rule.search(code)}; use awa._job_ok"
            assert not cover.search(code), f"{path.name}: {cover.search(code)}; use" \
                " awa._names_cover"


CHECK = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


@CHECK
@given(queue=st.one_of(st.none(), st.sampled_from(["", "q", "a#b", "#", "x" * 200, "x" * 201,
                                                   "é" * 100, "é" * 101]),
                           st.text(max_size=8).filter(lambda s: "\x00" not in s)),
       kind=st.sampled_from([None, "", "k"]),
       priority=st.sampled_from([None, -1, 0, 1, 4, 5, 32767]),
       max_attempts=st.sampled_from([None, -1, 0, 1, 1000, 1001]))
@example(queue="q", kind="k", priority=1, max_attempts=1)
def test_each_check_raises_exactly_when_its_predicate_refuses(db, queue, kind, priority,
                                                              max_attempts):
    args = [queue, kind, priority, max_attempts]
    with db.connect() as conn:
        ok = conn.execute("select awa._job_ok(%s, %s, %s::smallint, %s)", args).fetchone()[0]
        assert ok is valid_job(queue, kind, priority, max_attempts)
        try:
            conn.execute("select awa._check_job(%s, %s, %s::smallint, %s)", args)
            raised = None
        except psycopg.Error as err:
            raised = err.sqlstate
        assert (raised is None) is ok
        if not ok:
            # The first part refused, in the check's order: 22004 when it is
            # null (a required value), else 22023 (out of range).
            parts = [(queue, valid_job(queue, "k", 2, 25)), (kind, kind is not None),
                     (priority, priority is not None and 1 <= priority <= 4),
                     (max_attempts, max_attempts is not None and 1 <= max_attempts <= 1000)]
            first = next(value for value, part_ok in parts if not part_ok)
            assert raised == ("22004" if first is None else "22023")
        for part, check, value in (("_queue_name_ok", "_check_queue_name", "%s::text"),
                                   ("_priority_ok", "_check_priority", "%s::smallint")):
            arg = queue if part == "_queue_name_ok" else priority
            part_ok = conn.execute(f"select awa.{part}({value})", [arg]).fetchone()[0]
            try:
                conn.execute(f"select awa.{check}({value})", [arg])
                assert part_ok
            except psycopg.Error:
                assert not part_ok


@pytest.mark.parametrize("value", [None, -2147483648, -1, 0, 1, 2147483647])
def test_the_limit_check_raises_exactly_when_its_predicate_refuses(db, value):
    with db.connect() as conn:
        ok = conn.execute("select awa._limit_ok(%s::integer)", [value]).fetchone()[0]
        assert ok is (value is not None and value >= 0)
        try:
            conn.execute("select awa._check_limit('max_things', %s::integer)", [value])
            raised = None
        except psycopg.Error as err:
            raised = (err.sqlstate, err.diag.message_primary)
    if value is None:
        assert raised == ("22004", "max_things must not be null")
    else:
        assert raised == (None if ok else ("22023", f"max_things must be 0 or more, got {value}"))


def test_no_other_sql_file_writes_the_limit_rule():
    """A limit argument (max_jobs, max_rows, ...) is checked by
    awa._limit_ok / awa._check_limit, in sql/queues.sql only."""
    rule = re.compile(r"\b(max_\w+) is null or \1 < 0|must be 0 or more")
    for path in sorted(ROOT.glob("sql/*.sql")):
        if path.name == "queues.sql":
            continue
        code = "\n".join(line.split("--")[0] for line in path.read_text().splitlines())
        assert not rule.search(code), f"{path.name}: {rule.search(code)}; use awa._check_limit"


# The job row's defaults: awa._default_priority, _default_max_attempts,
# _default_args and _first_attempt (sql/queues.sql) are their one home.
DEFAULTS = {"priority": 2, "max_attempts": 25, "args": {}, "attempt": 0}
# A default written out: a value of the job (named priority, attempt(s) or
# args, or a.../p... as the batch and COPY paths alias them) coalesced or
# replaced with a literal, or an array of first attempts.
LITERAL_DEFAULT = re.compile(
    r"coalesce\(\s*(\w+\.)?(priority|priorities|max_attempts|attempts?|args|a|p)"
    r"(\[[^\]]*\])?\s*,\s*(\d+|'\{\}')(::\w+)?\s*\)"
    r"|array_replace\([^()]*,\s*null\s*,\s*(\d+|'\{\}')"
    r"|array_fill\(\s*\d+\s*,",
    re.IGNORECASE)


def test_no_sql_file_writes_a_job_default_again():
    for path in sorted(ROOT.glob("sql/*.sql")):
        code = "\n".join(line.split("--")[0] for line in path.read_text().splitlines())
        found = LITERAL_DEFAULT.search(code)
        assert not found, f"{path.name}: {found.group(0)}; use awa._default_*() or " \
                          "awa._first_attempt()"
    assert LITERAL_DEFAULT.search("coalesce(priorities[i], 2)::smallint")
    assert LITERAL_DEFAULT.search("coalesce(s.args, '{}')")
    assert LITERAL_DEFAULT.search("array_replace(max_attempts, null, 25)")
    assert not LITERAL_DEFAULT.search("coalesce(g.qids, '{}')")
    assert not LITERAL_DEFAULT.search("coalesce(p.min_samples, 3)")


def test_the_defaults_are_what_every_path_and_signature_gives(db, logins):
    """The public signatures write the numbers (a default expression runs as
    the caller, who may not execute the owner's constants): awa.enqueue's
    parameter defaults, the null elements of a batch and of COPY, and the
    Python client's keyword defaults all give the constants' values."""
    import inspect

    from awa_sql import client

    with db.connect() as conn:
        got = conn.execute("select awa._default_priority(), awa._default_max_attempts(),"
                           " awa._default_args(), awa._first_attempt()").fetchone()
    assert dict(zip(DEFAULTS, got, strict=True)) == DEFAULTS
    with db.connect(logins.producer) as conn:
        conn.execute("select awa.enqueue('defaults', 'k')")
        conn.execute("select awa.enqueue('defaults', 'k', run_at => now() + interval '1 day')")
        conn.execute("select awa.enqueue_batch(array['defaults'], array['k'])")
        conn.execute("select awa.enqueue_batch(array['defaults', 'defaults'], array['k', 'k'],"
                     " null, null, array[null, 'x']::bytea[])")
        with conn.transaction():
            copy_rows(conn, [("defaults", None, None, "k", None, None, None),
                             ("defaults", None, b"x", "k", None, None, None)])
    with db.connect() as conn:
        rows = conn.execute(
            "select count(*), count(*) filter (where priority = 2 and max_attempts = 25"
            " and args = '{}' and attempt = 0)"
            " from (select priority, max_attempts, args, attempt from awa.ready"
            "       union all"
            "       select priority, max_attempts, args, attempt from awa.scheduled) as j"
        ).fetchone()
    assert rows == (7, 7)
    for fn in (client.enqueue, client.enqueue_async):
        params = inspect.signature(fn).parameters
        assert params["priority"].default == DEFAULTS["priority"]
        assert params["max_attempts"].default == DEFAULTS["max_attempts"]
    with db.connect() as conn:
        signature = conn.execute(
            "select pg_get_function_arguments('awa.enqueue(text, text, jsonb, smallint, bytea,"
            " timestamptz, integer, bytea, interval)'::regprocedure)").fetchone()[0]
    assert "args jsonb DEFAULT '{}'::jsonb" in signature
    assert "priority smallint DEFAULT 2" in signature
    assert "max_attempts integer DEFAULT 25" in signature
