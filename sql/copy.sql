-- copy.sql: COPY ingestion.
--
-- A producer, in one transaction:
--   COPY awa.copy_staging (queue, priority, ordering_key, kind, args, run_at,
--                          max_attempts, max_run_time, unique_key, unique_window)
--   FROM STDIN;
--   SELECT awa.enqueue_copied();   -- optional: commit does it too
-- The rows of that transaction, and only those, are enqueued in COPY order
-- with the lanes awa._lock_lane_groups takes (sql/lanes.sql). The general
-- mover is the batch path, 10,000 rows at a time (awa._move_staged_in_batches:
-- partitioned or striped queues, rows with a unique key, and naming a bad
-- row); set-based fast
-- paths of it move the rest: one-queue loads by awa._move_staged_one_lane
-- or _by_key, others by awa._move_staged_sets. tests/test_path_differential.py
-- compares them with the batch path. A staged row never outlives its
-- transaction (ADR 010): what enqueue_copied() did not move, a deferred
-- trigger moves at commit; a rollback discards it.

-- Function: awa._move_staged_in_batches(xid xid8) returns bigint
-- Moves the staged rows of one transaction into the lanes, in COPY order,
-- 10,000 rows per pass through awa._enqueue_rows (the batch path). Rows
-- another mover holds are skipped. The path for partitioned and striped
-- queues, for rows with unique keys (the first row of a key in the
-- transaction takes it, later ones are duplicates) and for naming a bad
-- row; awa._move_staged_sets takes the rest. A load of more than one pass
-- takes its keys and lanes as one call would, before its first pass: keys
-- before lanes (ADR 027), and lanes in lane order (sql/lanes.sql), so it
-- never waits for a lane below one it holds and deadlocks with no other
-- call. Taken a pass at a time, a later pass could wait for a lane below
-- an earlier pass's while another load waited for that one. The prologue
-- names the first bad row, if any, as its pass would (awa._row_ok,
-- awa._check_row); locks the rows (it waits for another mover that holds
-- one, which the passes would skip) and routes them once
-- (awa._route_rows), under the S it reads then; when any row is keyed,
-- draws every row's job id and takes the keys (awa._take_unique_keys);
-- takes the lanes of the rows due now and not duplicates (awa._lock_lanes
-- without reserving ranges); then marks the keyed queues
-- (awa._mark_unique_jobs). Each pass then gives awa._enqueue_rows its
-- rows' routing, each row's shard the one taken for it (an unkeyed row's
-- too, so a pass chooses no lane again and finds every lane held, whatever
-- S has become) and the job ids (null for a duplicate).
-- The prologue holds every row's routing, ordering and unique keys at
-- once (about 40 bytes a row beyond the keys).
-- Calls: awa._check_row, awa._due_queue_ids, awa._enqueue_rows, awa._lock_lanes,
--   awa._mark_unique_jobs, awa._null_at, awa._route_rows, awa._row_ok, awa._take_unique_keys
-- Writes: awa.copy_staging
create or replace function awa._move_staged_in_batches(xid xid8)
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
    max_run_times interval[];
    unique_keys bytea[];
    unique_windows interval[];
    staged record;
    bad record;
    -- A load of several passes, as its prologue read it, in COPY order:
    -- each row's staged id, routing, and the job id its unique key was
    -- taken for (null: unkeyed, or a duplicate).
    load record;
    l_ids bigint[];
    l_queues text[];
    l_queue_ids integer[];
    l_key_shards smallint[];
    l_jobs bigint[];
    dup_i integer[];
    routing record;
    n integer;
