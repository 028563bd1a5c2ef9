-- compaction.sql: the tables rewritten with TRUNCATE while a snapshot is
-- held.
--
-- A row deleted while a snapshot is held open (a long report, a forgotten
-- BEGIN, a standby with hot_standby_feedback) cannot be removed by vacuum
-- until that snapshot ends; only a TRUNCATE removes it whatever snapshot
-- is held. Two tables lose rows at the rate of the queue's work:
--
-- awa.lane_hints: a claim moves a lane's hint by inserting the new one and
-- deleting the one it read (awa._advance_lane_hints, ADR 030).
-- awa.compact_lane_hints() keeps each lane's highest hint, the one row
-- claims read, and drops the rest (ADR 035).
--
-- awa.ready: every claim deletes the row it takes. awa.compact_ready()
-- copies the live rows aside, truncates the table and copies them back
-- (ADR 036).
--
-- awa.scheduled: every promotion of a due job (awa.promote_due) and every
-- cancel of a job for later deletes its row. awa.compact_scheduled() copies
-- the live rows aside, truncates the table and copies them back (ADR 047).
--
-- All act only once their table holds more dead rows than vacuum leaves
-- behind when no snapshot is held, take the table's ACCESS EXCLUSIVE lock
-- for at most 100 ms (else they skip, to be called again), and refuse a
-- transaction that is not read committed: their statements must read with
-- snapshots taken after that lock (awa._check_read_committed).
-- awa.rotate_running (sql/running.sql) does the same for awa.running, by
-- slots.

-- Function: awa._lane_hints_bytes_allowed() returns bigint
-- How large awa.lane_hints' heap may grow before it is compacted: 128 kB,
-- about 3,000 moves of a hint while a snapshot is held, and 128 bytes per
-- lane, about three times what one hint per lane takes once compacted.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lane_hints_bytes_allowed()
returns bigint
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select 131072 + 128 * count(*) from awa.lanes
$$;

-- Function: awa.compact_lane_hints() returns integer
-- When awa.lane_hints' heap is larger than awa._lane_hints_bytes_allowed,
-- rewrites it as each lane's highest hint: under the table's ACCESS
-- EXCLUSIVE lock, waited for at most 100 ms, it reads the highest hints,
-- truncates the table and inserts them again, in one transaction. Every
-- claim reads the table, so the claims in flight finish first and the
-- next ones wait for the rewrite (a few milliseconds for thousands of
-- lanes); if the lock is not had, the call changes nothing and returns 0,
-- to be made again. A second concurrent call waits for the first at most
-- 100 ms, then finds the table small or returns 0. Run it every few seconds (awa maintain does); it
-- rewrites only while a held snapshot keeps vacuum from the dead hints.
-- A claim reads only a lane's highest hint, and the rewrite keeps it, so
-- no claim starts lower than it would have.
-- Role: awa_maintenance.
-- Returns: 1 if it rewrote the table, else 0.
-- Errors: 25000 the calling transaction is not read committed: a snapshot
-- older than the lock would miss the hints committed since, and lose them.
-- Calls: awa._check_read_committed, awa._lane_hints_bytes_allowed, awa._note_run
-- Writes: awa.lane_hints
create or replace function awa.compact_lane_hints()
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '100ms'
as $$
declare
    kept_lanes integer[];
    kept_heads bigint[];
begin
    perform awa._check_read_committed('awa.compact_lane_hints()');
    perform awa._note_run('lane_hints');
    -- The size read waits for the table's lock too: a rewrite in flight
    -- holds it, and does this call's work.
    begin
        if pg_relation_size('awa.lane_hints') <= awa._lane_hints_bytes_allowed() then
            return 0;
        end if;
        lock table awa.lane_hints in access exclusive mode;
    exception when lock_not_available then
        return 0;
    end;
    -- A call that held the lock before this one may have rewritten it.
    if pg_relation_size('awa.lane_hints') <= awa._lane_hints_bytes_allowed() then
        return 0;
    end if;
    select array_agg(h.lane_id), array_agg(h.head_seq)
      into kept_lanes, kept_heads
      from (select y.lane_id, max(y.head_seq) as head_seq
              from awa.lane_hints as y
             group by y.lane_id) as h;
    truncate awa.lane_hints;
    insert into awa.lane_hints (lane_id, head_seq)
    select k.lane_id, k.head_seq
      from unnest(kept_lanes, kept_heads) as k (lane_id, head_seq);
    return 1;
end;
$$;

