-- enqueue.sql: single-row and batch enqueue, and promotion of due jobs.
--
-- Every path chooses lanes the same way (awa._take_lane, sql/lanes.sql),
-- reads awa.queue_meta at each statement (a change of S applies at the
-- change's commit), and holds each lane's lock from before its sequence
-- advances until commit, so lane_seq order is commit order within a lane.

-- Function: awa._check_job(kind text, priority smallint, max_attempts integer) returns void
create or replace function awa._check_job(
    kind text, priority smallint, max_attempts integer
)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if kind is null then
        raise exception 'kind must not be null'
            using errcode = '22004';
    end if;
    perform awa._check_priority(priority);
    if max_attempts is null or max_attempts not between 1 and 1000 then
        raise exception 'max_attempts must be between 1 and 1000, got %',
            coalesce(max_attempts::text, 'null')
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._enqueue_slow(queue, kind, args, priority, ordering_key, run_at, max_attempts)
-- awa.enqueue for a queue seen for the first time, a keyed row when S > 1,
-- or a job scheduled in the future. Runs inside awa.enqueue's definer frame.
create or replace function awa._enqueue_slow(
    queue text,
    kind text,
    args jsonb,
    priority smallint,
    ordering_key bytea,
    run_at timestamptz,
    max_attempts integer
)
returns awa.enqueued
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    meta awa.queue_meta;
    shard integer;
    lane integer;
    new_job bigint;
    new_seq bigint;
begin
    perform awa._check_queue_name(queue);  -- also for an existing stripe's 'q#1'
    meta := awa._route_queue(awa._ensure_queue(queue), ordering_key);
    if run_at is not null and run_at > now() then
        new_job := nextval('awa.job_id_seq');
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at
        ) values (
            new_job, meta.queue_id, _enqueue_slow.priority, _enqueue_slow.kind,
            coalesce(_enqueue_slow.args, '{}'), _enqueue_slow.ordering_key, 0,
            _enqueue_slow.max_attempts, now(), _enqueue_slow.run_at
        );
        return row(new_job, meta.queue, _enqueue_slow.priority, null, null)::awa.enqueued;
    end if;
    shard := awa._take_lane(
        meta.lane_ids, meta.queue_id, priority, meta.enqueue_shards,
        awa._key_shard(ordering_key, meta.enqueue_shards), 0
    );
    lane := meta.lane_ids[priority][shard];
    new_seq := nextval(meta.lane_seqs[priority][shard]);
    new_job := nextval('awa.job_id_seq');
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at
    ) values (
        lane, new_seq, new_job, meta.queue_id, _enqueue_slow.priority,
        _enqueue_slow.kind, coalesce(_enqueue_slow.args, '{}'), _enqueue_slow.ordering_key, 0,
        _enqueue_slow.max_attempts, now(), clock_timestamp()
    );
    return row(new_job, meta.queue, _enqueue_slow.priority, shard, new_seq)::awa.enqueued;
end;
$$;

-- Function: awa.enqueue(queue, kind, args, priority, ordering_key, run_at, max_attempts)
-- Enqueues one job. Role: awa_producer.
-- Returns: awa.enqueued (job_id, queue, priority, enqueue_shard, lane_seq);
--   enqueue_shard and lane_seq are null when run_at is in the future.
-- Errors: 22004 null queue or kind; 22023 bad queue name, priority or max_attempts.
-- The common case (a known plain queue, a job due now, keyed or not) runs in
-- this frame with one index lookup (S and the lane ids come from the queue's
-- settings row); a new queue, a partitioned or striped name and a job for
-- later go through awa._enqueue_slow.
create or replace function awa.enqueue(
    queue text,
    kind text,
    args jsonb default '{}',
    priority smallint default 2,
    ordering_key bytea default null,
    run_at timestamptz default null,
    max_attempts integer default 25
)
returns awa.enqueued
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q_id integer;
    shards integer;
    lane_ids integer[];
    lane_seqs regclass[];
    shard integer;
    new_seq bigint;
    new_job bigint;
