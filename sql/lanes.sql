-- lanes.sql: choosing a lane and taking its lock, for every enqueue path.
--
-- awa._take_lane is the one definition of lane choice; awa.enqueue calls it
-- for one row, awa._lock_lane_groups for the groups of a multi-row call
-- (awa.enqueue_batch, COPY, awa.promote_due). The fast paths of awa.enqueue
-- and awa.enqueue_batch repeat its commonest case, the sticky lane taken
-- with no memo, and awa.enqueue its next, the first free lane in turn
-- (awa._in_turn) with a memo written (tests/test_path_differential.py and
-- test_lane_choice.py compare).
--
-- No two lane-locking calls can deadlock each other: a call waits for a
-- lane lock only when that lane's id is above every lane lock it holds, and
-- takes any other lane with a try-lock, which never waits. A chain of
-- waiters would need lane ids that rise all the way round, which they
-- cannot. Calls made one after another in one transaction are the caller's
-- order, as with row locks (docs/concepts.md).
--
-- The memo: a transaction that already holds a lane for (queue, priority)
-- keeps writing to it. The shard of that lane is kept in the
-- transaction-local setting awa.lane_<queue id>_<priority>
-- (awa._lane_memo_name). Any role can set
-- a custom setting, so the memo is only a hint: it is believed for a shard
-- below S of the same (queue, priority) whose lock this transaction holds
-- or takes now with a try-lock. A forged memo can at most send the caller's
-- own job to a free lane of its own queue and priority, as an unkeyed job
-- may go anyway (docs/security.md). An empty memo means the sticky lane:
-- the fast paths take that lane without writing the memo, and leave every
-- call to this function once the transaction has a memo, which
-- they learn from one setting of a constant name, awa.lane_memo
-- (awa._has_lane_memo; cheaper to read than a name built from the queue
-- and priority). Forging that setting only chooses between the two ways,
-- which choose alike.

-- Function: awa._has_lane_memo() returns boolean
-- Whether this transaction has a lane memo: awa.lane_memo, which
-- awa._take_lane and awa.enqueue set with every memo they write. The fast
-- paths read it to
-- know whether to leave the lane to awa._take_lane.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._has_lane_memo()
returns boolean
language sql
stable parallel safe
as $$
    select coalesce(pg_catalog.current_setting('awa.lane_memo', true), '')
           operator(pg_catalog.<>) ''
$$;

-- Function: awa._sticky_ok(queue, kind, priority, max_attempts, run_at) returns boolean
-- Whether awa.enqueue's sticky branch may serve an unkeyed job without a
-- unique key whose queue it found plain (docs/fast-paths.md): a valid job
-- (awa._job_ok), due now, in a transaction without a lane memo (with one,
-- the lane is awa._take_lane's to choose). The lane is then the sticky
-- one, as awa._take_lane would choose, if its try-lock takes it. Inlined.
-- Calls: awa._has_lane_memo, awa._job_ok
-- Writes: nothing
create or replace function awa._sticky_ok(
    queue text, kind text, priority smallint, max_attempts integer, run_at timestamptz
)
returns boolean
language sql
stable parallel safe
as $$
    select awa._job_ok(queue, kind, priority, max_attempts)
       and (run_at is null or run_at operator(pg_catalog.<=) pg_catalog.now())
       and not awa._has_lane_memo()
$$;

-- Function: awa._one_range_ok(n, queues, kinds, priorities, max_attempts, ordering_keys,
--                             run_ats, max_run_times, unique_keys, unique_windows,
--                             priority, attempts) returns boolean
-- Whether awa.enqueue_batch's one-range branch may serve a call of n rows
-- (docs/fast-paths.md): at least one row, every row for the first row's
-- queue at the first row's priority and max_attempts (given as priority
-- and attempts, a null element meaning the default), each with a kind,
-- the first valid (awa._job_ok; so all are), none keyed, for later, or
-- with a max run time or unique key of its own. Tested with array
-- operators, not row by row. The queue must then be plain, and its sticky
-- lane free with no lane memo, as awa._take_lane would take it. Inlined.
-- Calls: awa._default_max_attempts, awa._default_priority, awa._job_ok
-- Writes: nothing
create or replace function awa._one_range_ok(
    n integer, queues text[], kinds text[], priorities smallint[], max_attempts integer[],
    ordering_keys bytea[], run_ats timestamptz[], max_run_times interval[],
    unique_keys bytea[], unique_windows interval[], priority smallint, attempts integer
)
returns boolean
language sql
immutable parallel safe
as $$
    select n operator(pg_catalog.>) 0
       and queues operator(pg_catalog.<@) array[queues[1]]
       and pg_catalog.array_position(kinds, null) is null
       and awa._job_ok(queues[1], kinds[1], priority, attempts)
       and (priorities is null
            or pg_catalog.array_replace(priorities, null, awa._default_priority())
               operator(pg_catalog.<@) array[priority])
       and (max_attempts is null
            or pg_catalog.array_replace(max_attempts, null, awa._default_max_attempts())
               operator(pg_catalog.<@) array[attempts])
       and (ordering_keys is null
            or pg_catalog.cardinality(pg_catalog.array_remove(ordering_keys, null))
               operator(pg_catalog.=) 0)
       and (run_ats is null
            or pg_catalog.cardinality(pg_catalog.array_remove(run_ats, null))
               operator(pg_catalog.=) 0)
       and (max_run_times is null
            or pg_catalog.cardinality(pg_catalog.array_remove(max_run_times, null))
               operator(pg_catalog.=) 0)
       and (unique_keys is null
            or pg_catalog.cardinality(pg_catalog.array_remove(unique_keys, null))
               operator(pg_catalog.=) 0)
       and (unique_windows is null
            or pg_catalog.cardinality(pg_catalog.array_remove(unique_windows, null))
               operator(pg_catalog.=) 0)