-- Function: awa._rewrite_heap_bytes() returns bigint
-- The largest table file awa.compact_ready and awa.compact_scheduled
-- rewrite, 1 GB: the copy-out reads the whole heap, dead rows included,
-- under the table's ACCESS EXCLUSIVE lock, about a second a gigabyte on
-- two cores; past it the rewrite would hold every writer up for longer,
-- or pass the caller's statement timeout and roll back after holding them
-- up that long, again at every call. Vacuum takes the dead rows once the
-- snapshot that keeps them ends.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._rewrite_heap_bytes()
returns bigint
language sql
immutable parallel safe
as $$
    select 1073741824::bigint
$$;

-- Function: awa._rewrite_due(rel regclass) returns boolean
-- The rule awa.compact_ready and awa.compact_scheduled share, from the
-- cumulative statistics' counts of the table's rows: more than 200,000
-- dead rows and more than its live ones (a rewrite copies at most one row
-- per row deleted since the last), at most 100,000 live rows (writers
-- wait for the copy), and a file of at most awa._rewrite_heap_bytes()
-- (the copy-out reads the dead rows too).
-- Calls: awa._rewrite_heap_bytes
-- Writes: nothing
create or replace function awa._rewrite_due(rel regclass)
returns boolean
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select pg_stat_get_dead_tuples(rel) > 200000 + pg_stat_get_live_tuples(rel)
       and pg_stat_get_live_tuples(rel) <= 100000
       and pg_relation_size(rel) <= awa._rewrite_heap_bytes()
$$;

-- Function: awa._rewrite_live(rel regclass, aside regclass) returns integer
-- The rewrite awa.compact_ready and awa.compact_scheduled share: under
-- rel's ACCESS EXCLUSIVE lock, waited for as long as the caller's
-- lock_timeout allows, copies rel's rows to aside, truncates rel, copies
-- them back and empties aside, in the caller's transaction; the
-- statistics then count the rows kept as soon as it ends. 0, changing
-- nothing, when the lock is not had, or when a call that held it first
-- rewrote rel (its file changed since this one began). aside has rel's
-- columns in the same order (the tests compare them).
-- Calls: nothing
-- Writes: (dynamic)
create or replace function awa._rewrite_live(rel regclass, aside regclass)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    file oid := pg_relation_filenode(rel);
begin
    begin
        execute format('lock table %s in access exclusive mode', rel);
    exception when lock_not_available then
        return 0;
    end;
    if pg_relation_filenode(rel) is distinct from file then
        return 0;  -- a call that held the lock before this one rewrote it
    end if;
    execute format('insert into %s select * from %s', aside, rel);
    execute format('truncate %s', rel);
    execute format('insert into %s select * from %s', rel, aside);
    execute format('truncate %s', aside);
    perform pg_stat_force_next_flush();
    return 1;
end;
$$;

-- Function: awa._ready_compaction_due() returns boolean
-- Whether awa.compact_ready() rewrites awa.ready now, from the cumulative
-- statistics' counts of its rows (vacuum lowers the dead count to what it
-- could not remove): more than 200,000 dead rows, above what vacuum leaves
-- between its visits at a few thousand jobs a second, and more than its
-- live rows, so that a rewrite copies at most one row per job claimed
-- since the last; and at most 100,000 live rows, since enqueues and claims
-- wait for the copy, about a second per 100,000 rows on two cores. A
-- larger backlog keeps its dead rows until it drains below that or the
-- snapshot ends.
-- Calls: awa._rewrite_due
-- Writes: nothing
create or replace function awa._ready_compaction_due()
returns boolean
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select awa._rewrite_due('awa.ready'::regclass)
$$;

-- Function: awa._ready_backlog(max_rows integer) returns (payload bigint, backlog bigint)
-- The live rows of awa.ready, at most max_rows of them, and their payload
-- (awa._job_bytes), read lane by lane from each lane's claim hint, below
-- which every row is gone for good (ADR 030): not the dead rows claims
-- leave under a held snapshot, which a scan of the table reads, at every
-- call of awa.compact_ready for as long as the snapshot is held. Rows
-- cancelled above a lane's hint are still read (claims read them too).
-- Calls: awa._job_bytes
-- Writes: nothing
create or replace function awa._ready_backlog(
    max_rows integer, out payload bigint, out backlog bigint
)
language sql
stable
set search_path = pg_catalog, pg_temp
-- Each lane probed by key from its hint: a plan made when awa.ready was
-- small would scan its heap, dead rows and all, for every lane.
set enable_seqscan = off
set enable_bitmapscan = off
as $$
    select coalesce(sum(awa._job_bytes(b.kind, b.args, b.last_error)), 0), count(*)
      from (
          select r.kind, r.args, r.last_error
            from awa.lanes as l
           cross join lateral (
               -- The lane's claim hint: its highest (ADR 030).
               select coalesce(max(hint.head_seq), 0) as head_seq
                 from awa.lane_hints as hint
                where hint.lane_id = l.lane_id
           ) as h
           cross join lateral (
               select y.kind, y.args, y.last_error
                 from awa.ready as y
                where y.lane_id = l.lane_id and y.lane_seq >= h.head_seq
                offset 0
           ) as r
           limit max_rows
      ) as b