begin
    if kind is null or priority is null or priority not between 1 and 4
        or max_attempts is null or max_attempts not between 1 and 1000 then
        perform awa._check_job(kind, priority, max_attempts);
    end if;
    -- A stripe's own name ('q#1') is no target: the slow path refuses it.
    select m.queue_id, m.enqueue_shards, m.lane_ids, m.lane_seqs
      into q_id, shards, lane_ids, lane_seqs
      from awa.queue_meta as m
     where m.queue = enqueue.queue and m.stripes = 1 and m.partitions = 1
       and strpos(enqueue.queue, '#') = 0;
    if not found or (run_at is not null and run_at > now()) then
        return awa._enqueue_slow(queue, kind, args, priority, ordering_key, run_at, max_attempts);
    end if;
    shard := awa._take_lane(
        lane_ids, q_id, priority, shards, awa._key_shard(ordering_key, shards), 0
    );
    new_seq := nextval(lane_seqs[priority][shard]);
    new_job := nextval('awa.job_id_seq');
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at
    ) values (
        lane_ids[priority][shard], new_seq, new_job, q_id, enqueue.priority, enqueue.kind,
        coalesce(enqueue.args, '{}'), enqueue.ordering_key, 0, enqueue.max_attempts,
        now(), clock_timestamp()
    );
    return row(new_job, enqueue.queue, enqueue.priority, shard, new_seq)::awa.enqueued;
end;
$$;

-- Function: awa._lock_lanes(queue_ids, priorities, key_shards) returns the lane groups
-- Takes the lanes for the rows of a multi-row call and reserves one
-- sequence range per lane. A row is (queue_ids[i], priorities[i],
-- key_shards[i]); rows whose queue id is null (not due) are skipped;
-- key_shards[i] is the keyed shard, or null for an unkeyed row. Groups the
-- rows and hands the groups to awa._lock_lane_groups.
create or replace function awa._lock_lanes(
    queue_ids integer[],
    priorities smallint[],
    key_shards smallint[],
    out g_qid integer[],
    out g_p smallint[],
    out g_ks smallint[],
    out g_lane integer[],
    out g_shard smallint[],
    out g_base bigint[]
)
language sql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
    select l.*
      from (
          select array_agg(u.qid) as qids, array_agg(u.p) as ps, array_agg(u.ks) as kss,
                 array_agg(u.n) as ns
            from (
                select queue_ids[i] as qid, coalesce(priorities[i], 2)::smallint as p,
                       coalesce(key_shards[i], -1)::smallint as ks, count(*) as n
                  from generate_series(1, cardinality(queue_ids)) as i
                 where queue_ids[i] is not null
                 group by 1, 2, 3
            ) as u
      ) as g
     cross join lateral awa._lock_lane_groups(
         coalesce(g.qids, '{}'), coalesce(g.ps, '{}'), coalesce(g.kss, '{}'),
         coalesce(g.ns, '{}')
     ) as l
$$;

-- Function: awa._enqueue_rows(queues, kinds, args, priorities, ordering_keys, run_ats,
--                             max_attempts, row_label, row_offset)
-- The multi-row enqueue behind awa.enqueue_batch and COPY ingestion. A bad
-- row is named as "<row_label> <index + row_offset>". The arrays come
-- checked: queues and kinds not null, every array one element per job,
-- indexed from 1 (awa.enqueue_batch checks them; COPY builds them).
create or replace function awa._enqueue_rows(
    queues text[],
    kinds text[],
    args jsonb[],
    priorities smallint[],
    ordering_keys bytea[],
    run_ats timestamptz[],
    max_attempts integer[],
    row_label text,
    row_offset bigint
)
returns setof awa.enqueued
language plpgsql
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call; generic plans are
-- right for these queries whatever the batch size.
set plan_cache_mode = force_generic_plan
as $$
declare
    n integer := coalesce(cardinality(queues), 0);
    bad integer;
    q text;
    queue_ids integer[];
    key_shards smallint[];
    lanes record;
