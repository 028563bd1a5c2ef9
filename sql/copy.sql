-- copy.sql: COPY ingestion.
--
-- A producer, in one transaction:
--   COPY awa.copy_staging (queue, priority, ordering_key, kind, args, run_at,
--                          max_attempts) FROM STDIN;
--   SELECT awa.enqueue_copied();   -- optional: commit does it too
-- The rows of that transaction, and only those, go through the same
-- routing as awa.enqueue_batch, in COPY order, 10,000 at a time. A staged
-- row never outlives its transaction (ADR 010): what enqueue_copied() did
-- not move, a deferred trigger moves at commit; a rollback discards it.

-- Function: awa._move_staged(xid xid8) returns bigint
-- Moves the staged rows of one transaction into the lanes, in COPY order,
-- 10,000 rows per pass. Rows another mover holds are skipped.
create or replace function awa._move_staged(xid xid8)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
-- Each pass reads the next rows in key order and stops; a sequential or
-- bitmap scan would read (and sort) every remaining row at every pass.
set enable_seqscan = off
set enable_bitmapscan = off
set enable_hashjoin = off
set enable_mergejoin = off
as $$
declare
    moved bigint := 0;
    last_id bigint := 0;
    ids bigint[];
    queues text[];
    priorities smallint[];
    ordering_keys bytea[];
    kinds text[];
    args jsonb[];
    run_ats timestamptz[];
    max_attempts integer[];
begin
    loop
        select array_agg(s.staged_id order by s.staged_id),
               array_agg(s.queue order by s.staged_id),
               array_agg(s.priority order by s.staged_id),
               array_agg(s.ordering_key order by s.staged_id),
               array_agg(s.kind order by s.staged_id),
               array_agg(s.args order by s.staged_id),
               array_agg(s.run_at order by s.staged_id),
               array_agg(s.max_attempts order by s.staged_id)
          into ids, queues, priorities, ordering_keys, kinds, args, run_ats, max_attempts
          from (
              select c.* from awa.copy_staging as c
               where c.staged_xid = _move_staged.xid
                 -- past the rows this call already moved (and deleted), so
                 -- each pass starts where the last ended
                 and c.staged_id > last_id
               order by c.staged_id
               limit 10000
                 for update skip locked
          ) as s;
        exit when ids is null;
        perform count(*) from awa._enqueue_rows(
            queues, kinds, args, priorities, ordering_keys, run_ats, max_attempts,
            'COPY row', moved
        );
        delete from awa.copy_staging as c
         where c.staged_xid = _move_staged.xid and c.staged_id = any(ids);
        moved := moved + cardinality(ids);
        last_id := ids[cardinality(ids)];
    end loop;
    return moved;
end;
$$;

-- Function: awa.enqueue_copied() returns bigint
-- Enqueues the rows this transaction COPYed into awa.copy_staging and
-- returns how many. Role: awa_producer.
-- Errors: as awa.enqueue_batch, naming the bad row as "COPY row N (1-based)";
--   the whole transaction's COPY then fails and nothing is enqueued.
create or replace function awa.enqueue_copied()
returns bigint
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
    select awa._move_staged(pg_current_xact_id())
$$;

-- Function: awa.move_staged(max_transactions integer default 100) returns bigint
-- Moves rows that committed transactions staged but never enqueued, oldest
-- first, each staging transaction's rows in COPY order. Since migration
-- 0010 commit moves them, so this finds rows only from transactions that
-- committed before it. Safe to run from several sessions and
-- to interrupt: a row is moved and deleted in one transaction. Role:
-- awa_maintenance. Returns how many rows it moved.
create or replace function awa.move_staged(max_transactions integer default 100)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    moved bigint := 0;
    xid xid8;
begin
    if max_transactions is null or max_transactions < 0 then
        raise exception 'max_transactions must be 0 or more, got %',
            coalesce(max_transactions::text, 'null')
            using errcode = '22023';
    end if;
    for xid in
        select c.staged_xid
          from awa.copy_staging as c
         where pg_xact_status(c.staged_xid) = 'committed'
         group by c.staged_xid
         order by min(c.staged_id)
         limit max_transactions
    loop
        moved := moved + awa._move_staged(xid);
    end loop;
    return moved;
end;
$$;

-- Function: awa._note_copy() returns trigger
-- After each COPY (or INSERT) statement into awa.copy_staging: records the
-- transaction in awa.copy_pending, once, so that its commit trigger fires.
create or replace function awa._note_copy()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    insert into awa.copy_pending (staged_xid) values (pg_catalog.pg_current_xact_id())
    on conflict do nothing;
    return null;
end;
$$;

-- Function: awa._move_at_commit() returns trigger
-- Deferred to commit: enqueues the rows the committing transaction left
-- staged (none when it called awa.enqueue_copied()). An error here (a bad
-- row) fails the commit, naming the row, and nothing is enqueued.
create or replace function awa._move_at_commit()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform awa._move_staged(new.staged_xid);
    delete from awa.copy_pending as p where p.staged_xid = new.staged_xid;
    return null;
end;
$$;

create or replace trigger copy_staging_note
after insert on awa.copy_staging
for each statement execute function awa._note_copy();

-- Constraint triggers have no OR REPLACE.
drop trigger if exists copy_pending_move on awa.copy_pending;
create constraint trigger copy_pending_move
after insert on awa.copy_pending
deferrable initially deferred
for each row execute function awa._move_at_commit();

select awa._grant_execute('awa._move_staged(xid8)');
select awa._grant_execute('awa._note_copy()');
select awa._grant_execute('awa._move_at_commit()');
select awa._grant_execute('awa.enqueue_copied()', 'producer');
select awa._grant_execute('awa.move_staged(integer)', 'maintenance');
select awa._grant_insert(
    'awa.copy_staging',
    array['queue', 'priority', 'ordering_key', 'kind', 'args', 'run_at', 'max_attempts'],
    'producer'
);