$$;

-- Function: awa._lane_memo_name(queue_id integer, priority smallint) returns text
-- The name of the transaction-local setting that holds the lane memo of
-- (queue, priority): the shard of the lane this transaction writes to.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lane_memo_name(queue_id integer, priority smallint)
returns text
language sql
immutable parallel safe
as $$
    select 'awa.lane_' operator(pg_catalog.||) queue_id::pg_catalog.text
           operator(pg_catalog.||) '_' operator(pg_catalog.||) priority::pg_catalog.text
$$;

-- Function: awa._lane_seq_name(lane_id integer) returns text
-- The name, in schema awa, of a lane's sequence (awa._provision_lanes
-- creates it; awa.queue_meta.lane_seqs and awa.lanes.seq record it;
-- awa._lane_last_seq finds it by it). Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lane_seq_name(lane_id integer)
returns text
language sql
immutable parallel safe
as $$
    select 'lane_seq_' operator(pg_catalog.||) lane_id::pg_catalog.text
$$;

-- Function: awa._lane_wait_total(started timestamptz, finished timestamptz) returns text
-- This transaction's total wait for lane locks, in microseconds, once a
-- wait from `started` to `finished` is added to it: the value for the
-- transaction-local setting awa.lane_lock_wait_us (read by the client for
-- its metric only). A value the caller set that is not a count is taken as
-- 0: it can only mislead the caller's own metric.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lane_wait_total(started timestamptz, finished timestamptz)
returns text
language sql
stable parallel safe
as $$
    select ((case when pg_catalog.current_setting('awa.lane_lock_wait_us', true)
                       operator(pg_catalog.~) '^[0-9]{1,15}$'
                  then pg_catalog.current_setting('awa.lane_lock_wait_us', true)::pg_catalog.int8
                  else 0 end)
            operator(pg_catalog.+)
            (pg_catalog.date_part('epoch', finished operator(pg_catalog.-) started)
             operator(pg_catalog.*) 1000000)::pg_catalog.int8)::pg_catalog.text
$$;

-- Function: awa._wait_for_lane(lane_id integer)
-- Takes a lane lock that a try has just failed to get, and adds the time
-- spent waiting to awa.lane_lock_wait_us (awa._lane_wait_total). The
-- uncontended path never comes here, so it reads no clock and sets nothing.
-- Calls: awa._lane_wait_total, awa._lock_class_lane
-- Writes: nothing
create or replace function awa._wait_for_lane(lane_id integer)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    started timestamptz := pg_catalog.clock_timestamp();
begin
    perform pg_catalog.pg_advisory_xact_lock(awa._lock_class_lane(), lane_id);
    perform pg_catalog.set_config(
        'awa.lane_lock_wait_us', awa._lane_wait_total(started, pg_catalog.clock_timestamp()), true
    );
end;
$$;

