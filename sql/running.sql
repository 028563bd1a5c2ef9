-- running.sql: the slots of awa.running, and how they are emptied.
--
-- awa.running is partitioned by slot (ADR 034, migration 0024). A claim
-- writes each job to the slot of its run lease's block: the leases of one
-- block of 65,536 to slot 0, of the next to slot 1, and so on in turn
-- (awa._running_slot). awa.rotate_running() empties the slot that the
-- current block does not write, once that block is half used: it carries
-- the rows still there (jobs running longer than that) into slot 2,
-- running_carried, and truncates the slot, in one transaction under the
-- slot's ACCESS EXCLUSIVE lock. The rows of the runs that ended go with the
-- TRUNCATE whatever snapshot is held open, so slots 0 and 1 never hold
-- more than about a block and a half of them; vacuum still removes them
-- sooner when no snapshot holds it back.
--
-- A run is only ever in the slot of its lease or in slot 2. awa.complete
-- looks in the one, then the other; awa.fail, awa.heartbeat, the rescue
-- and the job tools look a job up by job_id and run lease in all three. So
-- a job carried while its worker runs it is found where it went. A claim
-- or an end of a run in flight holds its slot until its commit, so the
-- TRUNCATE never removes a row it has not carried.

-- Function: awa._running_block_leases() returns integer
-- How many run leases a block of awa.running's slots holds. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._running_block_leases()
returns integer
language sql
immutable parallel safe
as $$
    select 65536
$$;

-- Function: awa._running_slot(run_lease bigint) returns smallint
-- The slot of awa.running a claim writes the run with this lease to: its
-- block's, 0 and 1 in turn. Every INSERT into awa.running uses it. Inlined.
-- Calls: awa._running_block_leases
-- Writes: nothing
create or replace function awa._running_slot(run_lease bigint)
returns smallint
language sql
immutable parallel safe
as $$
    select ((run_lease operator(pg_catalog./) awa._running_block_leases())
            operator(pg_catalog.%) 2)::smallint
$$;

-- Function: awa.rotate_running() returns integer
-- Empties the slot of awa.running that the current block of run leases
-- does not write, when that block is half used and the slot holds rows
-- (see the file header): its live rows move to slot 2, then TRUNCATE. The
-- slot's lock is waited for at most 100 ms (a claim, an end of a run or a
-- reader of awa.running holds it until its commit): if it is not had, the
-- call changes nothing and returns 0, to be made again. While it waits,
-- the calls that reach that slot (completes of its jobs; awa.fail and
-- awa.heartbeat, which read all three) queue behind it. One call at a
-- time: a second concurrent one returns 0 at once. Run it every few
-- seconds (awa maintain does); a slot is due once per block of 65,536
-- claims. A slot whose jobs still running carry more than awa._pass_bytes()
-- of payload (awa._job_bytes) is left until some of them end: the carry
-- copies their args under the lock, and every complete, fail and heartbeat
-- would wait for it (seconds per hundred MB) until the call's statement
-- timeout, at every call.
-- Role: awa_maintenance.
-- Returns: how many slots it emptied, 0 or 1.
-- Errors: 25000 the calling transaction is not read committed: a snapshot
-- older than the slot's lock might miss rows that the TRUNCATE removes.
-- Calls: awa._check_read_committed, awa._job_bytes, awa._note_run, awa._pass_bytes,
--   awa._running_block_leases, awa._running_slot, awa._try_leader
-- Writes: awa.running, (dynamic)
create or replace function awa.rotate_running()
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '100ms'
as $$
declare
    block bigint := awa._running_block_leases();
    last_lease bigint;
    idle smallint;
    part regclass;
begin
    perform awa._check_read_committed('awa.rotate_running()');
    -- Recorded only once the leader lock is had: a session that keeps it
    -- (idle in a transaction) stops every rotation, which must then show as
    -- a task that does not run.
    if not awa._try_leader('running') then
        return 0;
    end if;
    perform awa._note_run('running_slots');
    select s.last_value into strict last_lease from awa.run_lease_seq as s;
    if last_lease % block < block / 2 then
        return 0;
    end if;
    idle := 1 - awa._running_slot(last_lease);
    -- The one choice of the slot's table; the statements below name it.
    part := case idle when 0 then 'awa.running_0'::regclass else 'awa.running_1'::regclass end;
    if pg_relation_size(part) = 0 then
        return 0;
    end if;
    -- Read before the lock: no claim writes this slot any more, so what its
    -- rows carry can only shrink (but for a claim of the last block still
    -- in flight).
    if (select coalesce(sum(awa._job_bytes(r.kind, r.args, r.worker)), 0)
          from awa.running as r where r.slot = idle) > awa._pass_bytes() then
        return 0;
    end if;
    begin
        execute format('lock table %s in access exclusive mode', part);
    exception when lock_not_available then
        return 0;
    end;
    -- Each statement below reads with a snapshot taken after the lock, so
    -- it sees every row committed to the slot; no other can come in.
    update awa.running as r set slot = 2 where r.slot = idle;
    execute format('truncate %s', part);
    return 1;
end;
$$;

select awa._grant_execute('awa._running_block_leases()');
select awa._grant_execute('awa._running_slot(bigint)');
select awa._grant_execute('awa.rotate_running()', 'maintenance');
