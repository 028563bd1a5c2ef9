"""The security properties of docs/security.md, checked against the catalog and as each role."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support.jobs import LANE_CLASS, Logins, claim, enqueue

DOCS_SECURITY = Path(__file__).resolve().parent.parent / "docs" / "security.md"

RUNTIME = ["awa_producer", "awa_worker", "awa_maintenance", "awa_operator", "awa_reader"]


def _workload(db, logins: Logins) -> None:
    with db.connect(logins.producer) as p:
        enqueue(p, "wl", ordering_key=b"k")
        enqueue(p, "wl-new-queue")
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('wl', 8)")
    with db.connect(logins.worker) as w:
        for c in claim(w, ["wl", "wl-new-queue"]):
            w.execute("select awa.complete(%s, %s)", [c[0], c[1]])


# -- catalog properties (1, 2, 3, 5, 6) -------------------------------------------------


def test_definers_pin_search_path(db, logins):
    _workload(db, logins)
    with db.connect() as conn:
        rows = conn.execute(
            "select p.oid::regprocedure::text, p.proconfig from pg_proc p"
            " where p.pronamespace = 'awa'::regnamespace and p.prosecdef").fetchall()
    assert len(rows) >= 12  # enqueue, batch, claim, complete, ... exist and are definers
    for name, config in rows:
        paths = [c for c in config or [] if c.startswith("search_path=")]
        assert paths == ["search_path=pg_catalog, pg_temp"], name
        # Anything else pinned is a planner setting, a bound on lock waits
        # (awa.prune_finished) or fresh statistics (awa.compact_ready),
        # never a path or a role.
        assert all(c.startswith(("search_path=", "plan_cache_mode=", "enable_",
                                 "lock_timeout=")) or c == "stats_fetch_consistency=none"
                   for c in config), name


def test_no_routine_is_executable_by_public(db):
    with db.connect() as conn:
        rows = conn.execute(
            "select p.oid::regprocedure::text from pg_proc p"
            " where p.pronamespace = 'awa'::regnamespace and (p.proacl is null or exists ("
            "  select from aclexplode(p.proacl) a where a.grantee = 0))").fetchall()
        default_acl = conn.execute(
            "select d.defaclacl::text from pg_default_acl d"
            " where d.defaclrole = 'awa_owner'::regrole and d.defaclobjtype = 'f'"
            " and d.defaclnamespace = 0").fetchone()
    assert rows == []
    assert default_acl is not None  # the global default ACL exists ...
    assert not re.search(r"[{,]=X", default_acl[0])  # ... and gives PUBLIC nothing


@pytest.mark.parametrize("role", RUNTIME)
def test_docs_name_every_function_granted_to_a_runtime_role(db, role):
    """docs/security.md's role table is what an operator grants from: each
    runtime role's row names every function granted to that role (the
    maintenance row once left one out, the operator row the job tools, the
    producer and worker rows the runtime snapshots both may publish), save
    the private `_` helpers (test_private_routines_are_the_owners_alone),
    those every runtime role may call (the routing functions, named below
    the table) and, in the operator's row ("everything a reader may"), the
    reader's."""
    row = next(line for line in DOCS_SECURITY.read_text().splitlines()
               if line.startswith(f"| `{role}` |"))
    named = {n.removeprefix("awa.")
             for n in re.findall(r"`([a-z_.]+)(?:\(\))?`", row.split("|")[2])}
    with db.connect() as conn:
        grantees = conn.execute(
            "select p.proname::text, array_agg(a.grantee::regrole::text)"
            "  from pg_proc p, aclexplode(p.proacl) a"
            " where p.pronamespace = 'awa'::regnamespace and p.proname !~ '^_'"
            "   and a.privilege_type = 'EXECUTE' and a.grantee::regrole::text = any(%s)"
            " group by p.oid, p.proname", [RUNTIME]).fetchall()
    granted = {name for name, held in grantees
               if role in held and set(held) != set(RUNTIME)
               and not (role == "awa_operator" and "awa_reader" in held)}
    assert granted, role  # every runtime role has functions of its own
    assert named >= granted, sorted(granted - named)