$$;

-- Function: awa.compact_ready() returns integer
-- When awa._ready_compaction_due says so (many dead rows, a backlog of at
-- most 100,000) and the backlog, read from the lanes' claim hints, holds at
-- most 100,000 rows and awa._pass_bytes() of payload (awa._job_bytes),
-- rewrites awa.ready with its live rows only: under its
-- ACCESS EXCLUSIVE lock, waited for at most 100 ms, it copies them to
-- awa.ready_rewrite, truncates awa.ready, copies them back and empties
-- awa.ready_rewrite, in one transaction. Every row keeps its lane,
-- lane_seq and job id, so claim hints, awa.ready_late and unique keys stay
-- true. Enqueues and claims wait for the rewrite while it runs, about a
-- second per 100,000 live rows or per gigabyte of file on two cores (a
-- larger file is left to vacuum: awa._rewrite_heap_bytes); if a session
-- holds the table
-- (an enqueue or a claim in flight, a reader), the call changes nothing
-- and returns 0, to be made again. A second call while a first rewrites
-- returns 0 after at most 100 ms. Run it every few seconds
-- (awa maintain does); it rewrites only while a held snapshot keeps vacuum
-- from the dead rows. It reads the statistics afresh, whatever snapshot of
-- them the caller's transaction keeps (stats_fetch_consistency).
-- Role: awa_maintenance.
-- Returns: 1 if it rewrote the table, else 0.
-- Errors: 25000 the calling transaction is not read committed: a snapshot
-- older than the lock would not see the rows committed since, and the
-- TRUNCATE would remove them.
-- Calls: awa._check_read_committed, awa._note_run, awa._pass_bytes, awa._ready_backlog,
--   awa._ready_compaction_due, awa._rewrite_live
-- Writes: nothing
create or replace function awa.compact_ready()
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '100ms'
-- The statistics read afresh: a caller's transaction may have kept a
-- snapshot of them from when the backlog was small (changing the setting
-- drops it).
set stats_fetch_consistency = none
as $$
declare
    payload bigint;
    backlog bigint;
begin
    perform awa._check_read_committed('awa.compact_ready()');
    perform awa._note_run('ready_rewrite');
    -- Enqueues and claims wait for the copies: a backlog whose payload
    -- passes the bound would hold them up to the caller's statement
    -- timeout, then roll back, to be tried again at the next call. Both
    -- reads wait for the table's lock (the file's size, the backlog).
    begin
        if not awa._ready_compaction_due() then
            return 0;
        end if;
        select b.payload, b.backlog into payload, backlog from awa._ready_backlog(100001) as b;
    exception when lock_not_available then
        return 0;  -- a rewrite in flight holds the table: it does this call's work
    end;
    if backlog > 100000 or payload > awa._pass_bytes() then
        return 0;
    end if;
    return awa._rewrite_live('awa.ready', 'awa.ready_rewrite');
end;
$$;

-- Function: awa._scheduled_compaction_due() returns boolean
-- Whether awa.compact_scheduled() rewrites awa.scheduled now, from the
-- cumulative statistics' counts of its rows, as awa._ready_compaction_due
-- decides for awa.ready: more than 200,000 dead rows and more than its live
-- rows, so that a rewrite copies at most one row per job promoted or
-- cancelled since the last; and at most 100,000 live rows, since enqueues
-- for later, retries and promotions wait for the copy (about 2 s for
-- 100,000 on two cores).
-- Calls: awa._rewrite_due
-- Writes: nothing
create or replace function awa._scheduled_compaction_due()
returns boolean
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select awa._rewrite_due('awa.scheduled'::regclass)
$$;

-- Function: awa._scheduled_backlog(max_rows integer) returns (payload bigint, backlog bigint)
-- The live rows of awa.scheduled, at most max_rows of them, and their
-- payload (awa._job_bytes), read with one sequential scan of its heap that
-- stops at the max_rows-th live row. awa.scheduled has no claim hints to
-- read its live rows from, as awa._ready_backlog does: the scan reads the
-- dead rows too, each once, in the heap's order (no index walk, which
-- would visit each dead row's entries and heap block again). Its cost is
-- the heap's size, dead rows included: what awa.compact_scheduled's
-- copy-out reads under the lock next, without holding anyone up (ACCESS
-- SHARE). awa.compact_scheduled reads it only when
-- awa._scheduled_compaction_due says so: once per 200,000 or so rows
-- deleted while rewrites succeed. While one is refused (a backlog whose
-- payload passes the bound) each call reads it again: 30-46 ms for a
-- million dead rows (113 MB) here, where one call of awa.promote_due, made
-- every second, spends 640-680 ms walking the same dead rows
-- (docs/benchmarks.md).
-- Calls: awa._job_bytes
-- Writes: nothing
create or replace function awa._scheduled_backlog(
    max_rows integer, out payload bigint, out backlog bigint
)
language sql
stable
set search_path = pg_catalog, pg_temp
-- The heap in its order: an index scan would read each dead row's block
-- through its entries, once per index entry.
set enable_indexscan = off
set enable_indexonlyscan = off
set enable_bitmapscan = off
as $$
    select coalesce(sum(awa._job_bytes(b.kind, b.args, b.last_error)), 0), count(*)
      from (
          select s.kind, s.args, s.last_error
            from awa.scheduled as s
           limit max_rows
      ) as b