begin
    -- More than one pass (a pass is 10,000 rows)?
    select count(*) > 10000 as passes into staged
      from (
          select from awa.copy_staging as s
           where s.staged_xid = _move_staged_in_batches.xid
           limit 10001
      ) as s;
    if staged.passes then
        -- A bad row fails the load: named now, as its pass would name it,
        -- before any key or lane is taken.
        select s.*,
               (select count(*) from awa.copy_staging as c
                 where c.staged_xid = _move_staged_in_batches.xid
                   and c.staged_id <= s.staged_id) as n
          into bad
          from awa.copy_staging as s
         where s.staged_xid = _move_staged_in_batches.xid
           and not awa._row_ok(
               s.queue, s.kind, s.priority, s.max_attempts, s.max_run_time, s.ordering_key,
               s.unique_key, s.unique_window, s.run_at
           )
         order by s.staged_id
         limit 1;
        if found then
            perform awa._check_row(
                bad.queue, bad.kind, bad.priority, bad.max_attempts, bad.max_run_time,
                bad.ordering_key, bad.unique_key, bad.unique_window, bad.run_at, 'COPY row',
                bad.n
            );
        end if;
        select array_agg(s.staged_id order by s.staged_id) as ids,
               array_agg(s.queue order by s.staged_id) as queues,
               array_agg(s.priority order by s.staged_id) as priorities,
               array_agg(s.ordering_key order by s.staged_id) as ordering_keys,
               array_agg(s.run_at order by s.staged_id) as run_ats,
               array_agg(s.unique_key order by s.staged_id) as unique_keys,
               array_agg(s.unique_window order by s.staged_id) as unique_windows
          into load
          from (
              select c.staged_id, c.queue, c.priority, c.ordering_key, c.run_at, c.unique_key,
                     c.unique_window
                from awa.copy_staging as c
               where c.staged_xid = _move_staged_in_batches.xid
               order by c.staged_id
                 for update
          ) as s;
        l_ids := coalesce(load.ids, '{}');
        select r.routed, r.queue_ids, r.key_shards into l_queues, l_queue_ids, l_key_shards
          from awa._route_rows(load.queues, load.ordering_keys) as r;
        if cardinality(array_remove(load.unique_keys, null)) > 0 then
            -- An id for every row, as awa._enqueue_rows draws them for a
            -- keyed call: each row then enters its lane with an id it
            -- already had, recorded in awa.ready_late with its pass's stamp.
            -- Ids for the keyed rows only left the unkeyed rows after a
            -- keyed one with ids below its stamp, and the job tools'
            -- bisection of the lane (ADR 029) missed them.
            l_jobs := array(
                select nextval('awa.job_id_seq') from generate_series(1, cardinality(l_ids))
            );
            dup_i := array(
                select u.i
                  from awa._take_unique_keys(
                      load.unique_keys, l_jobs, l_queue_ids, load.priorities,
                      load.unique_windows
                  ) as u
            );
            l_jobs := awa._null_at(l_jobs, dup_i);
        end if;
        -- Each row due now and not a duplicate is pinned to the lane taken
        -- for it here, as if keyed: a pass finds it held and chooses no
        -- lane again, whatever S has become.
        select t.shards into l_key_shards
          from awa._lock_lanes(
              awa._due_queue_ids(awa._null_at(l_queue_ids, coalesce(dup_i, '{}')),
                                 load.run_ats),
              load.priorities, l_key_shards, false
          ) as t;
        if l_jobs is not null then
            -- Every keyed queue of the load marked at once, in lock order,
            -- once the lanes are held: marked pass by pass, a later pass's
            -- lower-ranked queue was locked after a higher one, against a
            -- change of the family's settings (40P01).
            perform awa._mark_unique_jobs(
                awa._null_at(l_queue_ids, coalesce(dup_i, '{}')), load.unique_keys
            );
        end if;
        load := null;
    end if;
    loop
        select array_agg(s.staged_id order by s.staged_id),
               array_agg(s.queue order by s.staged_id),
               array_agg(s.priority order by s.staged_id),
               array_agg(s.ordering_key order by s.staged_id),
               array_agg(s.kind order by s.staged_id),
               array_agg(s.args order by s.staged_id),
               array_agg(s.run_at order by s.staged_id),
               array_agg(s.max_attempts order by s.staged_id),
               array_agg(s.max_run_time order by s.staged_id),
               array_agg(s.unique_key order by s.staged_id),
               array_agg(s.unique_window order by s.staged_id)
          into ids, queues, priorities, ordering_keys, kinds, args, run_ats, max_attempts,
               max_run_times, unique_keys, unique_windows
          from (
              select c.* from awa.copy_staging as c
               where c.staged_xid = _move_staged_in_batches.xid
                 -- past the rows this call already moved (and deleted), so
                 -- each pass starts where the last ended
                 and c.staged_id > last_id
               order by c.staged_id
               limit 10000
                 for update skip locked
          ) as s;
        exit when ids is null;
        n := cardinality(ids);
        if l_ids is null then
            perform count(*) from awa._enqueue_rows(
                queues, kinds, args, priorities, ordering_keys, run_ats, max_attempts,
                max_run_times, unique_keys, unique_windows, 'COPY row', moved
            );
        else
            -- The prologue's next rows (it locked them all: none skipped),
            -- read by subscript: a slice would copy the whole array.
            select array_agg(l_ids[i] order by i) as ids,
                   array_agg(l_queues[i] order by i) as queues,
                   array_agg(l_queue_ids[i] order by i) as queue_ids,
                   array_agg(l_key_shards[i] order by i) as key_shards,
                   array_agg(l_jobs[i] order by i) as jobs
              into routing
              from generate_series(moved + 1, moved + n) as i;
            if routing.ids is distinct from ids then
                raise exception 'COPY rows % to % are not the ones routed for them (a bug)',
                    moved + 1, moved + n
                    using errcode = 'XX000';
            end if;
            perform count(*) from awa._enqueue_rows(
                queues, kinds, args, priorities, ordering_keys, run_ats, max_attempts,
                max_run_times, unique_keys, unique_windows, 'COPY row', moved,
                case when l_jobs is not null then routing.jobs end, routing.queues,
                routing.queue_ids, routing.key_shards
            );
        end if;
        delete from awa.copy_staging as c
         where c.staged_xid = _move_staged_in_batches.xid and c.staged_id = any(ids);
        moved := moved + n;
        last_id := ids[n];
    end loop;
    return moved;