-- Function: awa._take_lane(lane_ids, queue_id, priority, shards, key_shard, above) returns integer
-- Chooses the lane for the rows of one (queue, priority[, key shard]) group,
-- takes its lock to commit, and returns the lane's shard.
--   lane_ids:  the queue's awa.queue_meta.lane_ids ([priority][shard]), read
--              in the statement that read S;
--   shards:    the queue's S, read in the same statement;
--   key_shard: the keyed rows' shard, or null for unkeyed rows;
--   above:     the highest lane id this call already holds a lock on (0 if
--              none): the call may wait only for a lane above it.
-- Keyed: the lane of key_shard, waited for if need be (the caller orders
-- its groups so that this lane is above `above`, or held already).
-- Unkeyed: the lane of the memo if believed (see the header); else the
-- first free lane tried without waiting, starting at this backend's sticky
-- shard (awa._sticky(S)); else wait for the first lane in that order above
-- `above` (the caller guarantees one: its groups come in lane order).
-- Errors: AW003 a lane missing (a bug: S promises its lanes exist).
-- Calls: awa._in_turn, awa._lane_memo_name, awa._lock_class_lane, awa._sticky, awa._wait_for_lane
-- Writes: nothing
create or replace function awa._take_lane(
    lane_ids integer[],
    queue_id integer,
    priority smallint,
    shards integer,
    key_shard integer,
    above integer
)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    memo text := awa._lane_memo_name(queue_id, priority);
    held text;
    shard integer;
    target integer;
begin
    -- Each statement here has its expression set up again in every
    -- transaction: the common paths (a believed memo; a free sticky lane; a
    -- free keyed lane) are a handful of statements, the rest is out of line.
    if key_shard is null then
        held := current_setting(memo, true);
        if held ~ '^[0-9]{1,2}$' and held::integer < shards
           and pg_try_advisory_xact_lock(
               awa._lock_class_lane(), lane_ids[priority][held::integer]
           ) then
            return held::integer;
        end if;
        shard := awa._sticky(shards);
        if not coalesce(
            pg_try_advisory_xact_lock(awa._lock_class_lane(), lane_ids[priority][shard]), false
        ) then
            -- The sticky lane is taken: the next free one in turn, else wait
            -- for the first one in turn above `above`.
            for i in 0 .. shards - 1 loop
                shard := awa._in_turn(shards, i);
                exit when pg_try_advisory_xact_lock(
                    awa._lock_class_lane(), lane_ids[priority][shard]
                );
                if target is null and lane_ids[priority][shard] > above then
                    target := shard;
                end if;
                shard := null;
            end loop;
            if shard is null then
                if target is null then
                    raise exception 'lane missing for queue id % priority % (S = %)',
                        queue_id, priority, shards
                        using errcode = 'AW003',
                              hint = 'Lanes are provisioned by awa.set_enqueue_shards; '
                                     'this is a bug.';
                end if;
                shard := target;
                perform awa._wait_for_lane(lane_ids[priority][shard]);
            end if;
        end if;
        -- The chosen shard in key_shard, as the keyed way leaves it: one
        -- statement fewer on that way.
        key_shard := shard;
    elsif not coalesce(
        pg_try_advisory_xact_lock(awa._lock_class_lane(), lane_ids[priority][key_shard]), false
    ) then
        if lane_ids[priority][key_shard] is null then
            raise exception 'lane missing for queue id % priority % shard % (S = %)',
                queue_id, priority, key_shard, shards
                using errcode = 'AW003',
                      hint = 'Lanes are provisioned by awa.set_enqueue_shards; this is a bug.';
        end if;
        perform awa._wait_for_lane(lane_ids[priority][key_shard]);
    end if;
    held := set_config(memo, key_shard::text, true);
    held := set_config('awa.lane_memo', 'on', true);
    return key_shard;
end;
$$;