begin
    if n = 0 then
        return;
    end if;

    select min(i) into bad
      from generate_series(1, n) as i
     where queues[i] is null or kinds[i] is null
        or coalesce(priorities[i], 2) not between 1 and 4
        or octet_length(queues[i]) not between 1 and 200 or strpos(queues[i], '#') > 0
        or coalesce(max_attempts[i], 25) not between 1 and 1000;
    if bad is not null then
        begin
            perform awa._check_queue_name(queues[bad]);
            perform awa._check_job(
                kinds[bad], coalesce(priorities[bad], 2::smallint), coalesce(max_attempts[bad], 25)
            );
        exception when others then
            raise exception '% % (1-based): %', row_label, bad + row_offset, sqlerrm
                using errcode = sqlstate;
        end;
    end if;

    -- Create unknown queues in name order, so concurrent calls agree.
    for q in
        select distinct u.q from unnest(queues) as u (q)
         where not exists (select from awa.queue_meta as m where m.queue = u.q)
         order by 1
    loop
        perform awa._ensure_queue(q);
    end loop;

    -- Partitioned and striped queues: each row goes to its partition, then
    -- its stripe (by key, else this backend's sticky one); created when missing.
    if exists (
        select from awa.queue_meta as m
         where m.queue = any(queues) and (m.stripes > 1 or m.partitions > 1)
    ) then
        queues := array(
            select case when m.stripes > 1 or m.partitions > 1
                        then (awa._route_queue(m, ordering_keys[i])).queue
                        else queues[i] end
              from generate_series(1, n) as i
              join awa.queue_meta as m on m.queue = queues[i]
             order by i
        );
    end if;

    -- Per row: the queue id when due now (null: it waits in awa.scheduled),
    -- and the keyed shard under the queue's current S.
    select array_agg(
               case when run_ats[i] is null or run_ats[i] <= now() then m.queue_id end
               order by i
           ),
           array_agg(
               case when ordering_keys[i] is not null
                    then awa._key_shard(ordering_keys[i], m.enqueue_shards) end
               order by i
           )
      into queue_ids, key_shards
      from generate_series(1, n) as i
      join (
          select x.queue, x.queue_id, x.enqueue_shards
            from awa.queue_meta as x
           where x.queue = any(queues)
      ) as m on m.queue = queues[i];

    select * into lanes from awa._lock_lanes(queue_ids, priorities, key_shards);

    return query
    with rows as (
        select
            i, queue_ids[i] as qid, coalesce(priorities[i], 2)::smallint as p, g.lane,
            g.shard, g.base + row_number() over (partition by g.lane order by i) - 1 as seq,
            nextval('awa.job_id_seq') as job_id
          from generate_series(1, n) as i
          left join unnest(
              lanes.g_qid, lanes.g_p, lanes.g_ks, lanes.g_lane, lanes.g_shard, lanes.g_base
          ) as g (qid, p, ks, lane, shard, base)
            on g.qid = queue_ids[i]
           and g.p = coalesce(priorities[i], 2)
           and g.ks = coalesce(key_shards[i], -1)
    ),
    to_ready as (
        insert into awa.ready (
            lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
            max_attempts, enqueued_at, ready_at
        )
        select r.lane, r.seq, r.job_id, r.qid, r.p, kinds[r.i], coalesce(args[r.i], '{}'),
               ordering_keys[r.i], 0, coalesce(max_attempts[r.i], 25), now(), clock_timestamp()
          from rows as r
         where r.lane is not null
    ),
    to_scheduled as (
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at
        )
        select r.job_id, m.queue_id, r.p, kinds[r.i], coalesce(args[r.i], '{}'),
               ordering_keys[r.i], 0, coalesce(max_attempts[r.i], 25), now(), run_ats[r.i]
          from rows as r
          join awa.queue_meta as m on m.queue = queues[r.i]
         where r.lane is null
    )
    select r.job_id, queues[r.i], r.p, r.shard, r.seq
      from rows as r
     order by r.i;
end;
$$;

