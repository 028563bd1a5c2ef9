"""Every value a definer reads that its caller can set is on a short list.

Functions in schema awa run with the owner's rights (the public ones are
SECURITY DEFINER, the private ones are called only from them). A caller can
set custom settings, create temp objects and write the rows of tables a
runtime role has INSERT or UPDATE on. This test reads every function body in
the catalog and fails on any such read that is not listed below with the
reason it is safe; it fails too on a listed read that no longer exists, so
the list stays the truth. docs/security.md explains the class of bug.
"""

from __future__ import annotations

import re

RUNTIME_ROLES = ["awa_producer", "awa_worker", "awa_maintenance", "awa_operator", "awa_reader"]

_STAGING = ("reads only its own transaction's staged rows (staged_xid, which producers cannot"
            " write; test_copy) and checks the payload columns like enqueue_batch's arrays")

ALLOWED = {
    ("awa._take_lane", "setting memo"):
        "the held-lane memo: believed only for a shard below S of the same (queue, priority)"
        " whose lock this transaction holds or takes now (test_forged_state)",
    ("awa._has_lane_memo", "setting 'awa.lane_memo'"):
        "whether the transaction has a lane memo, read by the fast paths of awa.enqueue and"
        " awa.enqueue_batch only to choose between them and awa._take_lane, which choose"
        " alike; awa._take_lane checks the memo itself (test_forged_state, test_lane_choice,"
        " test_path_differential)",
    ("awa._lane_wait_total", "setting 'awa.lane_lock_wait_us'"):
        "the wait total for the client's metric: a non-number counts as 0, and forging it"
        " misleads only the caller's own numbers (test_forged_state)",
    ("awa._check_no_run", "setting 'transaction_isolation'"):
        "only after a worker call found no run, to raise instead of answering false from a"
        " snapshot older than a rotation of awa.running; the caller can make its own call"
        " fail, never make it change a run it does not hold",
    ("awa._check_snapshot_current", "setting 'transaction_isolation'"):
        "only to skip, in read committed, the look for a snapshot older than a rewrite,"
        " which that level never has; the setting is the transaction's real level (a"
        " caller cannot claim read committed in a repeatable read transaction), so the"
        " caller can make its own job-tool call refused, never make one answer from an"
        " emptied table (test_jobs)",
    ("awa._check_read_committed", "setting 'transaction_isolation'"):
        "only to refuse an isolation level whose snapshot is older than the lock of the"
        " TRUNCATE that follows (awa.rotate_running, awa.compact_lane_hints); the caller can"
        " make it refuse, never make it truncate rows it did not read"
        " (test_running_slots, test_lane_hints_compaction)",
    ("awa._note_run", "setting 'transaction_read_only'"):
        "only to skip the record of a maintenance call in a read-only transaction, where"
        " the call could write nothing else either: a caller can leave out the record of a"
        " call that did no maintenance, never record one or hide one that did (ADR 045,"
        " test_standby)",
    ("awa.promote_due", "setting 'lock_timeout'"):
        "only to put the caller's lock_timeout back after the promote's own bounded wait"
        " for lanes: it decides nothing (test_promote_held_lanes)",
    ("awa._sequence_value", "setting 'server_version_num'"):
        "the server's version, which no session can set (an internal setting): it only"
        " chooses how to read the same sequence value (test_overview_differential runs both)",
    ("awa._move_staged", "table awa.copy_staging"): _STAGING,
    ("awa._move_staged_one_lane", "table awa.copy_staging"): _STAGING,
    ("awa._move_staged_by_key", "table awa.copy_staging"): _STAGING,
    ("awa._move_staged_sets", "table awa.copy_staging"): _STAGING,
    ("awa._move_staged_in_batches", "table awa.copy_staging"): _STAGING,
    ("awa.move_staged", "table awa.copy_staging"):
        "maintenance: moves committed transactions' leftover rows by staged_xid, one mover"
        " per transaction under a try-lock",
}