-- Function: awa._lock_lane_groups(qids, ps, kss, ns) returns the lane groups
-- Takes the lanes for the groups of a multi-row call and reserves one
-- sequence range per lane. A group is (queue id, priority, key shard or -1
-- for unkeyed) with ns rows. Groups are served in lane order: a keyed group
-- at its lane, an unkeyed one at the highest lane it may use (below S), so
-- each awa._take_lane may wait only above every lane the call holds.
-- Returns one element per group: its queue id, priority, key shard (-1 for
-- unkeyed), lane, the lane's shard, and the first lane_seq of the lane's
-- range, which covers every row of the call in that lane. With ns null it
-- takes the lanes only and reserves no range (g_base empty): COPY's mover
-- takes a load's lanes so before its first pass (awa._move_staged_in_batches).
-- Calls: awa._take_lane
-- Writes: nothing
create or replace function awa._lock_lane_groups(
    qids integer[],
    ps smallint[],
    kss smallint[],
    ns bigint[],
    out g_qid integer[],
    out g_p smallint[],
    out g_ks smallint[],
    out g_lane integer[],
    out g_shard smallint[],
    out g_base bigint[]
)
language plpgsql
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call; generic plans are
-- right for these queries whatever the batch size.
set plan_cache_mode = force_generic_plan
as $$
declare
    grp record;
    shard integer;
    lane integer;
    lane_seq regclass;
    base bigint;
    max_held integer := 0;
    g_n bigint[] := '{}';
    g_seq regclass[] := '{}';
    lane_bases bigint[] := '{}';
begin
    g_qid := '{}';
    g_p := '{}';
    g_ks := '{}';
    g_lane := '{}';
    g_shard := '{}';
    g_base := '{}';
    for grp in
        select u.qid, u.p, u.ks, u.n, m.enqueue_shards as shards, m.lane_ids, m.lane_seqs,
               case when u.ks >= 0
                    then m.lane_ids[u.p][u.ks]
                    else (select max(x.lane)
                            from unnest(m.lane_ids[u.p:u.p][0:m.enqueue_shards - 1]) as x (lane))
               end as turn
          from unnest(qids, ps, kss, ns) as u (qid, p, ks, n)
          join awa.queue_meta as m on m.queue_id = u.qid
         -- a keyed group before an unkeyed one that may use its lane
         order by turn, u.ks < 0, u.qid, u.p, u.ks
    loop
        shard := awa._take_lane(
            grp.lane_ids, grp.qid, grp.p, grp.shards, nullif(grp.ks, -1), max_held
        );
        lane := grp.lane_ids[grp.p][shard];
        max_held := greatest(max_held, lane);
        g_seq := g_seq || grp.lane_seqs[grp.p][shard];
        g_qid := g_qid || grp.qid;
        g_p := g_p || grp.p;
        g_ks := g_ks || grp.ks;
        g_lane := g_lane || lane;
        g_shard := g_shard || shard::smallint;
        g_n := g_n || grp.n;
    end loop;
    if ns is null then
        return;
    end if;
    -- One group (the common batch) needs no grouping by lane.
    if cardinality(g_lane) = 1 then
        lane_seq := g_seq[1];
        base := nextval(lane_seq);
        if g_n[1] > 1 then
            perform setval(lane_seq, base + g_n[1] - 1);
        end if;
        g_base := array[base];
        return;
    end if;
    -- One range per lane (a keyed and an unkeyed group may share one), so
    -- the caller numbers rows per lane in input order.
    for grp in
        select g.lane, sum(g.n)::bigint as n, min(g.seq::oid)::regclass as seq
          from unnest(g_lane, g_n, g_seq) as g (lane, n, seq)
         group by g.lane
    loop
        lane_seq := grp.seq;
        base := nextval(lane_seq);
        if grp.n > 1 then
            perform setval(lane_seq, base + grp.n - 1);
        end if;
        lane_bases := lane_bases || array[grp.lane::bigint, base];
    end loop;
    g_base := array(
        select b.base
          from unnest(g_lane) with ordinality as g (lane, i)
          join (
              select lane_bases[2 * k - 1] as lane, lane_bases[2 * k] as base
                from generate_series(1, cardinality(lane_bases) / 2) as k
          ) as b on b.lane = g.lane
         order by g.i
    );
end;
$$;

select awa._grant_execute('awa._lane_seq_name(integer)');
select awa._grant_execute('awa._wait_for_lane(integer)');
select awa._grant_execute('awa._lane_wait_total(timestamptz, timestamptz)');
select awa._grant_execute(
    'awa._take_lane(integer[], integer, smallint, integer, integer, integer)'
);
select awa._grant_execute('awa._lock_lane_groups(integer[], smallint[], smallint[], bigint[])');
select awa._grant_execute('awa._has_lane_memo()');
select awa._grant_execute(
    'awa._sticky_ok(text, text, smallint, integer, timestamptz)'
);
select awa._grant_execute(
    'awa._one_range_ok(integer, text[], text[], smallint[], integer[], bytea[], timestamptz[],'
    ' interval[], bytea[], interval[], smallint, integer)'
);
select awa._grant_execute('awa._lane_memo_name(integer, smallint)');