-- Function: awa.enqueue_batch(queues, kinds, args, priorities, ordering_keys, run_ats,
--                             max_attempts)
-- Enqueues many jobs in one call from typed parallel arrays, one element per
-- job. queues and kinds are required; the other arrays may be null (all
-- defaults) and a null element takes the default. Role: awa_producer.
-- Returns: one awa.enqueued row per input, in input order.
-- Errors: 22023 arrays of different lengths (naming them), an array with a
--   second dimension or not indexed from 1 (naming it), bad elements (naming
--   the 1-based index); 22004 null queue or kind elements.
create or replace function awa.enqueue_batch(
    queues text[],
    kinds text[],
    args jsonb[] default null,
    priorities smallint[] default null,
    ordering_keys bytea[] default null,
    run_ats timestamptz[] default null,
    max_attempts integer[] default null
)
returns setof awa.enqueued
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call.
set plan_cache_mode = force_generic_plan
as $$
declare
    n integer := coalesce(cardinality(queues), 0);
    p smallint := coalesce(priorities[1], 2);
    attempts integer := coalesce(max_attempts[1], 25);
    names text[] := array['queues', 'kinds', 'args', 'priorities', 'ordering_keys', 'run_ats',
                          'max_attempts'];
    dims text[] := array[
        array_dims(queues), array_dims(kinds), array_dims(args), array_dims(priorities),
        array_dims(ordering_keys), array_dims(run_ats), array_dims(max_attempts)
    ];
    lens integer[] := array[
        n, cardinality(kinds), cardinality(args), cardinality(priorities),
        cardinality(ordering_keys), cardinality(run_ats), cardinality(max_attempts)
    ];
    q_id integer;
    lanes record;
begin
    if queues is null or kinds is null then
        raise exception '% must not be null',
            case when queues is null then 'queues' else 'kinds' end
            using errcode = '22004';
    end if;
    -- Rows are read by position 1 .. n: a subscript from another base, a
    -- second dimension or a missing element would pair the wrong elements.
    for i in 1 .. 7 loop
        if left(dims[i], 3) <> '[1:' or strpos(dims[i], '][') > 0 then
            raise exception 'array % must be one-dimensional and indexed from 1, got %',
                names[i], dims[i]
                using errcode = '22023';
        end if;
        if lens[i] <> n then
            raise exception 'array % has % elements but queues has %', names[i], lens[i], n
                using errcode = '22023',
                      hint = 'Every array holds one element per job, in the same order.';
        end if;
    end loop;
    -- The common call, every row due now, unkeyed, valid, for one plain
    -- queue at one priority (a null element meaning the default), is one
    -- lane range and one INSERT: tested with array operators, not row by
    -- row. Any other call, and every error, takes awa._enqueue_rows.
    if n > 0 and queues <@ array[queues[1]]
       and octet_length(queues[1]) between 1 and 200 and strpos(queues[1], '#') = 0
       and array_position(kinds, null) is null
       and (priorities is null
            or (p between 1 and 4 and array_replace(priorities, null, 2::smallint) <@ array[p]))
       and (max_attempts is null
            or (attempts between 1 and 1000
                and array_replace(max_attempts, null, 25) <@ array[attempts]))
       and (ordering_keys is null or cardinality(array_remove(ordering_keys, null)) = 0)
       and (run_ats is null or cardinality(array_remove(run_ats, null)) = 0)
    then
        select m.queue_id into q_id
          from awa.queue_meta as m
         where m.queue = queues[1] and m.stripes = 1 and m.partitions = 1;
        if found then
            select * into lanes
              from awa._lock_lane_groups(array[q_id], array[p], array[-1::smallint], array[n::bigint]);
            return query
            with ins as (
                insert into awa.ready (
                    lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key,
                    attempt, max_attempts, enqueued_at, ready_at
                )
                select lanes.g_lane[1], lanes.g_base[1] + u.i - 1, nextval('awa.job_id_seq'),
                       q_id, p, u.k, coalesce(u.a, '{}'), null, 0, attempts, now(),
                       clock_timestamp()
                  from unnest(kinds, args) with ordinality as u (k, a, i)
                returning awa.ready.job_id, awa.ready.lane_seq
            )
            select ins.job_id, queues[1], p, lanes.g_shard[1], ins.lane_seq
              from ins
             order by ins.lane_seq;
            return;
        end if;
    end if;
    return query
    select * from awa._enqueue_rows(
        queues, kinds, args, priorities, ordering_keys, run_ats, max_attempts,
        'batch element', 0
    );
