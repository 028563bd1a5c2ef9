-- 0010_copy_unlogged: staged COPY rows never outlive their transaction
-- (ADR 010): the transaction that COPYs them moves them into the lanes, at
-- awa.enqueue_copied() or at the latest at its commit. So the staging table
-- needs no WAL: after a crash it is empty, and so is every transaction that
-- could have had rows in it.

alter table awa.copy_staging set unlogged;

-- Rows are found and deleted through (staged_xid, staged_id).
alter table awa.copy_staging drop constraint copy_staging_pkey;

comment on table awa.copy_staging is
'COPY target for producers: COPY awa.copy_staging (queue, priority, ordering_key, kind, '
'args, run_at, max_attempts) FROM STDIN, then select awa.enqueue_copied() in the same '
'transaction (or just commit: the rows are enqueued at commit). Unlogged: no staged row '
'outlives its transaction.';

-- One row per transaction that COPYed into staging; its deferred trigger
-- enqueues what that transaction left staged, at commit.
create table awa.copy_pending (
    staged_xid xid8 primary key
);

comment on table awa.copy_pending is
'Transactions with COPY rows staged; a deferred trigger moves their rows into the lanes '
'at commit, so none is left behind.';
