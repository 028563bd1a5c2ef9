-- drops.sql: dropping an empty queue, in two steps (ADR 044).
--
-- An enqueue reads the queue's row by name, then locks a lane and inserts
-- (sql/enqueue.sql): a queue removed between the two would leave the job in
-- a lane no queue has. So awa.drop_queue only renames the row to a name no
-- lookup can use and pauses it; awa.finish_drops removes the queue later,
-- once no session can still hold the old row, as awa.retire_lanes retires
-- lanes (ADR 041), and puts it back if a job came late.

-- Function: awa._queue_contents(queue_id integer) returns record
-- What a physical queue still holds, all read with one snapshot (the
-- calling statement's): ready rows (in any of its lanes), scheduled rows,
-- running rows, unique keys held (by a job, or for a window not yet
-- passed) and kept terminal rows. awa.ready_late rows are not counted: each
-- names a ready row, counted as ready while it is there, and is garbage
-- once that row is gone (awa.prune_ready_late removes it).
-- Calls: awa._key_holds
-- Writes: nothing
create or replace function awa._queue_contents(
    queue_id integer,
    out ready bigint,
    out scheduled bigint,
    out running bigint,
    out unique_keys bigint,
    out finished bigint
)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select
        (select count(*)
           from awa.lanes as l
           join awa.ready as r on r.lane_id = l.lane_id
          where l.queue_id = _queue_contents.queue_id),
        (select count(*) from awa.scheduled as s where s.queue_id = _queue_contents.queue_id),
        (select count(*) from awa.running as x where x.queue_id = _queue_contents.queue_id),
        (select count(*)
           from awa.unique_keys as u
          where u.queue_id = _queue_contents.queue_id
            and awa._key_holds(u.held_until)),
        (select count(*) from awa.finished as f where f.queue_id = _queue_contents.queue_id)
$$;

-- Function: awa._rename_history(queue text, new_name text) returns void
-- The history that names a queue (its changes of S, awa.shard_changes, and
-- the auto-scaler's decisions, awa.autoscale_decisions) moved to the name
-- its row takes: a drop's '#dropped#<queue_id>', or the name a queue put
-- back gets. Read by name (awa._shards_at, the auto-scaler's cooldown, the
-- admin's history), it would otherwise be a new queue's of the old name.
-- The decisions' counts (awa.autoscale_decision_counts) do not move: a drop
-- deletes them.
-- Calls: nothing
-- Writes: awa.autoscale_decisions, awa.shard_changes
create or replace function awa._rename_history(queue text, new_name text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    update awa.shard_changes as c set queue = new_name where c.queue = _rename_history.queue;
    update awa.autoscale_decisions as d set queue = new_name
     where d.queue = _rename_history.queue;
end;
$$;

-- Function: awa.drop_queue(queue text, discard_finished boolean default false) returns boolean
-- Drops an empty queue, first step: its settings row is renamed
-- '#dropped#<queue_id>' (no enqueue, claim or operator call can look that
-- up: every name a caller gives is refused with '#', and a stripe's name
-- never starts with it), paused, and marked with the old name, the pause
-- state and this transaction. From its commit, an enqueue to the name
-- creates a new queue. awa.finish_drops() (awa maintain) removes the queue
-- later, with its lanes and sequences, and gives its place under the queue
-- limit back; a job that a session routed to it by the old row meanwhile
-- makes it put the queue back instead (ADR 044).
-- Empty: no ready, scheduled or running job, no unique key held, no kept
-- terminal job; with discard_finished, its kept terminal jobs and the keys
-- their windows hold are deleted first (in this transaction: a refusal
-- deletes nothing), after a prune or carry in flight ends (none starts
-- until the drop ends). Partitions, stripes and queues that have them are
-- refused: not supported yet. Its history of S and decisions takes the
-- row's new name (awa._rename_history); its decision counts are deleted,
-- so a new queue of the name starts from 0 (a queue put back too). Role:
-- awa_operator. Returns true.
-- Errors: 22004 null; 22023 bad name; 42704 unknown queue; 0A000 a
--   partition or stripe, or a queue with partitions or stripes; 55006 not
--   empty (naming what it holds); 25006 on a standby; 25000 the transaction
--   is not read committed (a snapshot older than the call would miss jobs).
-- Calls: awa._check_read_committed, awa._lock_leader, awa._lock_queue_provisioning,
--   awa._queue_contents, awa._rename_history, awa._require_primary
-- Writes: awa.autoscale_decision_counts, awa.finished, awa.queue_meta, awa.unique_keys
create or replace function awa.drop_queue(queue text, discard_finished boolean default false)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    meta awa.queue_meta;
    held record;
begin
    if discard_finished is null then
        raise exception 'discard_finished must not be null' using errcode = '22004';
    end if;
    perform awa._require_primary('drop a queue');
    -- Its read of the contents must see every job committed before it.
    perform awa._check_read_committed('awa.drop_queue()');
    -- The provisioning lock, then the row (42704 if another transaction
    -- dropped it while this one waited): the order of a change of S.
    meta := awa._lock_queue_provisioning(queue, create_missing => false);
    if meta.root_queue is not null then
        raise exception 'queue % is a partition or stripe of %: dropping one is not supported yet',
            quote_literal(queue), quote_literal(meta.root_queue)
            using errcode = '0A000';
    end if;
    if meta.has_linked or meta.partitions > 1 or meta.stripes > 1 then
        raise exception 'queue % has partitions or stripes: dropping it is not supported yet',
            quote_literal(queue)
            using errcode = '0A000';
    end if;
    if discard_finished then
        -- A carry moves a row by deleting it and inserting a copy: a delete
        -- that waited for a carry skipped the rows it moved, and its snapshot
        -- could not see the copies. The prune's leader lock waits for a
        -- prune or carry in flight and keeps the next out until this ends.
        perform awa._lock_leader('prune');
        delete from awa.finished as f where f.queue_id = meta.queue_id;
        delete from awa.unique_keys as u
         where u.queue_id = meta.queue_id and u.held_until is not null;
    end if;
    -- The row for update too, unlike a change: that waits for an enqueue of
    -- a job for later in flight (its key share), so the read of the contents
    -- below sees the job. Last: while this drop waited for anything with it
    -- (the provisioning lock, terminal rows a retry holds), a producer that
    -- holds a lane would wait for it at its job for later, and the holder
    -- may wait for that lane (40P01, ADR 049).
    perform from awa.queue_meta as m where m.queue_id = meta.queue_id for update;
    -- The tables a rewrite, a rotation or a prune empties by TRUNCATE, held
    -- before the read, as awa.finish_drops holds them: a read that waited
    -- for one of those at its statement's start read with a snapshot from
    -- before it, which sees the emptied table and not the rows put back,
    -- and counted a queue with jobs as empty.
    lock table awa.ready, awa.running, awa.finished, awa.scheduled in access share mode;
    select c.* into strict held from awa._queue_contents(meta.queue_id) as c;
    if held.ready + held.scheduled + held.running + held.unique_keys + held.finished > 0 then
        raise exception 'queue % is not empty: % ready, % scheduled, % running, '
                        '% unique keys held, % terminal jobs kept',
            quote_literal(queue), held.ready, held.scheduled, held.running, held.unique_keys,
            held.finished
            using errcode = '55006',
                  hint = 'Let its jobs finish or cancel them (awa jobs); pass discard_finished '
                         '=> true to delete its kept terminal jobs with the drop.';
    end if;
    update awa.queue_meta as m
       set queue = '#dropped#' || m.queue_id, paused = true, dropped_name = m.queue,
           dropped_paused = m.paused, dropped_xact = pg_current_xact_id(), dropped_at = now()
     where m.queue_id = meta.queue_id;
    perform awa._rename_history(meta.queue, '#dropped#' || meta.queue_id);
    -- The name's counters: a new queue of the name starts from 0. After the
    -- rename, not before: a tick that folded a hold into the queue's latest
    -- decision holds that row, which the rename waits for, and would wait
    -- for this drop at its count of the hold (40P01).
    delete from awa.autoscale_decision_counts as c where c.queue = meta.queue;
    return true;
end;
$$;

-- Function: awa._recovery_name(queue text, queue_id integer) returns text
-- A name no queue has, for a dropped queue that a job came to late while
-- another queue took its name: '<queue>~dropped-<queue_id>' (then -2, -3,
-- ...), the name cut so the whole is a queue name (awa._queue_name_ok).
-- Calls: awa._queue_name_ok
-- Writes: nothing
create or replace function awa._recovery_name(queue text, queue_id integer)
returns text
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    suffix text := '~dropped-' || queue_id;
    base text := queue;
    candidate text;
    n integer := 1;
begin
    loop
        -- The length rule's one home; the name holds no '#' (stripes are never dropped).
        while not awa._queue_name_ok(base || suffix) loop
            base := left(base, -1);
        end loop;
        candidate := base || suffix;
        exit when not exists (select from awa.queue_meta as m where m.queue = candidate);
        n := n + 1;
        suffix := '~dropped-' || queue_id || '-' || n;
    end loop;
    return candidate;
end;
$$;

-- Function: awa._drop_sequences() returns void
-- Drops the sequences of queues awa.finish_drops removed, once the removal
-- has committed in another transaction and no other session holds a
-- snapshot older than it (awa._oldest_snapshot): one that does may still
-- read the rows that named them, and a watch that read a dropped sequence
-- would fail. A sequence whose lock is not granted in time is left to the
-- next call.
-- Calls: awa._before_every_snapshot, awa._oldest_snapshot
-- Writes: awa.dropped_sequences
create or replace function awa._drop_sequences()
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    d record;
begin
    for d in
        select x.seq, n.nspname, c.relname
          from awa.dropped_sequences as x
         cross join (select awa._oldest_snapshot() as xmin) as o
          left join pg_class as c on c.oid = x.seq
          left join pg_namespace as n on n.oid = c.relnamespace
         where awa._before_every_snapshot(x.removed_xact, o.xmin)
         order by x.seq
    loop
        begin
            -- IF EXISTS: a concurrent call may have dropped it while this
            -- one waited for its lock (42P01 rolled back this whole call).
            if d.relname is not null then
                execute format('drop sequence if exists %I.%I', d.nspname, d.relname);
            end if;
            delete from awa.dropped_sequences as x where x.seq = d.seq;
        exception when lock_not_available then
            null;  -- a session holds it (a watch reading it): the next call
        end;
    end loop;
end;
$$;

-- Function: awa._remove_dropped(meta awa.queue_meta) returns void
-- Removes a dropped queue that awa.finish_drops found empty, holding its
-- row and every lane: the rows that name it (its lanes, their claim hints,
-- awa.ready_late and expired unique keys, contention samples, its
-- auto-scaler policy, its settings row), its place in awa.queue_limit;
-- its sequences go to awa.dropped_sequences, dropped by a later call. The
-- history that names it only (awa.shard_changes, awa.autoscale_decisions,
-- under the name the drop gave it, and awa.runtime_queues) is kept, and
-- pruned as it is for every queue.
-- Calls: nothing
-- Writes: awa.autoscale_policy, awa.contention_samples, awa.dropped_sequences, awa.lane_heads,
--   awa.lane_hints, awa.lanes, awa.queue_limit, awa.queue_meta, awa.ready_late, awa.unique_keys
create or replace function awa._remove_dropped(meta awa.queue_meta)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    insert into awa.dropped_sequences (seq)
    select s.seq
      from (
          select l.seq from awa.lanes as l where l.queue_id = meta.queue_id
          union all
          select unnest(array[
              meta.completed_seq, meta.failed_seq, meta.cancelled_seq, meta.retried_seq
          ])
      ) as s
     where s.seq is not null
    on conflict do nothing;
    delete from awa.lane_hints as h
     where h.lane_id in (select l.lane_id from awa.lanes as l where l.queue_id = meta.queue_id);
    delete from awa.lane_heads as h
     where h.lane_id in (select l.lane_id from awa.lanes as l where l.queue_id = meta.queue_id);
    delete from awa.ready_late as y where y.queue_id = meta.queue_id;
    delete from awa.unique_keys as u where u.queue_id = meta.queue_id;
    delete from awa.contention_samples as s where s.queue_id = meta.queue_id;
    delete from awa.autoscale_policy as p where p.queue_id = meta.queue_id;
    delete from awa.lanes as l where l.queue_id = meta.queue_id;
    delete from awa.queue_meta as m where m.queue_id = meta.queue_id;
    update awa.queue_limit as q set queues = greatest(q.queues - 1, 0);
end;
$$;

-- Function: awa.finish_drops() returns table (queue, queue_id, outcome, named)
-- The second step of awa.drop_queue (ADR 044): removes each dropped queue
-- (awa._remove_dropped) once no job can come to it any more, and drops the
-- sequences of queues removed before (awa._drop_sequences). A session can
-- route a job to a dropped queue by its old row while it holds a snapshot
-- older than the drop (a repeatable read producer for its whole
-- transaction, a read committed one for the statement), and its job is
-- not committed until its transaction is. So a queue is taken only when:
-- 1. its drop committed in another transaction, and no other session holds
--    a snapshot older than it (awa._oldest_snapshot, as awa.retire_lanes);
-- 2. its row is locked (an insert into awa.scheduled holds a key share of
--    it, by the foreign key, until it commits) and so is every lane (an
--    enqueue holds its lane's lock until it commits): if another session
--    holds one, the queue is left to the next call;
-- 3. read again with a snapshot taken after those locks, it is empty
--    (awa._queue_contents).
-- After 1 no session can route a job to it, after 2 none has one in
-- flight, so 3 sees every job it will ever hold. A queue that holds a job
-- (one came late) is put back instead, never removed: under its old name
-- with its pause state, or under awa._recovery_name when a new queue has
-- taken the name, with the unique keys its late jobs took under the
-- dropped name moved to that name's scope. awa.ready, awa.lane_hints, awa.running, awa.finished and
-- awa.scheduled are held (ACCESS SHARE) for the call, so that no rewrite by
-- TRUNCATE comes between a snapshot and a read of them. Never waits more than
-- 100 ms for a lock, nor at all for the provisioning lock (a creation
-- holding it may wait for awa.queue_limit, which a removal holds): what it
-- did not get is left to the next call; a call stops after the queue that
-- takes its lane locks past 1,024.
-- On a standby: no rows at once (the primary finishes drops).
-- Role: awa_maintenance. Returns one row per queue it removed (outcome
-- 'removed') or put back ('restored' under its old name, 'renamed' under
-- the name `named`); queue is the name the queue had.
-- Errors: 25000 the calling transaction is not read committed.
-- Calls: awa._before_every_snapshot, awa._check_read_committed, awa._drop_sequences,
--   awa._join_unique_scope, awa._lock_class_lane, awa._note_run, awa._oldest_snapshot,
--   awa._queue_contents, awa._recovery_name, awa._remove_dropped, awa._rename_history,
--   awa._try_leader
-- Writes: awa.queue_meta
create or replace function awa.finish_drops()
returns table (queue text, queue_id integer, outcome text, named text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '100ms'
as $$
declare
    candidates integer[];
    drops xid8[];
    qid integer;
    meta awa.queue_meta;
    busy bigint;
    tried bigint;
    locked bigint := 0;
    held record;
    back text;
begin
    perform awa._check_read_committed('awa.finish_drops()');
    -- A standby finishes no drop (its primary does): the rows it would
    -- lock cannot be locked there (25006).
    if pg_is_in_recovery() then
        return;
    end if;
    perform awa._note_run('drops');
    -- The sessions are read afresh in the statement that reads the removals,
    -- then in the one that reads the drops, so after those committed: a
    -- read of the sessions kept from before would miss a snapshot taken
    -- before a drop that committed since.
    perform pg_stat_clear_snapshot();
    perform awa._drop_sequences();
    perform pg_stat_clear_snapshot();
    select array_agg(m.queue_id order by m.queue_id),
           array_agg(m.dropped_xact order by m.queue_id)
      into candidates, drops
      from awa.queue_meta as m
     cross join (select awa._oldest_snapshot() as xmin) as o
     where m.dropped_xact is not null
       and awa._before_every_snapshot(m.dropped_xact, o.xmin);
    if candidates is null then
        return;
    end if;
    begin
        lock table awa.ready, awa.lane_hints, awa.running, awa.finished, awa.scheduled
            in access share mode;
    exception when lock_not_available then
        return;
    end;
    for i in 1 .. cardinality(candidates) loop
        exit when locked >= 1024;
        qid := candidates[i];
        meta := null;
        begin
            -- The drop the list read, not a later one: a queue put back and
            -- dropped again since is not yet before every snapshot.
            select m.* into meta from awa.queue_meta as m
             where m.queue_id = qid and m.dropped_xact = drops[i]
               for update;
        exception when lock_not_available then
            continue;  -- an insert into awa.scheduled in flight, or a change: the next call
        end;
        continue when meta.queue_id is null;
        -- Every lane tried (a filter is evaluated for each row).
        select count(*) filter (
                   where not pg_try_advisory_xact_lock(awa._lock_class_lane(), l.lane_id)
               ),
               count(*)
          into busy, tried
          from awa.lanes as l
         where l.queue_id = qid;
        locked := locked + tried;
        continue when busy > 0;
        -- A job committed before those locks is seen now.
        select c.* into strict held from awa._queue_contents(qid) as c;
        begin
            if held.ready + held.scheduled + held.running + held.unique_keys + held.finished
               = 0 then
                perform awa._remove_dropped(meta);
                outcome := 'removed';
                named := null;
            else
                -- A job came late: the queue goes back, never away. The
                -- provisioning lock is tried, not waited for: a removal
                -- before it holds awa.queue_limit, which a queue's creation
                -- waits for while it holds that lock (ADR 049).
                continue when not awa._try_leader('provisioning');
                if exists (select from awa.queue_meta as m where m.queue = meta.dropped_name) then
                    back := awa._recovery_name(meta.dropped_name, qid);
                    outcome := 'renamed';
                else
                    back := meta.dropped_name;
                    outcome := 'restored';
                end if;
                update awa.queue_meta as m
                   set queue = back, paused = m.dropped_paused, dropped_name = null,
                       dropped_paused = null, dropped_xact = null, dropped_at = null
                 where m.queue_id = qid;
                perform awa._rename_history('#dropped#' || qid, back);
                -- A late job's unique key was taken under the dropped name
                -- (its enqueue read the row before the drop, the scope after).
                perform awa._join_unique_scope('#dropped#' || qid, back);
                named := back;
            end if;
        exception when lock_not_available then
            continue;  -- a row or table another session holds: the next call
        end;
        queue := meta.dropped_name;
        queue_id := qid;
        return next;
    end loop;
end;
$$;

select awa._grant_execute('awa._queue_contents(integer)');
select awa._grant_execute('awa._rename_history(text, text)');
select awa._grant_execute('awa.drop_queue(text, boolean)', 'operator');
select awa._grant_execute('awa._recovery_name(text, integer)');
select awa._grant_execute('awa._drop_sequences()');
select awa._grant_execute('awa._remove_dropped(awa.queue_meta)');
select awa._grant_execute('awa.finish_drops()', 'maintenance');
select awa._grant_select('awa.dropped_sequences', 'reader', 'operator');
