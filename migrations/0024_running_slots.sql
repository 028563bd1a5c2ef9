-- 0024_running_slots: awa.running in slots emptied by TRUNCATE (ADR 034).
--
-- Every claim inserts a row into awa.running and every end of a run
-- deletes it. While a snapshot older than those deletes is held open (a
-- long report, a forgotten BEGIN, a standby with hot_standby_feedback),
-- vacuum can remove none of them: ten minutes of one held snapshot left
-- some 850,000 dead rows. awa.running becomes a table partitioned by slot:
-- slots 0 and 1 take the claims of alternate blocks of run leases
-- (awa._running_slot), and awa.rotate_running() empties the slot that is
-- not being written with TRUNCATE, after carrying its live rows into slot
-- 2, running_carried. A TRUNCATE removes dead rows whatever snapshot is
-- held.
--
-- The table as it was becomes slot 2: renamed, given the slot column (a
-- constant default, so no rewrite) and attached, so its rows stay where
-- they are and nothing is copied. Its row type follows it, so the earlier
-- function layer's awa._finish and awa._retry_or_fail take running_carried
-- rows until this upgrade's layer drops them (sql/retired.sql); until then
-- that layer's claims, which name no slot, insert into slot 2, and its
-- completes find them there. A session of that layer opened after this
-- migration and before the layer's apply cannot fail a job (its awa.fail
-- passes an awa.running row to an awa._finish that takes a running_carried
-- one); the job stays running and its lease's expiry sends it back.
--
-- Holds an ACCESS EXCLUSIVE lock on awa.running for the rename and the
-- attach (it waits for claims and completes in flight, bounded by
-- --lock-timeout); awa.running holds only the jobs running now.

alter table awa.running rename to running_carried;
-- Its primary key becomes the partitioned table's (job_id, slot), which
-- within one slot is job_id: built again by the attach below.
alter table awa.running_carried drop constraint running_pkey;
alter index awa.running_lease_expires_at_idx rename to running_carried_lease_expires_at_idx;
alter table awa.running_carried add column slot smallint not null default 2;

create table awa.running (
    like awa.running_carried including defaults,
    constraint running_pkey primary key (job_id, slot)
) partition by list (slot);

create index running_lease_expires_at_idx on awa.running (lease_expires_at);

create table awa.running_0 partition of awa.running for values in (0);
create table awa.running_1 partition of awa.running for values in (1);
-- In a DO block only because sqlfluff's postgres dialect does not parse
-- ATTACH PARTITION.
do $$
begin
    alter table awa.running attach partition awa.running_carried for values in (2);
end;
$$;

-- As awa.running had (0002_storage): the slots churn, so vacuum them by
-- count, not by a fraction of their size.
alter table awa.running_0 set (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000
);
alter table awa.running_1 set (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000
);

comment on table awa.running is
'Claimed jobs. run_lease changes at every claim, so a stale worker cannot finish a job. '
'Partitioned by slot (ADR 034): slots 0 and 1 take the claims of alternate blocks of '
'run leases; awa.rotate_running() empties the one not being written with TRUNCATE, '
'carrying its live rows into slot 2.';
comment on column awa.running.slot is
'0 or 1: the slot of the run lease''s block (awa._running_slot); 2: carried there by '
'awa.rotate_running() when its slot was emptied.';
comment on table awa.running_carried is
'Slot 2 of awa.running: jobs still running when their slot was emptied.';