$$;

-- Function: awa.compact_scheduled() returns integer
-- When awa._scheduled_compaction_due says so (many dead rows, at most
-- 100,000 live ones) and the live rows, read by awa._scheduled_backlog
-- (one scan of the heap, made only then: see there for its cost), are at
-- most 100,000 and awa._pass_bytes() of payload (awa._job_bytes), rewrites
-- awa.scheduled with its live rows only: under its ACCESS EXCLUSIVE lock,
-- waited for at most 100 ms, it copies them to awa.scheduled_rewrite,
-- truncates awa.scheduled, copies them back and empties
-- awa.scheduled_rewrite, in one transaction. Every row keeps its job id,
-- queue, run_at, attempt, args and last error, so nothing that names a job
-- by id (its unique key, a cancel) changes. Enqueues for later, retries
-- (awa.fail, awa.rescue_expired) and awa.promote_due wait for the rewrite
-- while it runs, about 2 s for 100,000 live rows on two cores (its three
-- indexes are filled again), 0.28 s for 10,000 among a million dead (a
-- file over awa._rewrite_heap_bytes() is left to vacuum); if a
-- session holds the table (an enqueue, a retry or a promotion in flight, a
-- reader), the call changes nothing and returns 0, to be made again. A
-- second call while a first rewrites returns 0 after at most 100 ms. Run
-- it every few seconds (awa maintain does); it rewrites
-- only while a held snapshot keeps vacuum from the dead rows. It reads the
-- statistics afresh, whatever snapshot of them the caller's transaction
-- keeps (stats_fetch_consistency). awa.scheduled references
-- awa.queue_meta and nothing references it: the TRUNCATE needs no other
-- table.
-- Role: awa_maintenance.
-- Returns: 1 if it rewrote the table, else 0.
-- Errors: 25000 the calling transaction is not read committed: a snapshot
-- older than the lock would not see the rows committed since, and the
-- TRUNCATE would remove them.
-- Calls: awa._check_read_committed, awa._note_run, awa._pass_bytes, awa._rewrite_live,
--   awa._scheduled_backlog, awa._scheduled_compaction_due
-- Writes: nothing
create or replace function awa.compact_scheduled()
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '100ms'
-- The statistics read afresh: a caller's transaction may have kept a
-- snapshot of them from when the backlog was small (changing the setting
-- drops it).
set stats_fetch_consistency = none
as $$
declare
    payload bigint;
    backlog bigint;
begin
    perform awa._check_read_committed('awa.compact_scheduled()');
    perform awa._note_run('scheduled_rewrite');
    -- Enqueues and promotions wait for the copies: a backlog whose payload
    -- passes the bound would hold them up to the caller's statement
    -- timeout, then roll back, to be tried again at the next call. Both
    -- reads wait for the table's lock (the file's size, the backlog).
    begin
        if not awa._scheduled_compaction_due() then
            return 0;
        end if;
        select b.payload, b.backlog into payload, backlog
          from awa._scheduled_backlog(100001) as b;
    exception when lock_not_available then
        return 0;  -- a rewrite in flight holds the table: it does this call's work
    end;
    if backlog > 100000 or payload > awa._pass_bytes() then
        return 0;
    end if;
    return awa._rewrite_live('awa.scheduled', 'awa.scheduled_rewrite');
end;
$$;

select awa._grant_execute('awa._rewrite_heap_bytes()');
select awa._grant_execute('awa._rewrite_due(regclass)');
select awa._grant_execute('awa._rewrite_live(regclass, regclass)');
select awa._grant_execute('awa._lane_hints_bytes_allowed()');
select awa._grant_execute('awa.compact_lane_hints()', 'maintenance');
select awa._grant_execute('awa._ready_compaction_due()');
select awa._grant_execute('awa._ready_backlog(integer)');
select awa._grant_execute('awa.compact_ready()', 'maintenance');
select awa._grant_execute('awa._scheduled_compaction_due()');
select awa._grant_execute('awa._scheduled_backlog(integer)');
select awa._grant_execute('awa.compact_scheduled()', 'maintenance');
