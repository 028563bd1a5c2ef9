-- hints.sql: how awa.lane_hints stays small.
--
-- A claim moves a lane's hint by inserting the new one and deleting the
-- one it read (awa._advance_lane_hints, ADR 030), so every move leaves a
-- dead row. Vacuum removes them while no snapshot holds the horizon back;
-- while one is held, none can go, and the table grows by one row per move
-- for as long as it is held. awa.compact_lane_hints() bounds it: once the
-- table's heap is larger than its lanes need, it keeps each lane's highest
-- hint, the one row claims read, and drops the rest with TRUNCATE, which
-- removes dead rows whatever snapshot is held (ADR 035).

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
-- to be made again. A second concurrent call waits for the first, then
-- finds the table small. Run it every few seconds (awa maintain does); it
-- rewrites only while a held snapshot keeps vacuum from the dead hints.
-- A claim reads only a lane's highest hint, and the rewrite keeps it, so
-- no claim starts lower than it would have.
-- Role: awa_maintenance.
-- Returns: 1 if it rewrote the table, else 0.
-- Errors: 25000 the calling transaction is not read committed: a snapshot
-- older than the lock would miss the hints committed since, and lose them.
-- Calls: awa._check_read_committed, awa._lane_hints_bytes_allowed
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
    if pg_relation_size('awa.lane_hints') <= awa._lane_hints_bytes_allowed() then
        return 0;
    end if;
    begin
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

select awa._grant_execute('awa._lane_hints_bytes_allowed()');
select awa._grant_execute('awa.compact_lane_hints()', 'maintenance');