end;
$$;

-- Function: awa._move_staged_one_lane(xid, queue_id, priority, n) returns bigint
-- Moves the n staged rows of one transaction, all unkeyed and due now, for
-- one plain queue at one priority, into one lane range with one INSERT in
-- COPY order. Returns how many rows it moved. A fast path
-- (docs/fast-paths.md) of awa._move_staged_in_batches.
-- Calls: awa._default_args, awa._default_max_attempts, awa._first_attempt, awa._in_seconds,
--   awa._lock_lane_groups
-- Writes: awa.copy_staging, awa.ready
create or replace function awa._move_staged_one_lane(
    xid xid8, queue_id integer, priority smallint, n bigint
)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
-- Read in COPY order through (staged_xid, staged_id): no sort before the
-- numbering.
set enable_seqscan = off
set enable_bitmapscan = off
as $$
declare
    lanes record;
    moved bigint;
begin
    select * into lanes
      from awa._lock_lane_groups(array[queue_id], array[priority], array[-1::smallint],
                                 array[n]);
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at, last_error, max_run_time
    )
    select lanes.g_lane[1], lanes.g_base[1] + row_number() over (order by s.staged_id) - 1,
           nextval('awa.job_id_seq'), _move_staged_one_lane.queue_id,
           _move_staged_one_lane.priority, s.kind, coalesce(s.args, awa._default_args()),
           null, awa._first_attempt(),
           coalesce(s.max_attempts, awa._default_max_attempts()), now(), clock_timestamp(),
           null, awa._in_seconds(s.max_run_time)
      from awa.copy_staging as s
     where s.staged_xid = _move_staged_one_lane.xid
     order by s.staged_id;
    get diagnostics moved = row_count;
    delete from awa.copy_staging as s where s.staged_xid = _move_staged_one_lane.xid;
    return moved;
end;
$$;

-- Function: awa._move_staged_by_key(xid, queue_id, shards, priority, n) returns bigint
-- Moves the n staged rows of one transaction, due now, for one plain queue
-- at one priority, some keyed: one pass counts the rows of each distinct
-- key and hashes it once, awa._lock_lane_groups takes one range per lane,
-- one INSERT numbers each lane's rows in COPY order. Returns how many rows
-- it moved. A fast path (docs/fast-paths.md) of awa._move_staged_in_batches.
-- Calls: awa._default_args, awa._default_max_attempts, awa._first_attempt, awa._in_seconds,
--   awa._key_shard, awa._lock_lane_groups
-- Writes: awa.copy_staging, awa.ready
create or replace function awa._move_staged_by_key(
    xid xid8, queue_id integer, shards integer, priority smallint, n bigint
)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
-- Whole sets: hash the distinct keys and joins, never a nested loop over a
-- misestimated unnest() (staging has no useful statistics).
set enable_nestloop = off
set enable_sort = off
set work_mem = '64MB'
as $$
declare
    k_key bytea[];
    k_shard smallint[];
    kss smallint[];
    ns bigint[];
    lanes record;
    moved bigint;