def test_private_routines_are_the_owners_alone(db, logins):
    """A `_`-named routine trusts its arguments (awa._insert_jobs writes any lane
    at any lane_seq, awa._take_lane takes any lock): no runtime role may call
    one, save the one a view needs, and a producer's direct call is refused."""
    with db.connect() as conn:
        granted = conn.execute(
            "select p.oid::regprocedure::text from pg_proc p"
            " where p.pronamespace = 'awa'::regnamespace and p.proname like '\\_%'"
            " and exists (select from aclexplode(p.proacl) a where a.grantee <> p.proowner)"
            " order by 1").fetchall()
    assert [g[0] for g in granted] == sorted([
        # Pure functions of their arguments behind the public routing functions,
        # which run with their caller's rights (sql/routing.sql).
        "awa._hash64_limbs(bytea)", "awa._key_shard(bytea,integer)",
        "awa._limbs_mod(bigint[],integer)", "awa._limbs_numeric(bigint[])",
        "awa._mix_limbs(bytea,bigint,bigint)", "awa._partition_limbs(bytea)",
        # The views (run with their reader's rights) read each lane's
        # sequence and head, and each queue's counters: sequences only the
        # owner may read. Read-only, whatever lane or queue id they are
        # given, and only lane sequences and a queue's four counters.
        "awa._lane_next_seq(integer)", "awa._lane_states(integer)",
        "awa._lane_last_seq(integer)", "awa._lane_starts(integer)",
        "awa._queue_counter(integer,text)",
        # awa.queue_overview counts a queue's scheduled jobs up to a cap,
        # from that queue's index only, and fills in the retention's and the
        # retry policy's defaults, constants.
        "awa._scheduled_capped(integer)", "awa._policy_defaults()",
    ])
    with db.connect(logins.producer) as p, pytest.raises(psycopg.errors.InsufficientPrivilege):
        p.execute("select awa._insert_jobs(array[1], array[1::bigint], array[1], null,"
                  " array['k'], null, null, null, null)")


def test_single_owner_and_owner_attributes(db, logins):
    _workload(db, logins)
    with db.connect() as conn:
        foreign = conn.execute(
            "select 'proc', p.oid::regprocedure::text from pg_proc p"
            " where p.pronamespace = 'awa'::regnamespace and p.proowner <> 'awa_owner'::regrole"
            " union all select 'class', c.oid::regclass::text from pg_class c"
            " where c.relnamespace = 'awa'::regnamespace and c.relowner <> 'awa_owner'::regrole"
            " union all select 'type', t.oid::regtype::text from pg_type t"
            " where t.typnamespace = 'awa'::regnamespace and t.typowner <> 'awa_owner'::regrole"
        ).fetchall()
        attrs = conn.execute(
            "select rolcanlogin, rolsuper, rolcreaterole, rolbypassrls from pg_roles"
            " where rolname = 'awa_owner'").fetchone()
        sequences = conn.execute(
            "select count(*) from pg_class where relnamespace = 'awa'::regnamespace"
            " and relkind = 'S' and relname like 'lane_seq_%'").fetchone()[0]
    assert foreign == []
    assert attrs == (False, False, False, False)
    assert sequences >= 4 * 8  # the workload provisioned lanes, all owned by the owner


def test_runtime_roles_have_no_create_and_no_write_grants(db, logins):
    _workload(db, logins)
    with db.connect() as conn:
        for role in RUNTIME:
            assert not conn.execute("select has_schema_privilege(%s, 'awa', 'CREATE')",
                                    [role]).fetchone()[0]
            writable = conn.execute(
                "select c.oid::regclass::text, p from pg_class c,"
                " unnest(array['INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER'"
                "              ] || case when current_setting('server_version_num')::int >= 170000"
                "              then array['MAINTAIN'] else '{}' end) p"
                " where c.relnamespace = 'awa'::regnamespace and c.relkind in ('r', 'v')"
                "   and has_table_privilege(%s, c.oid, p)", [role]).fetchall()
            assert writable == [], role
            seqs = conn.execute(
                "select c.oid::regclass::text from pg_class c"
                " where c.relnamespace = 'awa'::regnamespace and c.relkind = 'S'"
                "   and (has_sequence_privilege(%s, c.oid, 'USAGE')"
                "        or has_sequence_privilege(%s, c.oid, 'UPDATE'))",
                [role, role]).fetchall()
            assert seqs == [], role


