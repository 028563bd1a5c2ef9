"""A comparable snapshot of everything schema awa holds in the catalog."""

from __future__ import annotations

import psycopg

# The functions the planner inlines, and so the only ones without a pinned
# search_path (sql/private.sql says why; docs/security.md lists them).
INLINED_FUNCTIONS = (
    "_lock_class_lane", "_lock_class_provisioning",
    "_lock_class_copy", "_lock_class_migrate",
    "_queue_name_ok", "_names_cover", "_priority_ok", "_max_attempts_ok", "_job_ok",
    "_sticky", "_spread", "_in_turn", "_has_lane_memo", "_lane_memo_name", "_lane_wait_total",
    "_claim_hint_step", "_claim_walk_shard", "_walked_shards", "_lane_seq_name",
    "_counter_seq_name",
    "_finished_slot_seconds", "_finished_ring_slots", "_finished_slot",
    "_retention", "_running_block_leases", "_running_slot",
    "_finished_part", "_carry_blocks", "_carry_time", "_carry_rows_locked", "_carried_slot",
    "_period",
    "_finished_slot_count", "_finished_ring",
    "_max_run_time_ok", "_in_seconds", "_ordering_key_ok",
    "_retry_default_base", "_retry_default_cap", "_retry_default_jitter", "_retry_delay",
    "_unique_scope", "_unique_ok", "_row_ok",
    "_default_priority", "_default_max_attempts", "_default_args", "_first_attempt",
    "_sticky_ok", "_one_range_ok", "_limit_ok", "_pass_bytes", "_job_bytes", "_rewrite_heap_bytes",
    "_run_at_ok", "_lease_ok", "_error_class", "_before_every_snapshot", "_retry_states",
    "_cancelled_after_failure", "_lock_rank", "_key_holds",
)

QUERIES = {
    "schema": """
        select n.nspname, pg_catalog.pg_get_userbyid(n.nspowner), n.nspacl::text
          from pg_catalog.pg_namespace n where n.nspname = 'awa'
    """,
    "relations": """
        select c.relname, c.relkind, pg_catalog.pg_get_userbyid(c.relowner),
               coalesce(c.relacl::text, ''), c.relpersistence
          from pg_catalog.pg_class c
         where c.relnamespace = 'awa'::regnamespace
         order by 1
    """,
    "columns": """
        select c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
               a.attnotnull, coalesce(pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
          from pg_catalog.pg_attribute a
          join pg_catalog.pg_class c on c.oid = a.attrelid
          left join pg_catalog.pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
         where c.relnamespace = 'awa'::regnamespace and a.attnum > 0 and not a.attisdropped
         order by 1, 2
    """,
    "constraints": """
        select c.conrelid::regclass::text, c.conname, pg_catalog.pg_get_constraintdef(c.oid)
          from pg_catalog.pg_constraint c
         where c.connamespace = 'awa'::regnamespace
         order by 1, 2
    """,
    "routines": """
        select p.oid::regprocedure::text, pg_catalog.pg_get_userbyid(p.proowner), p.prosecdef,
               coalesce(p.proconfig::text, ''), coalesce(p.proacl::text, ''), p.provolatile,
               p.proparallel, pg_catalog.md5(p.prosrc)
          from pg_catalog.pg_proc p
         where p.pronamespace = 'awa'::regnamespace
         order by 1
    """,
    "default_acl": """
        select pg_catalog.pg_get_userbyid(d.defaclrole), d.defaclnamespace::regnamespace::text,
               d.defaclobjtype, d.defaclacl::text
          from pg_catalog.pg_default_acl d
         order by 1, 2, 3
    """,
    "comments": """
        select c.relname, d.objsubid, d.description
          from pg_catalog.pg_description d
          join pg_catalog.pg_class c on c.oid = d.objoid and d.classoid = 'pg_class'::regclass
         where c.relnamespace = 'awa'::regnamespace
         order by 1, 2, 3
    """,
}


def snapshot(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    return {name: conn.execute(query).fetchall() for name, query in QUERIES.items()}