begin
    select array_agg(k.ordering_key), array_agg(k.shard) into k_key, k_shard
      from (
          select s.ordering_key,
                 awa._key_shard(s.ordering_key, _move_staged_by_key.shards) as shard
            from awa.copy_staging as s
           where s.staged_xid = _move_staged_by_key.xid and s.ordering_key is not null
           group by s.ordering_key
      ) as k;
    select array_agg(g.ks), array_agg(g.n) into kss, ns
      from (
          select coalesce(k.shard, -1)::smallint as ks, count(*) as n
            from awa.copy_staging as s
            left join unnest(k_key, k_shard) as k (key, shard) on k.key = s.ordering_key
           where s.staged_xid = _move_staged_by_key.xid
           group by 1
      ) as g;
    select * into lanes
      from awa._lock_lane_groups(array_fill(queue_id, array[cardinality(kss)]),
                                 array_fill(priority, array[cardinality(kss)]), kss, ns);
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at, last_error, max_run_time
    )
    select g.lane, g.base + row_number() over (partition by g.lane order by s.staged_id) - 1,
           nextval('awa.job_id_seq'), _move_staged_by_key.queue_id,
           _move_staged_by_key.priority, s.kind, coalesce(s.args, awa._default_args()),
           s.ordering_key, awa._first_attempt(),
           coalesce(s.max_attempts, awa._default_max_attempts()), now(), clock_timestamp(),
           null, awa._in_seconds(s.max_run_time)
      from awa.copy_staging as s
      left join unnest(k_key, k_shard) as k (key, shard) on k.key = s.ordering_key
      join unnest(lanes.g_ks, lanes.g_lane, lanes.g_base) as g (ks, lane, base)
        on g.ks = coalesce(k.shard, -1)
     where s.staged_xid = _move_staged_by_key.xid;
    get diagnostics moved = row_count;
    delete from awa.copy_staging as s where s.staged_xid = _move_staged_by_key.xid;
    return moved;
end;
$$;

-- Function: awa._move_staged_sets(xid xid8) returns bigint
-- Moves the staged rows of one transaction into the lanes, in COPY order,
-- set-based: one pass groups the rows by (queue, priority, key shard),
-- hashing each distinct key once; awa._lock_lane_groups locks the lanes and
-- reserves one range per lane; one INSERT ... SELECT numbers the rows of
-- each lane in COPY order. Rows for partitioned or striped queues, rows
-- with a unique key, and a transaction with a bad row (to name it), go
-- through awa._move_staged_in_batches instead. A fast path
-- (docs/fast-paths.md) of awa._move_staged_in_batches.
-- Calls: awa._default_args, awa._default_max_attempts, awa._default_priority, awa._ensure_queues,
--   awa._first_attempt, awa._in_seconds, awa._key_shard, awa._lock_lane_groups,
--   awa._move_staged_in_batches, awa._row_ok
-- Writes: awa.copy_staging, awa.ready, awa.scheduled
create or replace function awa._move_staged_sets(xid xid8)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
-- Every join here is between whole sets; a nested loop over a misestimated
-- unnest() would be quadratic. The per-lane numbering sorts every row.
set enable_nestloop = off
set work_mem = '64MB'
as $$
declare
    batch_path boolean;
    unknown text[];
    staged_queues text[];
    q_name text[];
    q_id integer[];
    q_shards smallint[];
    k_qid integer[];
    k_key bytea[];
    k_shard smallint[];
    g record;
    lanes record;
    moved bigint;