@pytest.mark.parametrize("cap", ["producer", "worker", "maintenance", "operator", "reader"])
def test_lock_table_is_refused_for_every_runtime_role(db, logins, cap):
    with db.connect(getattr(logins, cap), autocommit=False) as conn:
        for table in ["ready", "lanes", "queue_meta", "running", "scheduled"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"lock table awa.{table} in access exclusive mode")
            conn.rollback()


# -- capability boundaries (4, 7) --------------------------------------------------------

MUTATING = {
    "enqueue": "select awa.enqueue('cap', 'k')",
    "enqueue_batch": "select awa.enqueue_batch(array['cap'], array['k'])",
    "claim": "select awa.claim(array['cap'], 1, 'w')",
    "complete": "select awa.complete(1, 1)",
    "fail": "select awa.fail(1, 1, 'x')",
    "heartbeat": "select awa.heartbeat(1, 1, '1 minute')",
    "run_outcome": "select awa.run_outcome(1, 1, 1)",  # read-only, the worker's only
    "set_enqueue_shards": "select awa.set_enqueue_shards('cap', 2)",
    "pause_queue": "select awa.pause_queue('cap')",
    "resume_queue": "select awa.resume_queue('cap')",
    "promote_due": "select awa.promote_due()",
    "rescue_expired": "select awa.rescue_expired()",
    "retry_job": "select awa.retry_job(1)",
    "cancel_job": "select awa.cancel_job(1)",
    "retry_jobs": "select awa.retry_jobs('cap')",
    "cancel_jobs": "select awa.cancel_jobs('cap')",
}
ALLOWED = {
    "producer": {"enqueue", "enqueue_batch"},
    "worker": {"claim", "complete", "fail", "heartbeat", "run_outcome"},
    "maintenance": {"promote_due", "rescue_expired"},
    "operator": {"set_enqueue_shards", "pause_queue", "resume_queue", "retry_job", "cancel_job",
                 "retry_jobs", "cancel_jobs"},
    "reader": set(),
    "nobody": set(),
}


@pytest.mark.parametrize("cap", sorted(ALLOWED))
def test_capability_boundaries(db, cap):
    with db.connect() as admin:
        admin.execute("select awa.enqueue('cap', 'seed')")  # so pause/resume find the queue
    login = db.login_role(*([f"awa_{cap}"] if cap != "nobody" else []))
    with db.connect(login) as conn:
        for name, statement in MUTATING.items():
            if name in ALLOWED[cap]:
                conn.execute(statement)
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
        for table in ["ready", "queue_meta", "lanes"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"insert into awa.{table} default values")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"delete from awa.{table}")
        for view in ["queue_overview", "lane_overview", "shard_changes"]:
            if cap in ("reader", "operator"):
                conn.execute(f"select * from awa.{view}").fetchall()
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(f"select * from awa.{view}")
        if cap == "nobody":
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("select awa.ordering_key_hash64('x')")


def test_cross_role_lanes(db):
    """Role A's activity provisions lanes; role B enqueues into every one of them."""
    a_producer = db.login_role("awa_producer", "awa_operator")
    b_producer = db.login_role("awa_producer")
    with db.connect(a_producer) as a:
        enqueue(a, "shared")
        a.execute("select awa.set_enqueue_shards('shared', 8)")
    with db.connect(b_producer) as b:
        shards = set()
        for priority in (1, 2, 3, 4):
            for i in range(200):
                row = enqueue(b, "shared", priority=priority, ordering_key=f"k{i}".encode())
                shards.add((priority, row[3]))
    assert shards == {(p, s) for p in (1, 2, 3, 4) for s in range(8)}
    with db.connect() as admin:
        owners = admin.execute(
            "select distinct pg_get_userbyid(c.relowner) from awa.lanes l"
            " join pg_class c on c.oid = l.seq").fetchall()
    assert owners == [("awa_owner",)]