def _caller_writable_tables(conn) -> list[str]:
    return [r[0] for r in conn.execute(
        "select c.oid::regclass::text from pg_catalog.pg_class c"
        " where c.relnamespace = 'awa'::regnamespace and c.relkind in ('r', 'p', 'v', 'm')"
        "   and exists (select from unnest(%s::text[]) as r (role)"
        "               where has_table_privilege(r.role, c.oid, 'INSERT, UPDATE')"
        "                  or has_any_column_privilege(r.role, c.oid, 'INSERT, UPDATE'))"
        " order by 1", [RUNTIME_ROLES])]


def _reads(conn) -> set[tuple[str, str]]:
    tables = _caller_writable_tables(conn)
    found = set()
    for name, body in conn.execute(
            "select p.oid::regproc::text, lower(p.prosrc) from pg_catalog.pg_proc p"
            " where p.pronamespace = 'awa'::regnamespace"):
        for arg in re.findall(r"current_setting\(\s*([^,)]+)", body):
            found.add((name, f"setting {arg.strip()}"))
        if re.search(r"\bpg_temp\s*\.", body):
            found.add((name, "temp object"))
        for table in tables:
            if table in body:
                found.add((name, f"table {table}"))
    return found


def test_every_caller_settable_read_in_a_definer_is_allowed(db):
    with db.connect() as conn:
        found = _reads(conn)
    unlisted = sorted(found - set(ALLOWED))
    assert not unlisted, f"reads of caller-settable state with no reason on the list: {unlisted}"
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"listed reads that no function makes any more: {stale}"


def test_the_scan_sees_a_new_read(db):
    """The scan is not blind: a new function that reads a setting is caught."""
    with db.connect() as conn:
        conn.execute("create function awa._probe() returns text language sql"
                     " as $$ select pg_catalog.current_setting('awa.probe', true) $$")
        conn.execute("set check_function_bodies = off")
        conn.execute("create function awa._probe_temp() returns bigint language sql"
                     " as $$ select count(*) from pg_temp.scratch $$")
        found = _reads(conn)
        tables = _caller_writable_tables(conn)
    assert ("awa._probe", "setting 'awa.probe'") in found
    assert ("awa._probe_temp", "temp object") in found
    assert tables == ["awa.copy_staging"]


JOB_TOOLS = {"awa.job", "awa.jobs", "awa.count_jobs", "awa.cancel_job", "awa.cancel_jobs",
             "awa.retry_job", "awa.retry_jobs", "awa._job_at", "awa._requeue",
             "awa._cancel_waiting", "awa._queue_ids", "awa.failure_summary",
             "awa._error_class"}


def test_the_scan_covers_the_job_tools_and_they_read_nothing_a_caller_sets(db):
    """The operators' job tools (ADR 025) are in the catalog the scan reads,
    and none of them reads a setting, a temp object or a caller-written
    table (their retries take lanes through awa._take_lane, whose memo read
    is on the list; test_forged_state retries with forged memos)."""
    with db.connect() as conn:
        names = {r[0] for r in conn.execute(
            "select p.oid::regproc::text from pg_catalog.pg_proc p"
            " where p.pronamespace = 'awa'::regnamespace")}
        found = _reads(conn)
    assert names >= JOB_TOOLS
    assert not {name for name, _ in found} & JOB_TOOLS


# The functions of the deadlines and backoff work (ADR 026): each is in the
# catalog the scan reads, and reads nothing a caller can set (the COPY
# movers' reads of the new column are the _STAGING entries above).
NEW_IN_ADR_026 = ["awa.set_max_run_time", "awa.set_retry_policy",
                  "awa._check_max_run_time", "awa.claim", "awa.heartbeat",
                  "awa.rescue_expired", "awa._retry_or_fail", "awa.enqueue_batch"]


def test_the_deadline_and_backoff_functions_are_scanned_and_read_nothing_settable(db):
    with db.connect() as conn:
        names = {r[0] for r in conn.execute(
            "select p.oid::regproc::text from pg_catalog.pg_proc p"
            " where p.pronamespace = 'awa'::regnamespace")}
        found = _reads(conn)
    assert set(NEW_IN_ADR_026) <= names
    reads = sorted(r for r in found if r[0] in NEW_IN_ADR_026)
    assert not reads, reads