begin
    -- One pass over the staged rows: any bad row, any partitioned or
    -- striped queue (both take the batch path), the load's queues, and those
    -- to create.
    select coalesce(bool_or(
               not awa._row_ok(
                   s.queue, s.kind, s.priority, s.max_attempts, s.max_run_time,
                   s.ordering_key, s.unique_key, s.unique_window, s.run_at
               )
               or s.unique_key is not null or s.unique_window is not null
               or m.stripes > 1 or m.partitions > 1
           ), false),
           array_agg(distinct s.queue order by s.queue),
           array_agg(distinct s.queue order by s.queue) filter (where m.queue is null)
      into batch_path, staged_queues, unknown
      from awa.copy_staging as s
      left join awa.queue_meta as m on m.queue = s.queue
     where s.staged_xid = _move_staged_sets.xid;
    if batch_path then
        return awa._move_staged_in_batches(xid);
    end if;
    -- Each queue's id and S, read once: the statements below join these, not
    -- awa.queue_meta by name, which a drop committed meanwhile renames (ADR
    -- 044): its rows would find no queue (ADR 049). Unknown queues are
    -- created in name order, so concurrent movers agree, until every name
    -- is found.
    loop
        if unknown is not null then
            perform awa._ensure_queues(unknown);
        end if;
        select array_agg(d.queue order by d.queue), array_agg(m.queue_id order by d.queue),
               array_agg(m.enqueue_shards order by d.queue),
               array_agg(d.queue order by d.queue) filter (where m.queue_id is null)
          into q_name, q_id, q_shards, unknown
          from unnest(staged_queues) as d (queue)
          left join awa.queue_meta as m on m.queue = d.queue;
        exit when unknown is null;
    end loop;

    -- Each distinct (queue, key) of the due keyed rows, hashed once.
    select array_agg(k.queue_id), array_agg(k.ordering_key),
           array_agg(awa._key_shard(k.ordering_key, k.enqueue_shards)::smallint)
      into k_qid, k_key, k_shard
      from (
          select distinct m.queue_id, m.enqueue_shards, s.ordering_key
            from awa.copy_staging as s
            join unnest(q_name, q_id, q_shards) as m (queue, queue_id, enqueue_shards)
              on m.queue = s.queue
           where s.staged_xid = _move_staged_sets.xid and s.ordering_key is not null
             and (s.run_at is null or s.run_at <= now())
      ) as k;

    select coalesce(array_agg(x.qid), '{}') as qids, coalesce(array_agg(x.p), '{}') as ps,
           coalesce(array_agg(x.ks), '{}') as kss, coalesce(array_agg(x.n), '{}') as ns
      into g
      from (
          select m.queue_id as qid, coalesce(s.priority, awa._default_priority()) as p,
                 coalesce(k.shard, -1)::smallint as ks, count(*) as n
            from awa.copy_staging as s
            join unnest(q_name, q_id) as m (queue, queue_id) on m.queue = s.queue
            left join unnest(k_qid, k_key, k_shard) as k (qid, key, shard)
              on k.qid = m.queue_id and k.key = s.ordering_key
           where s.staged_xid = _move_staged_sets.xid
             and (s.run_at is null or s.run_at <= now())
           group by 1, 2, 3
      ) as x;
    select * into lanes from awa._lock_lane_groups(g.qids, g.ps, g.kss, g.ns);

    with rows as (
        select s.staged_id, m.queue_id as qid,
               coalesce(s.priority, awa._default_priority()) as p,
               s.kind, s.args, s.ordering_key, s.max_attempts, s.run_at,
               awa._in_seconds(s.max_run_time) as run_time, l.lane,
               l.base + row_number() over (partition by l.lane order by s.staged_id) - 1
               as seq
          from awa.copy_staging as s
          join unnest(q_name, q_id) as m (queue, queue_id) on m.queue = s.queue
          left join unnest(k_qid, k_key, k_shard) as k (qid, key, shard)
            on k.qid = m.queue_id and k.key = s.ordering_key
          left join unnest(lanes.g_qid, lanes.g_p, lanes.g_ks, lanes.g_lane, lanes.g_base)
                    as l (qid, p, ks, lane, base)
            on (s.run_at is null or s.run_at <= now())
           and l.qid = m.queue_id and l.p = coalesce(s.priority, awa._default_priority())
           and l.ks = coalesce(k.shard, -1)
         where s.staged_xid = _move_staged_sets.xid
    ),
    to_ready as (
        insert into awa.ready (
            lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
            max_attempts, enqueued_at, ready_at, last_error, max_run_time
        )
        select r.lane, r.seq, nextval('awa.job_id_seq'), r.qid, r.p, r.kind,
               coalesce(r.args, awa._default_args()), r.ordering_key, awa._first_attempt(),
               coalesce(r.max_attempts, awa._default_max_attempts()), now(),
               clock_timestamp(), null, r.run_time
          from rows as r
         where r.lane is not null
        returning 1
    ),
    to_scheduled as (
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at, last_error, max_run_time
        )
        select nextval('awa.job_id_seq'), r.qid, r.p, r.kind,
               coalesce(r.args, awa._default_args()), r.ordering_key, awa._first_attempt(),
               coalesce(r.max_attempts, awa._default_max_attempts()), now(), r.run_at, null,
               r.run_time
          from rows as r
         where r.lane is null
        returning 1
    )
    select (select count(*) from to_ready) + (select count(*) from to_scheduled) into moved;
    delete from awa.copy_staging as s where s.staged_xid = _move_staged_sets.xid;
    return moved;