@pytest.mark.parametrize("call", [
    "select awa.complete(%(job)s, %(lease)s)",
    "select awa.fail(%(job)s, %(lease)s, 'forged', now() + interval '1 year')",
    "select awa.heartbeat(%(job)s, %(lease)s, '1 day')",
    "select awa.run_outcome(%(job)s, %(lease)s, 1)",
])
def test_a_worker_cannot_act_on_a_run_another_login_claimed(db, logins, call):
    """A lease is a number from a sequence: a worker that knows its own can
    guess its neighbour's. The calls that take one act only on a run of the
    caller's login (42501) and leave the run as it was; the claimer's own
    calls still work. A run claimed before migration 0038 has no login, and
    any worker holding its lease may end it, as before."""
    other = db.login_role("awa_worker")
    with db.connect(logins.producer) as p:
        enqueue(p, "own")
        enqueue(p, "own")
    with db.connect(logins.worker) as mine, db.connect(other) as theirs, \
            db.connect() as su:
        (job, lease, *_), = claim(mine, ["own"], 1)
        before = su.execute("select to_jsonb(r) from awa.running r where job_id = %s",
                            [job]).fetchone()
        with pytest.raises(psycopg.errors.InsufficientPrivilege,
                           match=f"job {job}: its run was claimed by another login"):
            theirs.execute(call, {"job": job, "lease": lease})
        assert su.execute("select to_jsonb(r) from awa.running r where job_id = %s",
                          [job]).fetchone() == before
        # A wrong lease is still a stale one, for the claimer as for others.
        assert mine.execute("select awa.complete(%s, %s)", [job, lease + 1000]).fetchone() \
            == (False,)
        assert mine.execute("select awa.run_outcome(%s, %s, 1)", [job, lease]).fetchone() \
            == ("running",)
        assert mine.execute("select awa.complete(%s, %s)", [job, lease]).fetchone() == (True,)
        (job, lease, *_), = claim(mine, ["own"], 1)
        su.execute("update awa.running set claimed_by = null where job_id = %s", [job])
        assert theirs.execute("select awa.complete(%s, %s)", [job, lease]).fetchone() \
            == (True,)


# -- identifier independence (11) and bad input ------------------------------------------

NASTY_NAMES = [
    'with "double" quotes',
    "it's; drop table awa.ready; --",
    "new\nline",
    "é" * 40,
    "x" * 200,
    unicodedata.normalize("NFC", "café-ünïcode"),
    unicodedata.normalize("NFD", "café-ünïcode"),
    "p" * 63 + "-first",
    "p" * 63 + "-second",
    "  spaces  ",
    "名前",
]


def test_queue_names_are_independent_of_identifiers(db, logins):
    with db.connect(logins.producer) as p:
        for name in NASTY_NAMES:
            enqueue(p, name, args=psycopg.types.json.Jsonb({"name": name}))
    with db.connect() as admin:
        lanes = admin.execute(
            "select m.queue, count(distinct l.lane_id), count(distinct l.seq)"
            " from awa.queue_meta m join awa.lanes l using (queue_id) group by m.queue").fetchall()
        relnames = [r for (r,) in admin.execute("select relname from pg_class")]
    assert {q for q, _, _ in lanes} == set(NASTY_NAMES)  # round trip, byte for byte
    assert all(n == 4 and s == 4 for _, n, s in lanes)
    for name in NASTY_NAMES:
        assert not any(name in r for r in relnames if len(name) > 3), name
    with db.connect(logins.worker) as w:
        for name in NASTY_NAMES:
            (c,) = claim(w, [name])
            assert c[2] == name and c[7] == {"name": name}