end;
$$;

-- Function: awa.promote_due(max_jobs integer default 10000) returns integer
-- Moves scheduled jobs whose run_at has passed into lanes, routed under the
-- queue's current S (a keyed job goes back to its key's shard). Role:
-- awa_maintenance. Returns how many jobs it moved. Concurrent callers skip
-- each other's rows.
create or replace function awa.promote_due(max_jobs integer default 10000)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call; generic plans are
-- right for these queries whatever the batch size.
set plan_cache_mode = force_generic_plan
-- Due rows are looked up by key; never scan awa.scheduled or awa.ready.
set enable_hashjoin = off
set enable_mergejoin = off
set enable_seqscan = off
as $$
declare
    job_ids bigint[];
    queue_ids integer[];
    prios smallint[];
    key_shards smallint[];
    lanes record;
begin
    if max_jobs is null or max_jobs < 0 then
        raise exception 'max_jobs must be 0 or more, got %', coalesce(max_jobs::text, 'null')
            using errcode = '22023';
    end if;
    select array_agg(d.job_id order by d.run_at, d.job_id),
           array_agg(d.queue_id order by d.run_at, d.job_id),
           array_agg(d.priority order by d.run_at, d.job_id),
           array_agg(
               case when d.ordering_key is not null
                    then awa._key_shard(d.ordering_key, m.enqueue_shards) end
               order by d.run_at, d.job_id
           )
      into job_ids, queue_ids, prios, key_shards
      from (
          select s.job_id, s.queue_id, s.priority, s.ordering_key, s.run_at
            from awa.scheduled as s
           where s.run_at <= now()
           order by s.run_at, s.job_id
           limit max_jobs
             for update skip locked
      ) as d
      join awa.queue_meta as m on m.queue_id = d.queue_id;
    if job_ids is null then
        return 0;
    end if;
    select * into lanes from awa._lock_lanes(queue_ids, prios, key_shards);
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at, last_error
    )
    select g.lane, g.base + row_number() over (partition by g.lane order by i) - 1,
           s.job_id, s.queue_id, s.priority, s.kind, s.args, s.ordering_key, s.attempt,
           s.max_attempts, s.enqueued_at, clock_timestamp(), s.last_error
      from generate_series(1, cardinality(job_ids)) as i
      join awa.scheduled as s on s.job_id = job_ids[i]
      join unnest(
          lanes.g_qid, lanes.g_p, lanes.g_ks, lanes.g_lane, lanes.g_shard, lanes.g_base
      ) as g (qid, p, ks, lane, shard, base)
        on g.qid = queue_ids[i] and g.p = prios[i] and g.ks = coalesce(key_shards[i], -1);
    delete from awa.scheduled as s where s.job_id = any(job_ids);
    return cardinality(job_ids);
end;
$$;

select awa._grant_execute('awa._check_job(text, smallint, integer)');
select awa._grant_execute(
    'awa._enqueue_slow(text, text, jsonb, smallint, bytea, timestamptz, integer)'
);
select awa._grant_execute(
    'awa.enqueue(text, text, jsonb, smallint, bytea, timestamptz, integer)', 'producer'
);
select awa._grant_execute('awa._lock_lanes(integer[], smallint[], smallint[])');
select awa._grant_execute(
    'awa._enqueue_rows(text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[],'
    ' text, bigint)'
);
select awa._grant_execute(
    'awa.enqueue_batch(text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[])',
    'producer'
);
select awa._grant_execute('awa.promote_due(integer)', 'maintenance');
