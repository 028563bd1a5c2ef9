-- 0005_copy_staging: where COPY ingestion lands before it enters the lanes.
--
-- Producers get INSERT on the payload columns only: they cannot read,
-- change or delete staged rows (theirs or anyone's), nor write the
-- provenance columns. The table is logged on purpose: a staged row of a
-- committed transaction survives a crash until a mover takes it.

create table awa.copy_staging (
    staged_id bigint generated always as identity primary key,
    staged_by name not null default session_user,
    staged_xid xid8 not null default pg_catalog.pg_current_xact_id(),
    queue text,
    priority smallint,
    ordering_key bytea,
    kind text,
    args jsonb,
    run_at timestamptz,
    max_attempts integer
);

create index copy_staging_xid_idx on awa.copy_staging (staged_xid, staged_id);

comment on table awa.copy_staging is
'COPY target for producers: COPY awa.copy_staging (queue, priority, ordering_key, kind, '
'args, run_at, max_attempts) FROM STDIN, then select awa.enqueue_copied() in the same '
'transaction.';
comment on column awa.copy_staging.staged_by is
'Provenance: the login that staged the row. Producers cannot write it.';
comment on column awa.copy_staging.staged_xid is
'The staging transaction; awa.enqueue_copied() moves only its own transaction''s rows.';