BAD_INPUT = [
    ("select awa.enqueue('q', 'k', priority => 0::smallint)", "22023", "between 1"),
    ("select awa.enqueue('q', 'k', priority => 5::smallint)", "22023", "got 5"),
    ("select awa.enqueue(null, 'k')", "22004", "queue must not be null"),
    ("select awa.enqueue('q', null)", "22004", "kind must not be null"),
    ("select awa.enqueue('', 'k')", "22023", "1 to 200 bytes, got an empty name"),
    ("select awa.enqueue(repeat('x', 201), 'k')", "22023", "got 201 bytes: 'xxxx"),
    ("select awa.enqueue('a#1', 'k')", "22023", "reserved for stripes"),
    ("select awa.enqueue('q', 'k', max_attempts => 0)", "22023", "max_attempts"),
    ("select awa.enqueue_batch(array['q','q'], array['k'])", "22023",
     "array kinds has 1 elements but queues has 2"),
    ("select awa.enqueue_batch(array['q'], array['k'], priorities => array[1,2]::smallint[])",
     "22023", "array priorities has 2 elements"),
    ("select awa.enqueue_batch(array['q', null], array['k', 'k'])", "22004",
     "batch element 2 (1-based)"),
    ("select awa.enqueue_batch(array['q', 'q'], array['k', 'k'],"
     " priorities => array[2, 9]::smallint[])", "22023", "batch element 2 (1-based)"),
]


@pytest.mark.parametrize(("statement", "sqlstate", "message"), BAD_INPUT)
def test_bad_input_gets_a_clear_error_and_writes_nothing(db, logins, statement, sqlstate,
                                                         message):
    with db.connect(logins.producer) as conn, pytest.raises(psycopg.Error) as err:
        conn.execute(statement)
    assert err.value.sqlstate == sqlstate
    assert message in str(err.value)
    with db.connect() as admin:
        assert admin.execute(
            "select (select count(*) from awa.queue_meta) + (select count(*) from awa.ready)"
            " + (select count(*) from awa.scheduled)").fetchone()[0] == 0


@pytest.mark.parametrize(("statement", "sqlstate"), [
    ("select awa.claim(array['q'], -1, 'w')", "22023"),
    ("select awa.claim(array['q'], 1, null)", "22004"),
    ("select awa.claim(null, 1, repeat('w', 256))", "22004"),
    # Stored with each run and read back by every job list.
    ("select awa.claim(array['q'], 1, repeat('w', 256))", "22023"),
    ("select awa.claim(array['q'], 1, 'w', '-1 second')", "22023"),
])
def test_bad_claim_input(db, logins, statement, sqlstate):
    with db.connect(logins.worker) as conn, pytest.raises(psycopg.Error) as err:
        conn.execute(statement)
    assert err.value.sqlstate == sqlstate


# -- lock key shape (13), hijack resistance (14, 15) -------------------------------------


def test_a_producer_holds_exactly_one_two_int_lane_lock(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "lockshape")  # the queue exists, committed, before we look at its lanes
    with db.connect(logins.producer, autocommit=False) as p:
        row = enqueue(p, "lockshape")
        with db.connect() as admin:
            lane_id = admin.execute(
                "select l.lane_id from awa.lanes l join awa.queue_meta m using (queue_id)"
                " where m.queue = 'lockshape' and l.priority = 2 and l.shard = %s",
                [row[3]]).fetchone()[0]
            locks = admin.execute(
                "select classid::int, objid::int, objsubid from pg_locks"
                " where locktype = 'advisory' and pid = %s and granted",
                [p.info.backend_pid]).fetchall()
            assert locks == [(LANE_CLASS, lane_id, 2)]
        p.commit()
        with db.connect() as admin:
            # Someone holding the single-bigint key with the same bits does not block us.
            admin.execute("select pg_advisory_lock(%s::bigint)", [(LANE_CLASS << 32) | lane_id])
            p.execute("set local lock_timeout = '500ms'")
            again = enqueue(p, "lockshape")
            assert again[3] == row[3]
            admin.execute("select pg_advisory_unlock_all()")
        p.commit()


# The advisory classes the leader locks had before migration 0026 ('awaP',
# 'awaA'): any role can still take those keys, and must stop nothing.
OLD_PROVISIONING_CLASS = int.from_bytes(b"awaP", "big")
OLD_AUTOSCALE_CLASS = int.from_bytes(b"awaA", "big")