end;
$$;

-- Function: awa._move_staged(xid xid8) returns bigint
-- Moves the staged rows of one transaction into the lanes, in COPY order,
-- and returns how many. One pass reads their shape: all valid and due now,
-- without unique keys, for one plain queue at one priority, they take
-- awa._move_staged_one_lane (unkeyed) or awa._move_staged_by_key; any
-- other load takes awa._move_staged_sets.
-- Calls: awa._default_priority, awa._move_staged_by_key, awa._move_staged_one_lane,
--   awa._move_staged_sets, awa._row_ok
-- Writes: nothing
create or replace function awa._move_staged(xid xid8)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
-- The one pass reads (staged_xid, staged_id), not the whole table.
set enable_seqscan = off
set enable_bitmapscan = off
as $$
declare
    shape record;
    target awa.queue_meta;
begin
    select count(*) as n, min(s.queue) as q, max(s.queue) as q_last,
           min(coalesce(s.priority, awa._default_priority())) as p,
           max(coalesce(s.priority, awa._default_priority())) as p_last,
           count(s.ordering_key) as keyed,
           -- rows for later or with a unique key: not for the one-queue movers
           count(*) filter (where s.run_at > now() or s.unique_key is not null
                                  or s.unique_window is not null) as general,
           coalesce(bool_or(not awa._row_ok(
               s.queue, s.kind, s.priority, s.max_attempts, s.max_run_time, s.ordering_key,
               s.unique_key, s.unique_window, s.run_at
           )), false) as bad
      into shape
      from awa.copy_staging as s
     where s.staged_xid = _move_staged.xid;
    if shape.n = 0 then
        return 0;
    end if;
    if not shape.bad and shape.q = shape.q_last and shape.p = shape.p_last
       and shape.general = 0 then
        select m.* into target
          from awa.queue_meta as m
         where m.queue = shape.q and m.stripes = 1 and m.partitions = 1;
        if found and shape.keyed = 0 then
            return awa._move_staged_one_lane(xid, target.queue_id, shape.p, shape.n);
        elsif found then
            return awa._move_staged_by_key(
                xid, target.queue_id, target.enqueue_shards, shape.p, shape.n
            );
        end if;
    end if;
    return awa._move_staged_sets(xid);
end;
$$;

-- Function: awa.enqueue_copied() returns bigint
-- Enqueues the rows this transaction COPYed into awa.copy_staging and
-- returns how many. Role: awa_producer.
-- Errors: as awa.enqueue_batch, naming the bad row as "COPY row N (1-based)";
--   the whole transaction's COPY then fails and nothing is enqueued.
-- Calls: awa._move_staged
-- Writes: nothing
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
-- transaction first, each one's rows in COPY order. Since migration 0010
-- commit moves them, so this finds rows only from transactions that
-- committed before it or with the staging triggers disabled (a restore with
-- --disable-triggers). Safe to run from several sessions (a transaction's
-- rows are moved by one of them, under the try-lock (awa._lock_class_copy(),
-- low 31 bits of its xid)) and to interrupt: a row is moved and deleted in
-- one transaction. A call moves one staging transaction, the oldest it can
-- lock among the first max_transactions: moved after another in the same
-- transaction, a second would take its keys and lanes while holding the
-- first's lanes, and could wait for a lane below them held by a producer
-- that waits for one of them (40P01, the producer's call failed as often
-- as this one). awa maintain calls it again at once while it moves rows.
-- The rows of transactions still running (an open COPY load, any size) are
-- never read: the index is probed only between the running xids of the
-- call's snapshot, one probe a staging transaction.
-- A leftover transaction whose move fails (a bad row: nothing checked it at
-- its commit) is named in a WARNING and passed over; its rows stay. A
-- deadlock or a lock timeout still fails the call: the rows are good.
-- On a standby it moves nothing: the staged rows are the primary's alone.
-- Role: awa_maintenance. Returns how many rows it moved.
-- Calls: awa._check_limit, awa._lock_class_copy, awa._move_staged, awa._note_run
-- Writes: nothing
create or replace function awa.move_staged(max_transactions integer default 100)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    running pg_catalog.pg_snapshot;
    gap_start xid8 := '0';
    gap_end xid8;
    xid xid8;
    tried integer := 0;
    moved bigint;
