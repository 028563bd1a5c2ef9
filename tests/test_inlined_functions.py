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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from awa_sql import migrate
from tests.support.catalog import INLINED_FUNCTIONS
from tests.support.jobs import LANE_CLASS, valid_job

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
            call = f"awa.{name}({', '.join(f'null::{t}' for t in types)})"
            plan = "\n".join(r[0] for r in conn.execute(f"explain verbose select {call}"))
            assert name not in plan, f"{signature} is not inlined:\n{plan}"


def test_the_lock_class_functions_name_the_numbers_the_runner_and_tests_use(db):
    with db.connect() as conn:
        lane, migrate_class = conn.execute(
            "select awa._lock_class_lane(), awa._lock_class_migrate()").fetchone()
    assert lane == LANE_CLASS
    assert migrate_class == migrate.MIGRATION_LOCK[0] == migrate.STEP_LOCK[0]


def test_no_other_sql_file_writes_a_lock_class_number_or_the_row_rule():
    number = re.compile(r"16352136\d\d")
    rule = re.compile(r"between 1 and (4|200|1000)\b|octet_length\(\w*queue|'#'\)")
    homes = {"number": {"private.sql"}, "rule": {"queues.sql"}}
    for path in sorted(ROOT.glob("sql/*.sql")):
        code = "\n".join(line.split("--")[0] for line in path.read_text().splitlines())
        if path.name not in homes["number"]:
            assert not number.search(code), f"{path.name}: use awa._lock_class_*()"
        if path.name not in homes["rule"]:
            assert not rule.search(code), f"{path.name}: {rule.search(code)}; use awa._job_ok"


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
            # Null where a value is required is 22004; a value out of range 22023.
            null_first = queue is None or (valid_job(queue, "k", 2, 25) and kind is None)
            assert raised == ("22004" if null_first else "22023")
        for part, check, value in (("_queue_name_ok", "_check_queue_name", "%s::text"),
                                   ("_priority_ok", "_check_priority", "%s::smallint")):
            arg = queue if part == "_queue_name_ok" else priority
            part_ok = conn.execute(f"select awa.{part}({value})", [arg]).fetchone()[0]
            try:
                conn.execute(f"select awa.{check}({value})", [arg])
                assert part_ok
            except psycopg.Error:
                assert not part_ok