def test_a_producer_holding_the_old_provisioning_lock_does_not_stop_an_operator(db, logins):
    """Creating queues and lanes is serialised by a row of awa.leader_locks,
    which no runtime role can lock; with an advisory lock, a producer holding
    it at session level stalled every change of S and every new queue."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('s', 2)")
    with db.connect(logins.producer) as hostile, db.connect(logins.operator) as op:
        assert hostile.execute("select pg_try_advisory_lock(%s, 0)",
                               [OLD_PROVISIONING_CLASS]).fetchone()[0]
        with pytest.raises(psycopg.errors.InsufficientPrivilege), hostile.transaction():
            hostile.execute("select from awa.leader_locks for update")
        op.execute("set lock_timeout = '2s'")
        op.execute("select awa.set_enqueue_shards('s', 4)")
        op.execute("select awa.set_queue_partitions('parted', 2)")
        assert op.execute("select awa.enqueue_shards('s')").fetchone()[0] == 4
    with db.connect(logins.producer) as p:
        p.execute("set lock_timeout = '2s'")
        enqueue(p, "brand-new")


def test_a_producer_holding_the_old_autoscale_lock_does_not_switch_the_autoscaler_off(
        db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('auto', 1)")
        op.execute("select * from awa.set_shard_mode('auto', 'shadow', 8)").fetchall()
    with db.connect(logins.producer) as hostile, db.connect(logins.maintenance) as m:
        assert hostile.execute("select pg_try_advisory_lock(%s, 0)",
                               [OLD_AUTOSCALE_CLASS]).fetchone()[0]
        assert len(m.execute("select * from awa.autoscale_tick()").fetchall()) == 1


def test_one_autoscale_tick_at_a_time(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('auto', 1)")
        op.execute("select * from awa.set_shard_mode('auto', 'shadow', 8)").fetchall()
    with db.connect(logins.maintenance, autocommit=False) as first, \
            db.connect(logins.maintenance) as second:
        assert len(first.execute("select * from awa.autoscale_tick()").fetchall()) == 1
        assert second.execute("select * from awa.autoscale_tick()").fetchall() == []
        first.rollback()


def test_temp_objects_named_like_ours_change_nothing(db, logins):
    with db.connect(logins.producer) as clean:
        expected = enqueue(clean, "hijack", ordering_key=b"customer-42")
    tables = ["ready", "lanes", "queue_meta", "scheduled", "running", "finished"]
    login = db.login_role("awa_producer", "awa_worker", extra="")
    with db.connect() as admin:
        admin.execute(sql.SQL("grant temporary on database {} to {}").format(
            sql.Identifier(db.name), sql.Identifier(login)))
    with db.connect(login) as conn:
        for t in tables:
            conn.execute(f"create temp table {t} (queue text, lane_id int, queue_id int)")
            conn.execute(f"insert into pg_temp.{t} values ('hijack', 1, 1)")
        conn.execute("create type pg_temp.enqueued as (x int)")
        conn.execute("set search_path = pg_temp, public, awa")
        row = enqueue(conn, "hijack", ordering_key=b"customer-42")
        assert row[1:4] == expected[1:4] and row[4] == expected[4] + 1
        claimed = claim(conn, ["hijack"])
        assert len(claimed) == 2


def test_trojan_public_objects_are_never_executed(db, logins):
    """pg_cron's test: functions in public named like ours, a caller path that
    searches public first; the documented call reaches awa's function."""
    with db.connect() as admin:
        admin.execute("create table public.trojan_log (what text)")
        admin.execute("grant insert on public.trojan_log to public")
        for fn, args in [("enqueue", "text, text"), ("nextval", "regclass"),
                         ("pg_advisory_xact_lock", "integer, integer"),
                         ("shard_for_ordering_key", "bytea, integer"),
                         ("set_config", "text, text, boolean"), ("now", "")]:
            admin.execute(
                f"create function public.{fn}({args}) returns bigint language sql as"
                f" $$ insert into public.trojan_log values ('{fn}') returning 1::bigint $$")
            admin.execute(f"grant execute on function public.{fn}({args}) to public")
    with db.connect(logins.producer) as p:
        p.execute("set search_path = public, awa")
        row = p.execute("select * from awa.enqueue('trojan'::text, 'k'::text)").fetchone()
        assert row[4] == 1
        p.execute("select * from awa.enqueue_batch(array['trojan'], array['k'])")
    with db.connect() as admin:
        assert admin.execute("select count(*) from public.trojan_log").fetchone()[0] == 0