begin
    perform awa._check_limit('max_transactions', max_transactions);
    -- awa.copy_staging is unlogged: a standby has none of its rows, and may
    -- not read it (0A000).
    if pg_is_in_recovery() then
        return 0;
    end if;
    perform awa._note_run('move_staged');
    running := pg_current_snapshot();
    -- Each gap between two running transactions (and below the first, and
    -- up to the snapshot's xmax) holds only ended ones; a staging xid is a
    -- top-level xid, so a running load's rows lie on a bound, never inside.
    for gap_end in
        select x.x from pg_snapshot_xip(running) as x(x)
        union all
        select pg_snapshot_xmax(running)
        order by 1
    loop
        loop
            select min(c.staged_xid) into xid
              from awa.copy_staging as c
             where c.staged_xid > gap_start and c.staged_xid < gap_end;
            exit when xid is null;
            tried := tried + 1;
            if tried > max_transactions then
                return 0;
            end if;
            -- Another session moving this transaction's rows keeps them: two
            -- movers reading them at once would both enqueue them. This
            -- transaction's own rows (status in progress) are not leftovers.
            if pg_xact_status(xid) = 'committed'
               and pg_try_advisory_xact_lock(
                   awa._lock_class_copy(), (xid::text::bigint & 2147483647)::integer
               ) then
                -- Nothing checked a leftover's rows at its commit: one that
                -- fails (a bad row) is named and passed over, not left to
                -- fail every call and hold back every later one.
                begin
                    moved := awa._move_staged(xid);
                exception
                    -- Passing (a deadlock with a producer, a lock timeout the
                    -- caller set): its rows are good, for the next call.
                    when transaction_rollback or lock_not_available then
                        raise;
                    when others then
                        raise warning
                            'awa.move_staged: staging transaction % left staged: %',
                            xid, sqlerrm
                            using hint = pg_catalog.format(
                                'Its rows are those of awa.copy_staging with staged_xid = %s:'
                                ' as the owner role, correct or delete them.', xid);
                        moved := 0;
                end;
                -- None: another session moved them after the probe; the next
                -- one, which took no lane either.
                if moved > 0 then
                    return moved;
                end if;
            end if;
            gap_start := xid;
        end loop;
        gap_start := gap_end;
    end loop;
    return 0;
end;
$$;

-- Function: awa._note_copy() returns trigger
-- After each COPY (or INSERT) statement into awa.copy_staging: records the
-- transaction in awa.copy_pending, once, so that its commit trigger fires.
-- Calls: nothing
-- Writes: awa.copy_pending
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
-- Calls: awa._move_staged
-- Writes: awa.copy_pending
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

-- Made only when missing or different (awa._ensure_trigger): a layer
-- applied again takes no lock on the tables of COPY loads. Both fire in
-- every session_replication_role: a load committed in replica mode would
-- otherwise stay in awa.copy_staging, unlogged, until awa.move_staged, and
-- a crash before that emptied it (tests/test_crash_recovery.py).
select awa._ensure_trigger(
    'awa.copy_staging', 'copy_staging_note',
    'CREATE TRIGGER copy_staging_note AFTER INSERT ON awa.copy_staging'
    ' FOR EACH STATEMENT EXECUTE FUNCTION awa._note_copy()',
    always => true
);
select awa._ensure_trigger(
    'awa.copy_pending', 'copy_pending_move',
    'CREATE CONSTRAINT TRIGGER copy_pending_move AFTER INSERT ON awa.copy_pending'
    ' DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION awa._move_at_commit()',
    always => true
);

select awa._grant_execute('awa._move_staged_one_lane(xid8, integer, smallint, bigint)');
select awa._grant_execute(
    'awa._move_staged_by_key(xid8, integer, integer, smallint, bigint)'
);
select awa._grant_execute('awa._move_staged_sets(xid8)');
select awa._grant_execute('awa._move_staged(xid8)');
select awa._grant_execute('awa._move_staged_in_batches(xid8)');
select awa._grant_execute('awa._note_copy()');
select awa._grant_execute('awa._move_at_commit()');
select awa._grant_execute('awa.enqueue_copied()', 'producer');
select awa._grant_execute('awa.move_staged(integer)', 'maintenance');
select awa._grant_insert(
    'awa.copy_staging',
    array['queue', 'priority', 'ordering_key', 'kind', 'args', 'run_at', 'max_attempts',
          'max_run_time', 'unique_key', 'unique_window'],
    'producer'
);
